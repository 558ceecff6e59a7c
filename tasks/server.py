"""Server lifecycle tasks: kill_server, start_server, wait_for_health; and ``served``, which
runs them in order and guarantees the final kill.

All three act on a host, so none is ever cached (a retried flow run always kills and
starts again). They take the open ``Host`` the flow holds (one connection per run).
Blocking SSH work runs in a thread so that ``timeout_seconds`` can interrupt the task (an
async task that blocks ignores its timeout). Retries and timeouts are task options; flows
override them with ``.with_options`` from the ``stages`` parameter.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from specsweep import health, lifecycle
from specsweep.bench.config import RequestOptions
from specsweep.hosts import Host
from specsweep.lifecycle import KillReport, ServerHandle
from specsweep.profiles import ServerProfile
from specsweep.server_api import ServerAPI
from specsweep.stages import LifecycleOptions
from specsweep.sweep import BenchTarget
from tasks._common import retry_transient, run_logger


@task(name="kill_server", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 5], timeout_seconds=900)
async def kill_server(host: Host, profile: ServerProfile, handle: ServerHandle | None = None) -> KillReport:
    """Stop the server and any leftovers on its port; verify nothing is left."""
    logger = run_logger(profile, host)
    return await asyncio.to_thread(lifecycle.kill_server, host, profile, handle, logger=logger)


@task(
    name="start_server",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=retry_transient,
    timeout_seconds=300,
)
async def start_server(host: Host, profile: ServerProfile, kill_port_holder: bool = False) -> ServerHandle:
    """Launch the server detached; a busy port is an error unless kill_port_holder is set."""
    logger = run_logger(profile, host)
    return await asyncio.to_thread(lifecycle.start_server, host, profile, kill_port_holder=kill_port_holder,
                                   logger=logger)


@task(name="wait_for_health", cache_policy=NO_CACHE, retries=0)
async def wait_for_health(host: Host, profile: ServerProfile, handle: ServerHandle, base_url: str,
                          timeout_s: float | None = None) -> health.HealthReport:
    """Poll the health path until ready, forwarding new server log lines into the run log."""
    logger = run_logger(profile, host)
    async with ServerAPI(base_url, profile.api_key) as api:
        return await health.wait_for_health(host, profile, handle, api, timeout_s=timeout_s, logger=logger,
                                            on_log_line=lambda line: logger.info("[server] %s", line))


@dataclass
class Served:
    """A server this run started and that is ready: where to send requests, and its crash check."""

    host: Host
    profile: ServerProfile
    handle: ServerHandle
    ready: health.HealthReport
    target: BenchTarget

    async def check(self, when: str) -> None:
        """Raise ServerCrashedError (with its log's last lines) if the server process is gone."""
        await asyncio.to_thread(lifecycle.raise_if_exited, self.host, self.profile, self.handle, when)


@asynccontextmanager
async def served(host: Host, profile: ServerProfile, stages: LifecycleOptions, request: RequestOptions,
                 base_url: str) -> AsyncIterator[Served]:
    """kill leftovers → start → wait until ready; and, however the block ends, the final kill.

    A final kill that cannot reach the server is an error of its own (the server may still be
    running); when the block failed already, it is added to that error as a note.
    """
    kill = kill_server.with_options(**stages.kill.task_options())
    await kill(host, profile)
    handle = None
    try:
        handle = await start_server.with_options(**stages.start.task_options())(host, profile, stages.kill_port_holder)
        ready = await wait_for_health.with_options(**stages.wait.task_options())(host, profile, handle, base_url)
        target = BenchTarget(base_url=base_url, request=request, engine=profile.engine)
        yield Served(host, profile, handle, ready, target)
    except BaseException as exc:
        problem = await _final_kill(kill, host, profile, handle)
        if problem is not None:
            exc.add_note(f"the server may still be running: {problem}")
        raise
    problem = await _final_kill(kill, host, profile, handle)
    if problem is not None:
        raise problem


async def _final_kill(kill: Callable[..., Awaitable[KillReport]], host: Host, profile: ServerProfile,
                      handle: ServerHandle | None) -> Exception | None:
    """The final kill, however the run ends; the error when the server could not be reached."""
    logger = run_logger(profile, host)
    try:
        await kill(host, profile, handle)
        return None
    except BaseException as exc:  # noqa: BLE001 - the server must go even if Prefect cannot run a task now
        logger.warning("kill_server task could not run (%s): killing directly", exc)
    try:
        await asyncio.to_thread(lifecycle.kill_server, host, profile, handle)
        return None
    except Exception as exc:  # noqa: BLE001
        logger.error("could not kill %s on %s (%s). It may still be running there: the next run on this host "
                     "kills it before it starts, or run `specsweep server kill` with this profile.",
                     profile.name, host.label, exc)
        return exc
