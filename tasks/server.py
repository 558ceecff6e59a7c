"""Server lifecycle tasks: kill_server, start_server, wait_for_health.

All three act on a host, so none is ever cached (a retried flow run always kills and
starts again). Blocking SSH work runs in a thread so that ``timeout_seconds`` can
interrupt the task (see the Prefect notes: an async task that blocks ignores its timeout).
Retries and timeouts are task options; flows override them with ``.with_options``.
"""

from __future__ import annotations

import asyncio

from prefect import task
from prefect.cache_policies import NO_CACHE

from specsweep import health, lifecycle
from specsweep.hosts.config import HostConfig, build_host
from specsweep.lifecycle import KillReport, ServerHandle
from specsweep.profiles import ServerProfile
from tasks._common import retry_transient, run_logger


@task(name="kill_server", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 5], timeout_seconds=900)
async def kill_server(host: HostConfig, profile: ServerProfile, handle: ServerHandle | None = None) -> KillReport:
    """Stop the server and any leftovers on its port; verify nothing is left."""
    logger = run_logger(profile, host)

    def work() -> KillReport:
        with build_host(host, logger) as h:
            return lifecycle.kill_server(h, profile, handle, logger=logger)

    return await asyncio.to_thread(work)


@task(
    name="start_server",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=retry_transient,
    timeout_seconds=300,
)
async def start_server(host: HostConfig, profile: ServerProfile, kill_port_holder: bool = False) -> ServerHandle:
    """Launch the server detached; a busy port is an error unless kill_port_holder is set."""
    logger = run_logger(profile, host)

    def work() -> ServerHandle:
        with build_host(host, logger) as h:
            return lifecycle.start_server(h, profile, kill_port_holder=kill_port_holder, logger=logger)

    return await asyncio.to_thread(work)


@task(name="wait_for_health", cache_policy=NO_CACHE, retries=0)
async def wait_for_health(
    host: HostConfig, profile: ServerProfile, handle: ServerHandle, timeout_s: float | None = None
) -> health.HealthReport:
    """Poll the health path until ready, forwarding new server log lines into the run log."""
    logger = run_logger(profile, host)
    h = build_host(host, logger)
    try:
        return await health.wait_for_health(
            h,
            profile,
            handle,
            address=host.address,
            timeout_s=timeout_s,
            logger=logger,
            on_log_line=lambda line: logger.info("[server] %s", line),
        )
    finally:
        await asyncio.to_thread(h.close)
