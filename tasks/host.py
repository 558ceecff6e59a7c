"""A run's hold on its host: one benchmark per GPU host at a time, whoever started it, and the run's
one connection to it.

A Prefect global concurrency limit of 1 per machine (``specsweep-host-<digest of its identity>``,
created when missing) is held from a run's first kill to its last. The machine is what the host is
(``Host.identity``: its SSH host key, or this machine's id), not how it is spelled: ``gpu-01`` and
``gpu-01.lab.example`` are one lock. ``specsweep server start|kill`` takes the same lock (``cli_lock``).
The slot is a lease renewed while the run lives; its id (and the lock's name) is also kept in a Prefect
variable, so that the hooks of a run that was cancelled or killed outright (they run in another process)
can give the host back at once instead of when the lease runs out.

A hold can outlive its holder with nobody left to free it: Prefect keeps leases in the server's memory
and only a server running its services lets them expire, so when a temporary server (the command line's,
when none is configured) goes down with a run killed by Ctrl-C, its slot stays counted in the database
and no lease is left to run out. A run waiting for a host therefore checks every few seconds whether any
recorded holder of that lock still has a lease the server knows (renewing it proves it); when none has,
twice in a row, the slot is stale and is freed (``reclaim_stale_hold``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any
from uuid import UUID

import httpx
from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate, VariableCreate
from prefect.client.schemas.responses import GlobalConcurrencyLimitResponse
from prefect.concurrency.asyncio import concurrency
from prefect.concurrency.context import ConcurrencyContext
from prefect.concurrency.sync import concurrency as sync_concurrency
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.settings import PREFECT_API_URL
from prefect.utilities.asyncutils import run_coro_as_sync

from specsweep.errors import HostError
from specsweep.hosts import Host, HostConfig, open_host
from tasks.blocks import record_host_keys
from tasks.started import PAGE

LOCK_LEASE_S = 60.0
#: While a run waits for its host: how often it checks whether the hold is stale, and how far apart the two
#: checks that must both find it so (a new holder records its lease within milliseconds of taking the slot).
RECLAIM_EVERY_S = 5.0
RECLAIM_CONFIRM_S = 2.0
_log = logging.getLogger("specsweep.host")


def lock_name(identity: str) -> str:
    """The lock of the machine ``identity`` (``Host.identity``) names."""
    return "specsweep-host-" + hashlib.sha256(identity.encode()).hexdigest()[:16]


async def _limit(name: str) -> GlobalConcurrencyLimitResponse:
    async with get_client() as client:
        try:
            return await client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:
                pass
            return await client.read_global_concurrency_limit_by_name(name)


@asynccontextmanager
async def host_lock(host: Host) -> AsyncIterator[None]:
    """One benchmark per machine at a time, whoever started it: a global concurrency limit of 1
    per machine (created when missing), held from the first kill to the last."""
    logger = get_run_logger()
    name = lock_name(await asyncio.to_thread(host.identity))
    limit = await _limit(name)

    async def announce_wait(after_s: float) -> None:
        # Said at once when the host is seen busy, else as soon as taking the slot takes a
        # while (two runs that start together both see it free; one of them then waits).
        await asyncio.sleep(after_s)
        logger.info("waiting for host %s: another benchmark is running on it (global concurrency limit %r)",
                    host.label, name)

    async def reclaim() -> bool:
        try:
            if await reclaim_stale_hold(name):
                logger.warning("host %s was held by a run that is gone (no lease the Prefect server knows holds its "
                               "lock %r: a temporary server went down with a run killed, or the server restarted): "
                               "freed it", host.label, name)
                return True
        except Exception as exc:  # noqa: BLE001 - the wait goes on; the next look may succeed
            _log.debug("could not check %s for a stale hold: %s", name, exc)
        return False

    async def reclaim_while_waiting() -> None:
        while True:
            await asyncio.sleep(RECLAIM_EVERY_S)
            await reclaim()

    if limit.active_slots >= limit.limit and await reclaim():  # before Prefect's own waits (up to 30 s) begin
        limit = await _limit(name)

    announcer = asyncio.create_task(announce_wait(0.0 if limit.active_slots >= limit.limit else 2.0))
    reclaimer = asyncio.create_task(reclaim_while_waiting())
    t0 = time.monotonic()
    # The slot is a lease renewed while the run lives: a run killed outright (no chance to
    # release it) blocks the host only until its lease runs out.
    context = FlowRunContext.get()
    flow_run = context.flow_run if context else None
    try:
        async with concurrency(name, occupy=1, strict=True, lease_duration=LOCK_LEASE_S):
            announcer.cancel()
            reclaimer.cancel()
            recorded = await _record_lease(flow_run.id if flow_run else None, name)
            logger.info("holding host %s (waited %.1f s); other runs on it wait until this one ends", host.label,
                        time.monotonic() - t0)
            try:
                yield
            finally:
                if recorded:
                    await _forget_lease(recorded)
    finally:
        announcer.cancel()
        reclaimer.cancel()


LEASE_PREFIX = "specsweep-lease-"


def lease_variable(holder: object) -> str:
    return f"{LEASE_PREFIX}{holder}"


async def _record_lease(holder: object, lock: str) -> str | None:
    """Note the host lock's lease where the crash and cancellation hooks (another process) can
    find it, so that a run killed outright frees its host at once rather than when the lease
    runs out; and where a run waiting for the host sees that its holder is alive."""
    ctx = ConcurrencyContext.get()
    if holder is None or ctx is None or not ctx.cleanup_lease_ids:
        return None
    name = lease_variable(holder)
    async with get_client() as client:
        existing = await client.read_variable_by_name(name)
        if existing is not None:
            await client.delete_variable_by_name(name)
        await client.create_variable(VariableCreate(name=name, value={"lease": str(ctx.cleanup_lease_ids[-1]),
                                                                      "lock": lock}))
    return name


def _lease_of(value: Any) -> tuple[str | None, str | None]:
    """(lease id, lock name) of a recorded hold (an earlier version recorded the lease id alone)."""
    if isinstance(value, dict):
        return value.get("lease"), value.get("lock")
    return (str(value), None) if value else (None, None)


async def _recorded_holds(client: Any) -> list[tuple[str, str | None, str | None]]:
    """Every recorded hold: (variable name, lease id, lock name), page after page."""
    found: list[tuple[str, str | None, str | None]] = []
    offset = 0
    while True:
        page = (await client.request("POST", "/variables/filter", json={
            "variables": {"name": {"like_": LEASE_PREFIX}}, "offset": offset, "limit": PAGE})).json()
        offset += len(page)
        found += [(v["name"], *_lease_of(v.get("value"))) for v in page if v["name"].startswith(LEASE_PREFIX)]
        if len(page) < PAGE:
            return found


async def reclaim_stale_hold(name: str) -> bool:
    """Free the lock ``name`` when the server counts it held but no recorded holder of it (or of an unknown
    lock) has a lease the server still knows, on two looks ``RECLAIM_CONFIRM_S`` apart. True if freed."""
    async with get_client() as client:
        stale: list[str] = []
        for look in range(2):
            limit = await client.read_global_concurrency_limit_by_name(name)
            if limit.active_slots < limit.limit:
                return False
            stale = []
            for variable, lease, lock in await _recorded_holds(client):
                if lease is None or lock not in (None, name):
                    continue
                try:
                    await client.renew_concurrency_lease(UUID(lease), lease_duration=LOCK_LEASE_S)
                    return False  # a live holder
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code not in (404, 410):
                        raise
                    if lock == name:
                        stale.append(variable)
                except ValueError:
                    continue
            if look == 0:
                await asyncio.sleep(RECLAIM_CONFIRM_S)
        await client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=0))
        for variable in stale:
            try:
                await client.delete_variable_by_name(variable)
            except Exception:  # noqa: BLE001 - bookkeeping
                pass
    return True


async def _forget_lease(name: str) -> None:
    try:
        async with get_client() as client:
            await client.delete_variable_by_name(name)
    except Exception:  # noqa: BLE001 - the lease itself was released; this is bookkeeping
        pass


def release_recorded_lease(flow_run_id: object) -> bool:
    """From a hook: release the host lock a killed flow run still holds. True if there was one."""
    name = lease_variable(flow_run_id)
    with get_client(sync_client=True) as client:
        variable = client.read_variable_by_name(name)
        if variable is None:
            return False
        lease, _ = _lease_of(variable.value)
        try:
            client.release_concurrency_slots_with_lease(UUID(str(lease)))
        except Exception:  # noqa: BLE001 - already expired or released
            pass
        client.delete_variable_by_name(name)
    return True


@asynccontextmanager
async def hold_host(config: HostConfig, block: str | None = None) -> AsyncIterator[Host]:
    """The host held for this run (its machine's lock, from the first kill to the last) and the run's one
    connection to it. Host keys it trusted by accept_unknown_host_key are kept in the ssh-host
    ``block`` it came from, for later runs to check against."""
    logger = get_run_logger()
    host = open_host(config, logger)
    try:
        async with host_lock(host):
            yield host
    finally:
        await asyncio.to_thread(host.close)
        if block and (accepted := host.accepted_host_keys()):
            try:
                added = await record_host_keys(block, accepted)
                if added:
                    logger.warning("recorded %d host key(s) trusted this run in ssh-host block %s: later runs "
                                   "check the host against them", len(added), block)
            except Exception as exc:  # noqa: BLE001 - the run's work is done; say what was not kept
                logger.error("could not record the trusted host keys in ssh-host block %s: %s", block, exc)


@contextmanager
def cli_lock(host: Host, wait_s: float) -> Iterator[None]:
    """For ``specsweep server start|kill``: the machine's lock, as the flow runs take it, held while the
    command runs, when a Prefect server is configured (``PREFECT_API_URL``: the one the runs it must not
    collide with report to). A run holding the machine makes the command wait ``wait_s``, then fail."""
    if not PREFECT_API_URL.value():
        _log.info("no Prefect server is configured (PREFECT_API_URL): %s is not locked against flow runs",
                  host.label)
        yield
        return
    name = lock_name(host.identity())
    run_coro_as_sync(_limit(name))
    try:
        # The context collects the lease's id (a flow run's engine provides one; the command line has none).
        with ConcurrencyContext(), sync_concurrency(name, occupy=1, strict=True, timeout_seconds=wait_s,
                                                    lease_duration=LOCK_LEASE_S):
            recorded = run_coro_as_sync(_record_lease(f"cli-{uuid.uuid4()}", name))
            try:
                yield
            finally:
                if recorded:
                    run_coro_as_sync(_forget_lease(recorded))
    except TimeoutError:
        raise HostError(f"{host.label} is held by a benchmark run (lock {name}) and was not freed within "
                        f"{wait_s:g} s: wait for the run to end (or cancel it in the Prefect UI), or give "
                        "--lock-wait-s more time") from None
