"""The server lifecycle stages as Prefect tasks: kill_server, start_server, wait_for_health.

All three act on a host, so none is ever cached (a retried flow run always kills and starts
again). They take the open ``Host`` the flow holds (one connection per run). Blocking SSH work
runs in a thread so that a task's timeout can interrupt it (an async task that blocks ignores its
timeout). Retries and timeouts are the run's ``stages`` parameter (``LifecycleConfig``), applied
here to each call.

``start_server`` is used as ``async with``: however the block ends, the final ``kill_server``
takes this start's server, and only it (by its start's token), and the client's path to it
(a tunnel for an SSH host) is closed. A start is recorded (``tasks.started``) before it is sent,
so that the cleanup hooks of a run that crashed find the server it started.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from logging import Logger, LoggerAdapter
from typing import TypeVar

import anyio
from prefect import task
from prefect.cache_policies import NO_CACHE

from specsweep.bench.config import RequestSpec
from specsweep.bench.remote import HostLoadGenerator, on_host
from specsweep.hosts import Host
from specsweep.hosts.scripts import START_COMMAND_TIMEOUT_S
from specsweep.hosts.tunnel import ServerPath, open_path
from specsweep.parameters import LifecycleConfig
from specsweep.profiles import ServerProfile
from specsweep.server import health, lifecycle
from specsweep.server.api import ServerAPI
from specsweep.server.gpus import GpuWatch
from specsweep.server.lifecycle import KillReport, ServerHandle
from specsweep.sweep import BenchTarget
from tasks._common import retry_transient, run_logger
from tasks.started import StartRecord, forget_start, record_start


@task(name="kill_server", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 5], timeout_seconds=900)
async def _kill(host: Host, profile: ServerProfile, handle: ServerHandle | None = None,
                token: str | None = None) -> KillReport:
    logger = run_logger(profile, host)
    return await asyncio.to_thread(lifecycle.kill_server, host, profile, handle, token=token, logger=logger)


async def kill_server(host: Host, profile: ServerProfile, stages: LifecycleConfig | None = None, *,
                      handle: ServerHandle | None = None, token: str | None = None) -> KillReport:
    """Stop the server of ``handle`` (or of the start ``token``), else specsweep's leftovers for the
    profile's port (the SSH user's processes that carry its marker); verify nothing is left."""
    return await _kill.with_options(**(stages or LifecycleConfig()).kill.task_options())(host, profile, handle, token)


T = TypeVar("T")

#: How long a timed-out or cancelled task waits for its thread's send in flight (bounded by its SSH timeout).
DRAIN_S = START_COMMAND_TIMEOUT_S + 30


async def _thread_to_its_end(work: Callable[[threading.Event], T], logger: Logger | LoggerAdapter, what: str,
                             undo: Callable[[T], object] | None = None) -> T:
    """``work(cancelled)`` in a thread. If the task times out or is cancelled, the thread runs on (a thread
    cannot be stopped): ``cancelled`` is set so that it sends nothing more, the send in flight is waited for,
    and what it made anyway is undone, so that what comes next (the final kill, the path's close) finds it."""
    cancelled = threading.Event()
    thread = asyncio.ensure_future(asyncio.to_thread(work, cancelled))
    try:
        return await asyncio.shield(thread)
    except BaseException:
        cancelled.set()
        with anyio.CancelScope(shield=True):  # Prefect's timeout is an anyio scope: the wait is shielded from it
            await asyncio.wait({thread}, timeout=DRAIN_S)
        if not thread.done():
            logger.warning("%s was given up and is still busy after %.0f s: going on without it", what, DRAIN_S)
        elif not thread.cancelled() and (late := thread.exception()) is not None:
            logger.info("%s, given up, ended: %s", what, late)
        elif not thread.cancelled() and undo is not None:
            logger.info("%s was given up after it had finished: undoing it", what)
            undo(thread.result())
        raise


@task(name="start_server", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5, retry_condition_fn=retry_transient,
      timeout_seconds=300)
async def _start(host: Host, profile: ServerProfile, kill_port_holder: bool = False, token: str | None = None) -> ServerHandle:
    logger = run_logger(profile, host)
    # A server started after the timeout is left to the final kill that follows (by this start's token).
    return await _thread_to_its_end(lambda cancelled: lifecycle.start_server(
        host, profile, kill_port_holder=kill_port_holder, token=token, logger=logger, cancelled=cancelled),
        logger, f"the start of {profile.name}")


@task(name="open_server_path", cache_policy=NO_CACHE, retries=0, timeout_seconds=120)
async def open_server_path(host: Host, profile: ServerProfile, marker: str) -> ServerPath:
    """The client's way to the server: for an SSH host, a tunnel over SSH to the server's port there."""
    logger = run_logger(profile, host)
    path = await _thread_to_its_end(lambda _: open_path(host, profile.host, profile.port, marker=marker), logger,
                                    f"the way to {profile.name}", undo=lambda late: late.close())
    logger.info("%s: the client reaches it at %s (%s)", profile.name, path.url, path.how)
    return path


@dataclass
class Server:
    """A server this run started: where to send requests, its GPUs, its crash check."""

    host: Host
    profile: ServerProfile
    stages: LifecycleConfig
    handle: ServerHandle
    path: ServerPath
    target: BenchTarget
    gpus: GpuWatch | None = None  # the server's GPUs, where the host has nvidia-smi
    on_host: HostLoadGenerator | None = None  # the load generator on the host, where the host config puts it
    ready: health.HealthReport | None = None
    killed: KillReport | None = None  # the final kill's report, once the server is gone

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
async def start_server(host: Host, profile: ServerProfile, request: RequestSpec, stages: LifecycleConfig, *,
                       marker: str) -> AsyncIterator[Server]:
    """Launch the server detached (its environment carrying this start's token), and, however the block
    ends, kill it (by that token: this start's server only) and close the client's path to it.

    The start is sent once: a retry follows only a start that was not sent, or one whose processes were
    found and removed. A final kill that cannot reach the server is an error of its own (the server may
    still be running); when the block failed already, it is added to that error as a note. ``marker``
    (the flow run's id) names this run's tunnels and its record of the start, by which the cleanup hooks
    of a run that crashed find the server it started, and only that."""
    token = lifecycle.new_token()
    record = StartRecord(flow_run=marker, host=host.label, profile=profile.name, port=profile.port, token=token)
    path = await open_server_path(host, profile, marker)
    handle = None
    try:
        generator = await asyncio.to_thread(on_host, host, profile.host, profile.port)  # checked before the start
        await record_start(record)
        handle = await _start.with_options(**stages.start.task_options())(host, profile, stages.kill_port_holder, token)
        gpus = GpuWatch(host, handle.cuda_visible_devices) if await asyncio.to_thread(host.which, "nvidia-smi") else None
        target = BenchTarget(base_url=path.url, request=request, engine=profile.engine)
        server = Server(host, profile, stages, handle, path, target, gpus, generator)
        yield server
    except BaseException as exc:
        problem = await _final_kill(host, profile, stages, handle, token)
        await asyncio.to_thread(path.close)
        if problem is not None:
            exc.add_note(f"the server may still be running: {problem}")
        else:
            await _forget(record)
        raise
    problem = await _final_kill(host, profile, stages, handle, token, server)
    await asyncio.to_thread(path.close)
    if problem is not None:
        raise problem
    await _forget(record)


#: The record of a start that is gone is bookkeeping: at most this long for it, so that a Prefect API that went
#: down (a temporary server stopped by the same Ctrl-C) does not hold up the kill of the run's other server (the
#: client's retries took 65 s here).
FORGET_TIMEOUT_S = 5.0


async def _forget(record: StartRecord) -> None:
    try:
        await asyncio.wait_for(forget_start(record.flow_run, record.token), FORGET_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - bookkeeping: the hooks then find nothing of it running
        run_logger().warning("could not remove the record of start %s: %s", record.token[:8],
                             exc if str(exc) else f"no answer within {FORGET_TIMEOUT_S:g} s")


async def _final_kill(host: Host, profile: ServerProfile, stages: LifecycleConfig, handle: ServerHandle | None,
                      token: str, server: Server | None = None) -> Exception | None:
    """The final kill of this start's server (by its token), however the run ends; the error when the
    server could not be reached."""
    logger = run_logger(profile, host)
    try:
        report = await kill_server(host, profile, stages, handle=handle, token=token)
        if server is not None:
            server.killed = report
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


@task(name="wait_for_health", cache_policy=NO_CACHE, retries=0)
async def _wait(server: Server) -> health.HealthReport:
    profile, host = server.profile, server.host
    logger = run_logger(profile, host)
    async with ServerAPI(server.path.url, profile.api_key) as api:
        return await health.wait_for_health(host, profile, server.handle, api, path=server.path, logger=logger,
                                            on_log_line=lambda line: logger.info("[server] %s", line))


async def wait_for_health(server: Server) -> health.HealthReport:
    """Poll the health path until ready, forwarding new server log lines into the run log."""
    server.ready = await _wait.with_options(**server.stages.wait.task_options())(server)
    return server.ready
