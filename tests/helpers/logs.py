"""A flow run's logs, read back from the Prefect API as the UI shows them."""

from __future__ import annotations

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId


async def flow_logs(flow_run_id: object, until: str = "Finished in state") -> list[str]:
    """The run's logs as the UI shows them (written to the API in batches, so poll a little)."""
    import asyncio

    from prefect.logging.handlers import APILogHandler

    messages: list[str] = []
    for _ in range(40):
        await APILogHandler.aflush()
        async with get_client() as client:
            logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))  # type: ignore[list-item]
        messages = [log.message for log in logs]
        if any(until in m for m in messages):
            break
        await asyncio.sleep(0.25)
    return messages
