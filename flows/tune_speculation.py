"""tune-speculation: a grid of speculative settings x the concurrency levels, against one baseline.

The baseline is measured once, then each grid point in turn, its server restarted with that
point's settings (one server at a time on the host): the sequential design
(``specsweep.designs``). The answer (``specsweep.analysis.tuning``): the best setting per
concurrency range, in the per-batch form the engine loads. A chain drafter's largest K is measured
before its smaller ones, which are skipped where its acceptance profile predicts they cannot win at
any level (``tuning.predicted_to_lose``; said so, as a prediction, in the answer).

Retrying a failed flow run keeps every configuration that finished (the baseline, finished grid
points) and measures only the rest.
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
import asyncio

from prefect import get_run_logger
from pydantic import BaseModel, Field

from orchestration.arms import ServerArm
from orchestration.cleanup import benchmark_flow
from orchestration.run import Configuration, ConfigurationResult, prepare_run
from specsweep import designs, engines
from specsweep.acceptance import ALL, speculation_profile
from specsweep.analysis.compare import compare_runs
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.tuning import (
    GridPoint,
    Tuning,
    chains,
    grid_points,
    marginal_per_position,
    measure_first,
    point_settings,
    predicted_to_lose,
)
from specsweep.engines import EngineSettings, EngineSettingsParam
from specsweep.errors import ConfigError
from specsweep.hosts import HostConfig
from specsweep.parameters import BenchmarkSettings
from specsweep.profiles import ServerProfile
from specsweep.reports.folders import PROFILE_COLUMNS
from specsweep.results import ResultsStore
from tasks.results import publish_configuration, publish_tuning

GridParam = dict[str, list[int | float | str]]


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
    (SGLang), {"draft_max": [2, 4, 8]} (llama.cpp); with its method field, several methods, e.g. {"method":
    ["ngram", "eagle3"], "num_speculative_tokens": [3, 5]} (vLLM), {"spec_type": ["draft-simple", "ngram-simple"]}
    (llama.cpp): the answer is then the best method and setting per range. settings: the engine's (keyed on
    engine); by default the local llama.cpp's."""
    logger = get_run_logger()
    if benchmark.request.temperatures:
        raise ConfigError("benchmark.request.temperatures is for comparisons (one at each temperature): a grid runs "
                          "at benchmark.request.temperature; run it once per temperature")
    if benchmark.sweep.request_rate:
        raise ConfigError("benchmark.sweep.request_rate: a grid answers per batch-size range, from concurrency levels; "
                          "give benchmark.sweep.concurrency (or search), or compare two settings at request rates with "
                          "compare-speculation")
    engine, base, points = grid_profiles(settings, grid)
    if decision.design != "sequential":
        logger.warning("decision.design %s is not used here: a grid measures the baseline, then each setting in "
                       "turn (the sequential design)", decision.design)
    logger.info("tuning %s on %s: %d setting(s) (%s) against %s, each its own server start", engine, host.label,
                len(points), ", ".join(p.label for p, _ in points), base.name)
    run = await prepare_run([base, *(p for _, p in points)], host, benchmark, decision)
    sweep = benchmark.sweep
    labels = [p.label for p, _ in points]
    spec = engines.get(engine).speculation(points[0][1].argv)
    method, topk = (spec.method, spec.eagle_topk) if spec is not None else (None, None)
    chain_groups = chains(engine, [p for p, _ in points], method, topk)
    first = {p.label for p in measure_first(engine, [p for p, _ in points], method, topk)}
    async with run.hold() as h:  # one benchmark per host at a time
        base_config, *configs = [await run.configuration(profile, h.label) for profile in run.servers]
        config_of = dict(zip(labels, configs, strict=True))
        arm_of = {label: ServerArm(run, h, c) for label, c in config_of.items()}
        base_rows, *first_rows = await designs.sequential(
            [ServerArm(run, h, base_config), *(arm_of[x] for x in labels if x in first)], run.levels, decision,
            sweep.num_requests, stop_at_saturation=sweep.stop_at_saturation)
        rows = dict(zip([x for x in labels if x in first], first_rows, strict=True))
        skipped: dict[str, str] = {}
        for group in chain_groups:
            skipped |= await asyncio.to_thread(_cannot_win, run.store, base_config, config_of[group[0].label], group,
                                               decision, method, topk)
        for label, why in skipped.items():
            logger.info("%s: not measured: %s", label, why)
        later = [x for x in labels if x not in first and x not in skipped]
        rows |= dict(zip(later, await designs.against_baseline(base_rows, [arm_of[x] for x in later], run.levels,
                                                               decision, sweep.num_requests), strict=True))
    measured = [x for x in labels if x in rows]
    await publish_configuration(base_config.job, h.label, base_rows)
    for x in measured:
        await publish_configuration(config_of[x].job, h.label, rows[x])
    tuning = await publish_tuning(engine, base_config.job.run_id, {x: config_of[x].job.run_id for x in measured},
                                  [p for p, _ in points], run.store, decision, skipped)
    return TuneResult(baseline=ConfigurationResult.of(base_config, base_rows),
                      points={x: ConfigurationResult.of(config_of[x], rows[x]) for x in measured},
                      tuning=tuning, results=str(run.store))


def _cannot_win(store: ResultsStore, base: Configuration, largest: Configuration, group: list[GridPoint],
                decision: DecisionConfig, method: str | None, topk: int | None) -> dict[str, str]:
    """The smaller Ks of ``group`` that the largest one's acceptance profile predicts cannot win at any level."""
    comp = compare_runs(store, base.job.run_id, largest.job.run_id, decision=decision)
    profile = speculation_profile(store.request_fields(largest.job.run_id, PROFILE_COLUMNS),
                                  configuration=largest.name, method=method, eagle_topk=topk)
    if profile is not None and ALL in profile["categories"]:
        marginal = profile["categories"][ALL]["marginal"]
    else:  # the engine's per-position counters (accepted at position i per draft: the marginals), where it has them
        marginal = marginal_per_position(store.level_rows(largest.job.run_id))
    return predicted_to_lose(group[0], comp, marginal, group[1:]) if marginal else {}
