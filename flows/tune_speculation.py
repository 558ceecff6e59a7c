"""tune-speculation: a grid of speculative settings x the concurrency levels, against one baseline.

The baseline is measured once, then each grid point in turn, its server restarted with
that point's settings (one server at a time on the host). Each level gets blocks until
its verdict against the baseline is decided, as in a comparison's sequential design. The
answer (``specsweep.tuning``): the best setting per concurrency range, as vLLM's
``num_speculative_tokens_per_batch_size`` or SGLang's adaptive file.

Retrying a failed flow run keeps every configuration that finished (the baseline, finished
grid points) and measures only the rest.
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from typing import Any

from prefect import get_run_logger
from pydantic import BaseModel, Field

from flows.host_lock import host_lock
from flows.pipeline import ConfigurationResult, benchmark_flow, measure_configuration, opened, prepare
from specsweep.decision import DecisionConfig, baseline_needs_more, speculative_needs_more
from specsweep.errors import ConfigError
from specsweep.hosts import HostConfig
from specsweep.profiles import ServerProfile
from specsweep.records import LevelRow
from specsweep.settings import BenchmarkSettings, LlamaCppSettings, SGLangSettings, VLLMSettings
from specsweep.tuning import Engine, GridPoint, Tuning, grid_points, point_settings
from tasks.blocks import aresolve_host, check_allowed
from tasks.results import publish_tuning

GridParam = dict[str, list[int | float]]


class TuneResult(BaseModel):
    baseline: ConfigurationResult
    points: dict[str, ConfigurationResult] = Field(description="Each grid point's configuration, by label.")
    tuning: Tuning
    results: str


EngineSettings = LlamaCppSettings | VLLMSettings | SGLangSettings
_KINDS: dict[Engine, type[EngineSettings]] = {"llamacpp": LlamaCppSettings, "vllm": VLLMSettings,
                                              "sglang": SGLangSettings}


def tuning_target(params: dict[str, Any]) -> tuple[Engine, EngineSettings]:
    """The engine and its settings: exactly one of llamacpp, vllm, sglang (none: the local llama.cpp)."""
    given = [engine for engine in _KINDS if params.get(engine) is not None]
    if len(given) > 1:
        raise ConfigError(f"give the settings of one engine, not {' and '.join(given)}: a grid tunes one server")
    if not given:
        return "llamacpp", LlamaCppSettings()
    engine, value = given[0], params[given[0]]
    return engine, value if isinstance(value, _KINDS[engine]) else _KINDS[engine].model_validate(value)


def grid_profiles(params: dict[str, Any]) -> tuple[Engine, ServerProfile, list[tuple[GridPoint, ServerProfile]]]:
    """The baseline's profile and each grid point's, from the flow's parameters."""
    engine, settings = tuning_target(params)
    points = grid_points(engine, params.get("grid"), settings)
    out = []
    for point in points:
        variant = point_settings(settings, point.values, point.label)
        profile = variant.profile("eagle3") if isinstance(variant, SGLangSettings) else variant.profile("speculative")
        out.append((point, profile.model_copy(update={"name": f"{profile.name}-{point.label}"})))
    return engine, settings.profile("baseline"), out


def _servers(params: dict[str, Any]) -> list[ServerProfile]:
    _, base, points = grid_profiles(params)
    return [base, *(p for _, p in points)]


@benchmark_flow("tune-speculation", servers=_servers)
async def tune_speculation(llamacpp: LlamaCppSettings | None = None, vllm: VLLMSettings | None = None,
                           sglang: SGLangSettings | None = None, grid: GridParam | None = None,
                           host: HostConfig = HostConfig(), benchmark: BenchmarkSettings = BenchmarkSettings(),
                           decision: DecisionConfig = DecisionConfig()) -> TuneResult:
    """Sweep a grid of speculative settings x concurrency levels (the server restarted per setting) and give the
    best setting per concurrency range, in the engine's own per-batch form. grid: the engine's speculation
    fields with the values to try, e.g. {"num_speculative_tokens": [1, 3, 5]} (vLLM), {"num_steps": [1, 3, 5]}
    (SGLang), {"draft_max": [2, 4, 8]} (llama.cpp). One engine's settings; none: the local llama.cpp."""
    logger = get_run_logger()
    engine, base, points = grid_profiles({"llamacpp": llamacpp, "vllm": vllm, "sglang": sglang, "grid": grid})
    if decision.design != "sequential":
        logger.warning("decision.design %s is not used here: a grid measures the baseline, then each setting in "
                       "turn (the sequential design)", decision.design)
    logger.info("tuning %s on %s: %d setting(s) (%s) against %s, each its own server start", engine, host.label,
                len(points), ", ".join(p.label for p, _ in points), base.name)
    prepared, servers = await prepare(benchmark, [base, *(p for _, p in points)])
    host_config = await aresolve_host(host)
    check_allowed(host_config, servers)
    n = benchmark.sweep.num_requests
    async with host_lock(host_config), opened(host_config, host.block) as connection:
        base_result = await measure_configuration(servers[0], connection, host_config, prepared,
                                                  lambda p, rows: baseline_needs_more(decision, n)(rows),
                                                  decision=decision)
        by_level: dict[int, list[LevelRow]] = {}
        for r in base_result.levels:
            by_level.setdefault(r.level_index, []).append(r)
        results: dict[str, ConfigurationResult] = {}
        for (point, _), profile in zip(points, servers[1:], strict=True):
            results[point.label] = await measure_configuration(
                profile, connection, host_config, prepared,
                lambda p, rows: speculative_needs_more(decision, n, by_level.get(p.index, []))(rows),
                decision=decision, only=set(by_level))
    tuning = await publish_tuning(engine, base_result.run_id, {label: r.run_id for label, r in results.items()},
                                  [p for p, _ in points], prepared.store, decision)
    return TuneResult(baseline=base_result, points=results, tuning=tuning, results=str(prepared.store))
