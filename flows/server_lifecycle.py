"""server-lifecycle: kill leftovers, start a server, wait until it is healthy, kill it.

A smoke test of a server configuration on a host (does it start, how long until ready),
and the skeleton the benchmark flows build on. It holds the host like a benchmark does (a
smoke test must not restart the server of a benchmark running there), and the server is
killed however the flow ends: its own final kill, or the cleanup hooks.
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from flows.host_lock import host_lock
from flows.pipeline import benchmark_flow, flow_run_id, opened
from specsweep.bench.config import RequestOptions
from specsweep.health import HealthReport
from specsweep.hosts import HostConfig
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.stages import LifecycleOptions
from tasks.blocks import aresolve_host, aresolve_profile, check_allowed
from tasks.server import served


@benchmark_flow("server-lifecycle", servers=lambda p: [ServerProfile.model_validate(p["profile"])])
async def server_lifecycle(
    profile: ProfileParams,
    host: HostConfig = HostConfig(),
    stages: LifecycleOptions = LifecycleOptions(),
) -> HealthReport:
    """Start the server, report how long it took to be ready, and kill it."""
    server = await aresolve_profile(profile)
    config = await aresolve_host(host)
    check_allowed(config, [server])
    async with host_lock(config), opened(config, host.block) as h, \
            served(h, config, server, stages, RequestOptions(), marker=flow_run_id()) as ready:
        return ready.ready
