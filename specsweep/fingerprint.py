"""The environment a run was measured in, so unlike runs are never compared by accident.

Read over HTTP from the server (model, engine version, server arguments) and, when a host
is given, from the host (GPU model, count and driver from nvidia-smi).
"""

from __future__ import annotations

from typing import Any

from specsweep.hosts.base import Host
from specsweep.server_api import ServerAPI

FINGERPRINT_FIELDS = ("gpu", "gpu_count", "driver", "engine_version", "model")


async def server_fingerprint(api: ServerAPI) -> dict[str, Any]:
    """Model, engine version and the server arguments that matter for speculation, from its API."""
    fp: dict[str, Any] = {}
    model = await api.first_model()
    if model:
        fp["model"] = model
    info = await api.get_json("/server_info") or await api.get_json("/get_server_info")
    if info:
        if info.get("version"):
            fp["engine_version"] = f"sglang {info['version']}"
        server_args = info.get("server_args")
        args: dict[str, Any] = server_args if isinstance(server_args, dict) else info
        for key in ("model_path", "tp_size", "speculative_algorithm", "speculative_num_steps",
                    "speculative_eagle_topk", "speculative_num_draft_tokens"):
            if key in args:
                fp[f"server_{key}"] = args[key]
    props = await api.get_json("/props")
    if props and "build_info" in props:
        fp["engine_version"] = f"llama.cpp {props['build_info']}"
        if props.get("model_path"):
            fp.setdefault("model", props["model_path"])
    version = await api.get_json("/version")
    if version and "version" in version and "engine_version" not in fp:
        fp["engine_version"] = f"vllm {version['version']}"
    return fp


def host_fingerprint(host: Host) -> dict[str, Any]:
    fp: dict[str, Any] = {"host": host.label}
    if host.which("nvidia-smi"):
        r = host.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], timeout=60)
        rows = [line.split(",") for line in r.stdout.splitlines() if "," in line]
        if rows:
            fp["gpu"] = rows[0][0].strip()
            fp["gpu_count"] = len(rows)
            fp["driver"] = rows[0][1].strip()
    else:
        fp["gpu"] = "none (CPU)"
        fp["gpu_count"] = 0
        cpu = host.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], timeout=30).stdout.strip()
        if cpu:
            fp["cpu"] = cpu
    return fp
