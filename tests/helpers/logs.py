"""A flow run's logs, read back from the Prefect API as the UI shows them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

PAGE = 200  # the API's default page size


def server_log(name: str, port: int, timeout: float = 0.0) -> Path:
    """The newest log of a server started for this name and port (each start logs to a fresh file in
    ~/.specsweep/logs of the login: the tests' hosts all share this machine's home), waiting up to
    ``timeout`` seconds for one to appear."""
    folder = Path.home() / ".specsweep" / "logs"
    deadline = time.monotonic() + timeout
    while True:
        found = sorted(folder.glob(f"{name}-{port}-*.log"), key=lambda p: p.stat().st_mtime)
        if found or time.monotonic() >= deadline:
            assert found, f"no log of {name} on port {port} in {folder}"
            return found[-1]
        time.sleep(0.05)


async def read_all_logs(client: PrefectClient, flow_run_id: Any) -> list[str]:
    """Every log message of a flow run and its task runs, oldest first, page by page."""
    messages: list[str] = []
    while True:
        page = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                      limit=PAGE, offset=len(messages))
        messages.extend(log.message for log in page)
        if len(page) < PAGE:
            return messages


async def flow_logs(flow_run_id: object, until: str = "Finished in state") -> list[str]:
    """The run's logs (written to the API in batches, the last ones as the flow process exits,
    which can be after the run's final state: poll a little for ``until``)."""
    from prefect.logging.handlers import APILogHandler

    messages: list[str] = []
    for _ in range(60):
        await APILogHandler.aflush()
        async with get_client() as client:
            messages = await read_all_logs(client, flow_run_id)
        if any(until in m for m in messages):
            break
        await asyncio.sleep(0.25)
    return messages
