"""The environment a run was measured in, so unlike runs are never compared by accident.

Read over HTTP from the server (model, engine and version, the server arguments that matter for
speculation: each engine's own probe) and from the host (GPU model, count and driver).
"""

from __future__ import annotations

from typing import Any

from specsweep import engines
from specsweep.hosts.base import Host
from specsweep.server.api import ServerAPI
from specsweep.server.gpus import describe_gpus


async def server_fingerprint(api: ServerAPI, engine: str = engines.CUSTOM) -> dict[str, Any]:
    """Model, engine version and the server arguments that matter for speculation, from its API."""
    fp: dict[str, Any] = {}
    model = await api.first_model()
    if model:
        fp["model"] = model
    for key, value in (await engines.probe(api, engine)).items():
        fp.setdefault(key, value)
    return fp


def host_fingerprint(host: Host) -> dict[str, Any]:
    return {"host": host.label, **describe_gpus(host)}
