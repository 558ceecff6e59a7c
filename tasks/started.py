"""Which servers a flow run started, kept where its cleanup hooks can read them.

The failure, cancellation and crash hooks kill only the servers their own run started: never
by port or name, which would take another run's server on the same host (a run cancelled
while it waits for the host must leave the running benchmark alone). A start is recorded, as
a Prefect variable named after the flow run and the start's token, before the start command
is sent (so a start whose answer was lost is covered too), and forgotten once the server is
gone. A run that never held the host has no record, so its hooks touch nothing.
"""

from __future__ import annotations

from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import VariableCreate
from prefect.client.schemas.objects import Variable
from pydantic import BaseModel

PREFIX = "specsweep-start-"


class StartRecord(BaseModel):
    """One start of a flow run: enough to find its processes (the token) and to say which it was."""

    flow_run: str
    host: str
    profile: str
    port: int
    token: str


def _name(flow_run: str, token: str) -> str:
    return f"{PREFIX}{flow_run}-{token}"


async def record_start(record: StartRecord) -> None:
    """Before the start command is sent (the token is all a kill needs to find its processes)."""
    value: Any = record.model_dump(mode="json")
    async with get_client() as client:
        await client.create_variable(VariableCreate(name=_name(record.flow_run, record.token), value=value,
                                                    tags=["specsweep"]))


async def forget_start(flow_run: str, token: str) -> None:
    """The server is gone: nothing for the hooks to do about it."""
    async with get_client() as client:
        await client.delete_variable_by_name(_name(flow_run, token))


#: Variables read per request (the API's own cap on a page is 200).
PAGE = 200


def recorded_starts(flow_run: object) -> list[StartRecord]:
    """From a hook (sync; any process): the starts of ``flow_run`` whose servers may still run. Only the
    variables named for this flow run are asked for, page after page: however many variables the server
    holds, none of this run's is missed."""
    prefix = f"{PREFIX}{flow_run}-"
    found: list[Variable] = []
    with get_client(sync_client=True) as client:
        while True:
            page = Variable.model_validate_list(client.request(
                "POST", "/variables/filter",
                json={"variables": {"name": {"like_": prefix}}, "offset": len(found), "limit": PAGE}).json())
            found += page
            if len(page) < PAGE:
                break
    return [StartRecord.model_validate(v.value) for v in found if v.name.startswith(prefix) and isinstance(v.value, dict)]


def forget_recorded(record: StartRecord) -> None:
    with get_client(sync_client=True) as client:
        try:
            client.delete_variable_by_name(_name(record.flow_run, record.token))
        except Exception:  # noqa: BLE001 - already gone
            pass
