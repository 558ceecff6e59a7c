"""tune-speculation: a grid of speculative settings x the concurrency levels, against one baseline.

The baseline is measured once, then each grid point in turn, its server restarted with that
point's settings (one server at a time on the host): the sequential design
(``specsweep.designs``). The answer (``specsweep.analysis.tuning``): the best setting per
concurrency range, in the per-batch form the engine loads.

Retrying a failed flow run keeps every configuration that finished (the baseline, finished grid
points) and measures only the rest.
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from prefect import get_run_logger
from pydantic import BaseModel, Field

from orchestration.arms import ServerArm
from orchestration.cleanup import benchmark_flow
from orchestration.run import ConfigurationResult, prepare_run
from specsweep import designs, engines
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.tuning import GridPoint, Tuning, grid_points, point_settings
from specsweep.engines import EngineSettings, EngineSettingsParam
from specsweep.errors import ConfigError
from specsweep.hosts import HostConfig
from specsweep.parameters import BenchmarkSettings
from specsweep.profiles import ServerProfile
from tasks.results import publish_configuration, publish_tuning

GridParam = dict[str, list[int | float]]


class TuneResult(BaseModel):
    baseline: ConfigurationResult
    points: dict[str, ConfigurationResult] = Field(description="Each grid point's configuration, by label.")
    tuning: Tuning
    results: str


def grid_profiles(settings: EngineSettings, grid: GridParam | None) -> tuple[
        str, ServerProfile, list[tuple[GridPoint, ServerProfile]]]:
    """The engine's name, the baseline's profile and each grid point's (named after the speculative profile and
    the point's label)."""
    out = []
    for point in grid_points(settings, grid):
        profile = point_settings(settings, point.values, point.label).profile("speculative")
        out.append((point, profile.model_copy(update={"name": f"{profile.name}-{point.label}"})))
    return engines.of_settings(settings).name, settings.profile("baseline"), out


@benchmark_flow("tune-speculation")
async def tune_speculation(settings: EngineSettingsParam = engines.local_settings(), grid: GridParam | None = None,
                           host: HostConfig = HostConfig(), benchmark: BenchmarkSettings = BenchmarkSettings(),
                           decision: DecisionConfig = DecisionConfig()) -> TuneResult:
    """Sweep a grid of speculative settings x concurrency levels (the server restarted per setting) and give the
    best setting per concurrency range, in the engine's own per-batch form. grid: the engine's speculation
    fields with the values to try, e.g. {"num_speculative_tokens": [1, 3, 5]} (vLLM), {"num_steps": [1, 3, 5]}
    (SGLang), {"draft_max": [2, 4, 8]} (llama.cpp). settings: the engine's (keyed on engine); by default the local
    llama.cpp's."""
    logger = get_run_logger()
    if benchmark.request.temperatures:
        raise ConfigError("benchmark.request.temperatures is for comparisons (one at each temperature): a grid runs "
                          "at benchmark.request.temperature; run it once per temperature")
    engine, base, points = grid_profiles(settings, grid)
    if decision.design != "sequential":
        logger.warning("decision.design %s is not used here: a grid measures the baseline, then each setting in "
                       "turn (the sequential design)", decision.design)
    logger.info("tuning %s on %s: %d setting(s) (%s) against %s, each its own server start", engine, host.label,
                len(points), ", ".join(p.label for p, _ in points), base.name)
    run = await prepare_run([base, *(p for _, p in points)], host, benchmark, decision)
    sweep = benchmark.sweep
    async with run.hold() as h:  # one benchmark per host at a time
        configs = [await run.configuration(profile, h.label) for profile in run.servers]
        rows = await designs.sequential([ServerArm(run, h, c) for c in configs], run.levels, decision,
                                        sweep.num_requests, stop_at_saturation=sweep.stop_at_saturation)
    for config, config_rows in zip(configs, rows, strict=True):
        await publish_configuration(config.job, h.label, config_rows)
    by_label = {p.label: (c, r) for (p, _), c, r in zip(points, configs[1:], rows[1:], strict=True)}
    tuning = await publish_tuning(engine, configs[0].job.run_id, {k: c.job.run_id for k, (c, _) in by_label.items()},
                                  [p for p, _ in points], run.store, decision)
    return TuneResult(baseline=ConfigurationResult.of(configs[0], rows[0]),
                      points={k: ConfigurationResult.of(c, r) for k, (c, r) in by_label.items()},
                      tuning=tuning, results=str(run.store))
