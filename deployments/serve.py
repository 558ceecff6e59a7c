"""Serve every specsweep deployment from this one process (no work pool or worker needed).

    PREFECT_API_URL=http://127.0.0.1:4200/api .venv/bin/python deployments/serve.py

The deployments are read from deployments/prefect.yaml (one definition for both ways of
running them): the same names, entrypoints, tags, parameters and (inactive) schedules; only those the
worker's policy names in ``deployments`` (default all). The way to run on shared infrastructure
(docs/operations.md, "Security").
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from prefect import aserve  # noqa: E402
from prefect.deployments.runner import RunnerDeployment  # noqa: E402
from prefect.flows import Flow, load_flow_from_entrypoint  # noqa: E402
from prefect.schedules import Cron  # noqa: E402

from specsweep import policy  # noqa: E402

PREFECT_YAML = ROOT / "deployments" / "prefect.yaml"


async def deployments(spec_file: Path = PREFECT_YAML) -> list[RunnerDeployment]:
    """Every deployment of prefect.yaml that the worker's policy serves (its ``deployments`` rule), as a
    deployment this process serves. A run can choose only its parameters: no pull steps, no job variables."""
    spec: dict[str, Any] = yaml.safe_load(spec_file.read_text())
    rules = policy.load()
    out = []
    for d in spec["deployments"]:
        flow: Flow[..., Any] = load_flow_from_entrypoint(str(ROOT / d["entrypoint"]))
        if not rules.serves(f"{flow.name}/{d['name']}"):
            continue
        schedules = [Cron(s["cron"], timezone=s.get("timezone"), active=s.get("active", True))
                     for s in d.get("schedules") or []]
        out.append(await flow.ato_deployment(d["name"], tags=d.get("tags"), description=d.get("description"),
                                             parameters=d.get("parameters") or {}, schedules=schedules))
    return out


async def main() -> None:
    os.chdir(ROOT)  # as the pull step does for a worker: relative paths in profiles resolve in this checkout
    await aserve(*await deployments())


if __name__ == "__main__":
    asyncio.run(main())
