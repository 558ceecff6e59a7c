"""A run's hold on its host: one benchmark per GPU host at a time, whoever started it, and the run's
one connection to it.

A Prefect global concurrency limit of 1 per machine (``specsweep-host-<digest of its identity>``,
created when missing) is held from a run's first kill to its last. The machine is what the host is
(``Host.identity``: its SSH host key, or this machine's id), not how it is spelled: ``gpu-01`` and
``gpu-01.lab.example`` are one lock. ``specsweep server start|kill`` takes the same lock (``cli_lock``).
The slot is a lease renewed while the run lives; its id is also kept in a Prefect variable, so that
the hooks of a run that was cancelled or killed outright (they run in another process) can give the
host back at once instead of when the lease runs out.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from uuid import UUID

import httpx
from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, VariableCreate
from prefect.client.schemas.responses import GlobalConcurrencyLimitResponse
from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError, concurrency
from prefect.concurrency.context import ConcurrencyContext
from prefect.concurrency.sync import concurrency as sync_concurrency
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.settings import PREFECT_API_URL
from prefect.utilities.asyncutils import run_coro_as_sync

from specsweep.errors import HostError
from specsweep.hosts import Host, HostConfig, open_host

LOCK_LEASE_S = 60.0
#: How often a run waiting for a busy host looks whether its slot is free. Prefect's own wait retries inside a
#: background service that the process drains when it exits, and a slot another run holds never comes: a run
#: cancelled while it waited could not exit, and its cancellation hook could not run, until the runner killed
#: it 30 s later. So the wait is this task's own: it reads the limit (a plain read, which says nothing in the
#: logs), and only when a slot is free asks for it once (no retries inside Prefect). A request is never cut off
#: mid-way: a slot granted as a time limit struck would be held by nobody until its lease ran out.
ACQUIRE_TRY_S = 2.0
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
async def _acquire(name: str) -> AsyncIterator[None]:
    """The global concurrency limit ``name``'s one slot, as a lease renewed while it is held; while another
    run holds it, looked for every ACQUIRE_TRY_S, so that the process can always exit within one request."""
    async with AsyncExitStack() as stack:
        while True:
            limit = await _limit(name)
            if limit.active_slots < limit.limit:
                try:
                    await stack.enter_async_context(concurrency(name, occupy=1, strict=True,
                                                                lease_duration=LOCK_LEASE_S, max_retries=0))
                    break
                except ConcurrencySlotAcquisitionError as exc:  # another run took it first
                    cause = exc.__cause__
                    if not (isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code == 423):
                        raise
            await asyncio.sleep(ACQUIRE_TRY_S)
        yield


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
        logger.info("waiting for host %s: another benchmark is running on it (global concurrency limit %r). If none "
                    "is (a command killed outright, with its temporary Prefect server, leaves its hold behind), free "
                    "it with: prefect global-concurrency-limit update %s --active-slots 0", host.label, name, name)

    announcer = asyncio.create_task(announce_wait(0.0 if limit.active_slots >= limit.limit else 2.0))
    t0 = time.monotonic()
    # The slot is a lease renewed while the run lives: a run killed outright (no chance to
    # release it) blocks the host only until its lease runs out.
    context = FlowRunContext.get()
    flow_run = context.flow_run if context else None
    try:
        async with _acquire(name):
            announcer.cancel()
            logger.info("holding host %s (waited %.1f s); other runs on it wait until this one ends", host.label,
                        time.monotonic() - t0)
            recorded = await _record_lease(flow_run.id if flow_run else None)
            try:
                yield
            finally:
                if recorded:
                    await _forget_lease(recorded)
    finally:
        announcer.cancel()


def lease_variable(flow_run_id: object) -> str:
    return f"specsweep-lease-{flow_run_id}"


async def _record_lease(flow_run_id: object) -> str | None:
    """Note the host lock's lease where the crash and cancellation hooks (another process) can
    find it, so that a run killed outright frees its host at once rather than when the lease
    runs out."""
    ctx = ConcurrencyContext.get()
    if flow_run_id is None or ctx is None or not ctx.cleanup_lease_ids:
        return None
    name = lease_variable(flow_run_id)
    async with get_client() as client:
        existing = await client.read_variable_by_name(name)
        if existing is not None:
            await client.delete_variable_by_name(name)
        await client.create_variable(VariableCreate(name=name, value=str(ctx.cleanup_lease_ids[-1])))
    return name


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
        try:
            client.release_concurrency_slots_with_lease(UUID(str(variable.value)))
        except Exception:  # noqa: BLE001 - already expired or released
            pass
        client.delete_variable_by_name(name)
    return True


@asynccontextmanager
async def hold_host(config: HostConfig, block: str | None = None) -> AsyncIterator[Host]:
    """The host held for this run (its machine's lock, from the first kill to the last) and the run's one
    connection to it. Host keys it trusted by accept_unknown_host_key are logged, never written back into the
    ssh-host ``block`` it came from."""
    logger = get_run_logger()
    host = open_host(config, logger)
    try:
        async with host_lock(host):
            yield host
    finally:
        await asyncio.to_thread(host.close)
        if accepted := host.accepted_host_keys():
            # Not written back into the block: what a run trusted once is not what later runs should (an
            # administrator adds the lines, having checked them).
            logger.warning("this run trusted %d unknown host key(s)%s; check them and add them to the known_hosts "
                           "the host's logins use:\n%s", len(accepted), f" of ssh-host block {block}" if block else "",
                           "\n".join(accepted))


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
        with sync_concurrency(name, occupy=1, strict=True, timeout_seconds=wait_s,
                              lease_duration=LOCK_LEASE_S):
            yield
    except TimeoutError:
        raise HostError(f"{host.label} is held by a benchmark run (lock {name}) and was not freed within "
                        f"{wait_s:g} s: wait for the run to end (or cancel it in the Prefect UI), or give "
                        "--lock-wait-s more time") from None
