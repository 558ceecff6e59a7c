"""benchmark-config: one server configuration through the pipeline the design card draws.

    kill_server (leftovers) → start_server → wait_for_health → run_concurrency_benchmark × levels → kill_server
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from orchestration.arms import ServerArm, record_environment
from orchestration.cleanup import benchmark_flow
from orchestration.run import ConfigurationResult, prepare_run
from specsweep.hosts import HostConfig
from specsweep.parameters import BenchmarkSettings
from specsweep.profiles import ProfileParams
from specsweep.sweep import repeats, run_levels
from tasks.benchmark import run_concurrency_benchmark, warm_up
from tasks.results import publish_configuration
from tasks.server import kill_server, start_server, wait_for_health


@benchmark_flow("benchmark-config")
async def benchmark_config(profile: ProfileParams, host: HostConfig = HostConfig(),
                           benchmark: BenchmarkSettings = BenchmarkSettings()) -> ConfigurationResult:
    """Kill leftovers, start the server, wait until healthy, measure every level, kill the server."""
    run = await prepare_run([profile], host, benchmark)  # secrets read, host and inputs checked, results writable
    server = run.servers[0]
    async with run.hold() as h:  # one benchmark per host at a time
        config = await run.configuration(server, h.label)
        arm = ServerArm(run, h, config)
        if (rows := config.finished()) is None:  # else: an earlier try of this flow run measured it all
            with config.recorder:  # the run's row: running, then completed / failed / cancelled
                await kill_server(h, server, run.stages)  # leftovers of earlier runs
                async with start_server(h, server, run.request_for(server), run.stages, marker=run.marker) as started:
                    await wait_for_health(started)
                    await record_environment(config, started)
                    await warm_up(started, config.job)
                    rows = await run_levels(
                        run.levels, lambda level: run_concurrency_benchmark(started, config.job, level),
                        more=repeats(run.settings.sweep.repeats), stop_at_saturation=run.settings.sweep.stop_at_saturation,
                        check_server=started.check, on_level=config.progress, set_aside=arm.set_aside)
                # start_server's block ends: kill_server takes this start's server, however the block ended
    await publish_configuration(config.job, h.label, rows)
    return ConfigurationResult.of(config, rows)
