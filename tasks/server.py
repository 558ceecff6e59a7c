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
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from specsweep import health, lifecycle
from specsweep.bench.config import RequestOptions
from specsweep.gpu_metrics import GpuWatch
from specsweep.hosts import Host, HostConfig
from specsweep.lifecycle import KillReport, ServerHandle
from specsweep.profiles import ServerProfile
from specsweep.server_api import ServerAPI
from specsweep.stages import LifecycleOptions
from specsweep.sweep import BenchTarget
from specsweep.tunnel import ServerPath, open_path
from tasks._common import retry_transient, run_logger
from tasks.started import StartRecord, forget_start, record_start


@task(name="kill_server", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 5], timeout_seconds=900)
async def kill_server(host: Host, profile: ServerProfile, handle: ServerHandle | None = None,
                      token: str | None = None) -> KillReport:
    """Stop the server of ``handle`` (or of the start ``token``), else specsweep's leftovers for the
    profile's port (the SSH user's processes that carry its marker); verify nothing is left."""
    logger = run_logger(profile, host)
    return await asyncio.to_thread(lifecycle.kill_server, host, profile, handle, token=token, logger=logger)


@task(
    name="start_server",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=retry_transient,
    timeout_seconds=300,
)
async def start_server(host: Host, profile: ServerProfile, kill_port_holder: bool = False,
                       token: str | None = None) -> ServerHandle:
    """Launch the server detached, its environment carrying the start's ``token``; a busy port is an
    error unless kill_port_holder is set (and the holder is the SSH user's). Sent once: a retry
    follows only a start that was not sent, or one whose processes were found and removed."""
    logger = run_logger(profile, host)
    return await asyncio.to_thread(lifecycle.start_server, host, profile, kill_port_holder=kill_port_holder,
                                   token=token, logger=logger)


@task(name="wait_for_health", cache_policy=NO_CACHE, retries=0)
async def wait_for_health(host: Host, profile: ServerProfile, handle: ServerHandle, path: ServerPath | str,
                          timeout_s: float | None = None) -> health.HealthReport:
    """Poll the health path until ready, forwarding new server log lines into the run log. ``path``: the
    client's way to the server (``open_server_path``), or the URL of a server it reaches directly."""
    logger = run_logger(profile, host)
    if isinstance(path, str):
        path = ServerPath(path)
    async with ServerAPI(path.url, profile.api_key) as api:
        return await health.wait_for_health(host, profile, handle, api, path=path, timeout_s=timeout_s, logger=logger,
                                            on_log_line=lambda line: logger.info("[server] %s", line))


@task(name="open_server_path", cache_policy=NO_CACHE, persist_result=False, retries=0, timeout_seconds=120)
async def open_server_path(host: Host, config: HostConfig, profile: ServerProfile, marker: str) -> ServerPath:
    """The client's way to the server: for an SSH host, a tunnel over SSH to the server's port there."""
    path = await asyncio.to_thread(open_path, host, config, profile.host, profile.port, marker=marker)
    run_logger(profile, host).info("%s: the client reaches it at %s (%s)", profile.name, path.url, path.how)
    return path


@dataclass
class Served:
    """A server this run started and that is ready: where to send requests, and its crash check."""

    host: Host
    profile: ServerProfile
    handle: ServerHandle
    ready: health.HealthReport
    target: BenchTarget
    path: ServerPath
    gpus: GpuWatch | None = None  # the server's GPUs, where the host has nvidia-smi

    PATH_WAIT_S = 30.0

    async def check(self, when: str) -> None:
        """After a block with failures: wait (a while) for a tunnel that is down to come back, so that
        the next block does not fail for the link alone; then raise ServerCrashedError (with its log's
        last lines) if the server process is gone."""
        if (down := self.path.problem()) is not None:
            logger = run_logger(self.profile, self.host)
            logger.warning("the tunnel to %s is down %s (%s): waiting up to %.0f s for it before the next block",
                           self.profile.name, when, down, self.PATH_WAIT_S)
            deadline = time.monotonic() + self.PATH_WAIT_S
            while self.path.problem() is not None and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            logger.info("the tunnel to %s is %s", self.profile.name, "up again" if self.path.problem() is None else
                        "still down: going on")
        await asyncio.to_thread(lifecycle.raise_if_exited, self.host, self.profile, self.handle, when)


@asynccontextmanager
async def served(host: Host, config: HostConfig, profile: ServerProfile, stages: LifecycleOptions,
                 request: RequestOptions, *, marker: str) -> AsyncIterator[Served]:
    """kill leftovers → the client's path (a tunnel for an SSH host) → start → wait until ready; and,
    however the block ends, the final kill (of this start's server only) and the path closed.

    A final kill that cannot reach the server is an error of its own (the server may still be
    running); when the block failed already, it is added to that error as a note. ``marker``
    (the flow run's id) names this run's tunnels and its record of the start (``tasks.started``),
    by which the cleanup hooks of a run that crashed find the server it started, and only that.
    """
    kill = kill_server.with_options(**stages.kill.task_options())
    await kill(host, profile)
    handle = None
    token = lifecycle.new_token()
    record = StartRecord(flow_run=marker, host=host.label, profile=profile.name, port=profile.port, token=token) \
        if marker else None
    path = await open_server_path(host, config, profile, marker)
    try:
        if record is not None:
            await record_start(record)
        start = start_server.with_options(**stages.start.task_options())
        handle = await start(host, profile, stages.kill_port_holder, token)
        ready = await wait_for_health.with_options(**stages.wait.task_options())(host, profile, handle, path)
        target = BenchTarget(base_url=path.url, request=request, engine=profile.engine)
        gpus = GpuWatch(host, handle.cuda_visible_devices) if await asyncio.to_thread(host.which, "nvidia-smi") else None
        yield Served(host, profile, handle, ready, target, path, gpus)
    except BaseException as exc:
        problem = await _final_kill(kill, host, profile, handle, token)
        await asyncio.to_thread(path.close)
        if problem is not None:
            exc.add_note(f"the server may still be running: {problem}")
        elif record is not None:
            await _forget(record)
        raise
    problem = await _final_kill(kill, host, profile, handle, token)
    await asyncio.to_thread(path.close)
    if problem is not None:
        raise problem
    if record is not None:
        await _forget(record)


async def _forget(record: StartRecord) -> None:
    try:
        await forget_start(record.flow_run, record.token)
    except Exception as exc:  # noqa: BLE001 - bookkeeping: the hooks then find nothing of it running
        run_logger().warning("could not remove the record of start %s: %s", record.token[:8], exc)


async def _final_kill(kill: Callable[..., Awaitable[KillReport]], host: Host, profile: ServerProfile,
                      handle: ServerHandle | None, token: str) -> Exception | None:
    """The final kill of this start's server (by its token), however the run ends; the error when the
    server could not be reached."""
    logger = run_logger(profile, host)
    try:
        await kill(host, profile, handle, token)
        return None
    except BaseException as exc:  # noqa: BLE001 - the server must go even if Prefect cannot run a task now
        logger.warning("kill_server task could not run (%s): killing directly", exc)
    try:
        await asyncio.to_thread(lifecycle.kill_server, host, profile, handle, token=token)
        return None
    except Exception as exc:  # noqa: BLE001
        logger.error("could not kill %s on %s (%s). It may still be running there: the next run on this host "
                     "kills it before it starts, or run `specsweep server kill` with this profile.",
                     profile.name, host.label, exc)
        return exc
