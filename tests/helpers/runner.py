"""Serve a flow from a separate runner process (as `prefect deploy`/`serve` users do), for UI-like tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.settings import PREFECT_API_URL

from tests.helpers.processes import stop_process

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def serving(module: str, flow_attr: str, deployment: str,
            env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``module.flow_attr.serve(name=deployment)`` in a runner process against the test server
    (``env``: more environment for it, e.g. a PREFECT_HOME of its own, as another worker machine has)."""
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PREFECT_RUNNER_POLL_FREQUENCY": "1",
           "PYTHONPATH": str(REPO), **(env or {})}
    code = f"from {module} import {flow_attr} as f; f.serve(name={deployment!r})"
    log = open(REPO / "data" / f".runner-{deployment}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        stop_process(proc, 20)
        log.close()


async def wait_for_deployment(name: str, timeout: float = 180) -> None:
    """Until the runner process has registered its deployment. Its start (Python, Prefect and the flow's module
    imported, then the deployment sent) took over 60 s once on the loaded suite, its log still empty: the wait
    allows three times that (it ends as soon as the deployment is there)."""
    deadline = time.monotonic() + timeout
    async with get_client() as client:
        while time.monotonic() < deadline:
            try:
                await client.read_deployment_by_name(name)
                return
            except Exception:  # noqa: BLE001 - not registered yet
                await asyncio.sleep(0.5)
    raise TimeoutError(f"deployment {name} was not registered by the runner")


async def wait_for_state(flow_run_id: object, names: set[str], timeout: float = 240) -> FlowRun:
    deadline = time.monotonic() + timeout
    async with get_client() as client:
        while time.monotonic() < deadline:
            run = await client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
            if run.state and (run.state.name in names or run.state.type.value in names):
                return run
            await asyncio.sleep(0.5)
    raise TimeoutError(f"flow run {flow_run_id} did not reach {names}; last state {run.state}")
