"""server-lifecycle: kill leftovers, start a server, wait until it is healthy, kill it.

A smoke test of a server configuration on a host (does it start, how long until ready),
and the skeleton the benchmark flows build on. The server is killed however the flow ends.
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from prefect import flow

from specsweep.health import HealthReport
from specsweep.hosts.config import HostConfig
from specsweep.profiles import ProfileParams
from specsweep.stages import LifecycleOptions
from tasks.blocks import aresolve_profile
from tasks.server import kill_server, start_server, wait_for_health


@flow(name="server-lifecycle", log_prints=False)
async def server_lifecycle(
    profile: ProfileParams,
    host: HostConfig = HostConfig(),
    stages: LifecycleOptions = LifecycleOptions(),
) -> HealthReport:
    profile = await aresolve_profile(profile)
    kill = kill_server.with_options(**stages.kill.task_options())
    await kill(host, profile)
    handle = await start_server.with_options(**stages.start.task_options())(host, profile, stages.kill_port_holder)
    try:
        return await wait_for_health.with_options(**stages.wait.task_options())(host, profile, handle)
    finally:
        await kill(host, profile, handle)


if __name__ == "__main__":
    import asyncio

    from specsweep.llamacpp import speculative_profile

    result = asyncio.run(server_lifecycle(speculative_profile()))
    print(result.model_dump_json(indent=2))
