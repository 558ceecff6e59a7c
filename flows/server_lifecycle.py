"""server-lifecycle: kill leftovers, start a server, wait until it is healthy, kill it.

A smoke test of a server configuration on a host (does it start, how long until ready). It holds
the host like a benchmark does (a smoke test must not restart the server of a benchmark running
there), and the server is killed however the flow ends: its own final kill, or the cleanup hooks.
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from orchestration.cleanup import benchmark_flow
from orchestration.run import prepare_run
from specsweep.hosts import HostConfig
from specsweep.parameters import BenchmarkSettings, LifecycleConfig
from specsweep.profiles import ProfileParams
from specsweep.server.health import HealthReport
from tasks.server import kill_server, start_server, wait_for_health


@benchmark_flow("server-lifecycle")
async def server_lifecycle(profile: ProfileParams, host: HostConfig = HostConfig(),
                           stages: LifecycleConfig = LifecycleConfig()) -> HealthReport:
    """Start the server, report how long it took to be ready, and kill it."""
    run = await prepare_run([profile], host, BenchmarkSettings(stages=stages))
    server = run.servers[0]
    async with run.hold() as h:
        await kill_server(h, server, stages)  # leftovers of earlier runs
        async with start_server(h, server, run.request_for(server), stages, marker=run.marker) as started:
            return await wait_for_health(started)  # then kill_server, as the block ends
