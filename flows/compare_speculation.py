"""The comparison flows: a baseline and a speculative configuration on the same host, then where
speculation stops paying.

    compare-speculation   any two server profiles
    compare-engine        an engine's baseline vs its speculation, from its settings (a few fields, keyed on
                          ``engine``); with no parameters, llama.cpp on this machine's CPU (the main job).
                          deployments/prefect.yaml presets it per engine (local, sglang, vllm)

Each level is measured in blocks until it is settled (one fixed policy within the margin there, worst case)
or its budget is spent, in the design the decision settings name (``specsweep.designs``); with
``decision.verify`` the engine then runs the recommended setting against both fixed policies
(``orchestration.verify``). Retrying a failed flow run keeps
whatever finished (a finished baseline, finished levels).
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
import asyncio

from prefect import get_run_logger
from pydantic import BaseModel

from orchestration.arms import ServerArm
from orchestration.cleanup import benchmark_flow
from orchestration.run import ConfigurationResult, prepare_run
from orchestration.verify import verify_recommendation
from specsweep import designs, engines
from specsweep.analysis.compare import Comparison
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.plan import plan
from specsweep.engines import EngineSettingsParam
from specsweep.errors import ConfigError
from specsweep.hosts import HostConfig
from specsweep.parameters import LOCAL_BENCHMARK, LOCAL_DECISION, BenchmarkSettings
from specsweep.profiles import ProfileParams
from tasks.results import compare_configurations, publish_configuration, publish_temperatures, record_history

#: The share of the time budget a search may spend when the verify stage follows it (which gets the rest).
SEARCH_SHARE = 0.65


class ComparisonResult(BaseModel):
    baseline: ConfigurationResult
    speculative: ConfigurationResult
    comparison: Comparison
    results: str
    by_temperature: dict[str, Comparison] = {}  # benchmark.request.temperatures: the answer at each


@benchmark_flow("compare-speculation")
async def compare_speculation(baseline: ProfileParams, speculative: ProfileParams, host: HostConfig = HostConfig(),
                              benchmark: BenchmarkSettings = BenchmarkSettings(),
                              decision: DecisionConfig = DecisionConfig()) -> ComparisonResult:
    """Measure both configurations, level by level until each is settled, and say where speculation stops paying:
    the setting with the least worst-case loss, and that bound."""
    if benchmark.request.temperatures:
        return await _at_each_temperature(baseline, speculative, host, benchmark, decision)
    logger = get_run_logger()
    logger.info("comparing %s (baseline) with %s (speculative) on %s; %s design, margin %.0f %%, alpha %.2f",
                baseline.name, speculative.name, host.label, decision.design if decision.design == "sequential"
                else f"alternate ({decision.alternate_by})", decision.margin * 100, decision.alpha)
    if benchmark.sweep.repeats != 1:
        logger.warning("benchmark.sweep.repeats is not used by comparisons: each level gets blocks until it is "
                       "settled (decision.min_blocks, decision.max_requests_per_level, decision.max_seconds_per_level)")
    if decision.design == "alternate" and decision.alternate_by == "side-by-side" and speculative.port == baseline.port:
        speculative = speculative.model_copy(update={"port": baseline.port + 1})  # both servers up at once
    if decision.verify:
        engines.check_verifiable(speculative.engine)
        if speculative.engine in engines.ENGINES and engines.ENGINES[speculative.engine].routed and \
                speculative.port == baseline.port:  # its setting runs behind the router: both servers up at once
            speculative = speculative.model_copy(update={"port": baseline.port + 1})
        # The engine's own controller's arm, refused here where it cannot run or its launch breaks a rule.
        for finding in engines.check_controller(speculative, decision):
            logger.warning("verify: the engine's own controller: %s", finding)
    if benchmark.sweep.search is not None and decision.design != "alternate":
        raise ConfigError("benchmark.sweep.search chooses levels a round at a time: set decision.design to alternate "
                          "(the blocks of both configurations in turn)")
    budget = designs.Budget(decision.budget_minutes)
    run = await prepare_run([baseline, speculative], host, benchmark, decision)
    sweep = benchmark.sweep
    async with run.hold() as h:  # one benchmark per host at a time
        base = await run.configuration(run.servers[0], h.label)
        spec = await run.configuration(run.servers[1], h.label)
        planned = await asyncio.to_thread(
            plan, run.store, [base.name, spec.name], [c.profile.masked_command() for c in (base, spec)], sweep,
            decision, exclude=[base.job.run_id, spec.job.run_id],
            restart=decision.design == "alternate" and decision.alternate_by == "restart")
        logger.info("plan: %s", planned.words())
        base_rows, spec_rows = await designs.compare(ServerArm(run, h, base), ServerArm(run, h, spec), run.levels,
                                                     decision, sweep.num_requests,
                                                     stop_at_saturation=sweep.stop_at_saturation, span=sweep.search,
                                                     budget=budget.part(SEARCH_SHARE if decision.verify else 1.0),
                                                     on_step=lambda s: logger.info("search: %s", s.why))
        comparison = await compare_configurations(base.job.run_id, spec.job.run_id, run.store, decision)
        if decision.verify and await verify_recommendation(run, h, base, spec, comparison, decision, budget):
            comparison = await compare_configurations(base.job.run_id, spec.job.run_id, run.store, decision)
    await publish_configuration(base.job, h.label, base_rows)
    await publish_configuration(spec.job, h.label, spec_rows)
    await record_history(comparison, run.store, decision, benchmark.request.temperature)  # the last stage
    return ComparisonResult(baseline=ConfigurationResult.of(base, base_rows),
                            speculative=ConfigurationResult.of(spec, spec_rows),
                            comparison=comparison, results=str(run.store))


async def _at_each_temperature(baseline: ProfileParams, speculative: ProfileParams, host: HostConfig,
                               benchmark: BenchmarkSettings, decision: DecisionConfig) -> ComparisonResult:
    """One comparison per temperature (each configuration named with it: its own runs and report), then the
    answer at each side by side."""
    temperatures = benchmark.request.temperatures or []
    results = {}
    for t in temperatures:
        request = benchmark.request.model_copy(update={"temperature": t, "temperatures": None})
        base_t, spec_t = (p.model_copy(update={"name": f"{p.name}-t{t:g}"}) for p in (baseline, speculative))
        results[f"{t:g}"] = await compare_speculation.fn(base_t, spec_t, host,
                                                         benchmark.model_copy(update={"request": request}), decision)
    await publish_temperatures({t: r.comparison for t, r in results.items()}, baseline.name, speculative.name)
    first = results[f"{temperatures[0]:g}"]
    return first.model_copy(update={"by_temperature": {t: r.comparison for t, r in results.items()}})


@benchmark_flow("compare-engine")
async def compare_engine(settings: EngineSettingsParam = engines.local_settings(), host: HostConfig = HostConfig(),
                         benchmark: BenchmarkSettings = LOCAL_BENCHMARK,
                         decision: DecisionConfig = LOCAL_DECISION) -> ComparisonResult:
    """An engine's baseline vs its speculation from a few fields (settings.engine names the engine: its form); by
    default llama.cpp on this machine's CPU with tiny generated models, its servers side by side."""
    return await compare_speculation.fn(settings.profile("baseline"), settings.profile("speculative"), host, benchmark,
                                        decision)
