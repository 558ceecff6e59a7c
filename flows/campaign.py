"""campaign: one comparison on every host of a fleet at once, one answer per hardware kind.

Each host gets the comparison (``compare-speculation``, as compare-engine runs it from an engine's settings) as a
subflow of its own, all at once: each holds its machine's lock, so hosts that are one machine take turns. A host that
fails is tried again on its own (``host_retries``) and, failing still, is reported without stopping the others.
The campaign's report (``specsweep.analysis.campaign``) gives one answer per kind of host, each host's beside it,
and the kinds whose hosts disagree beyond their intervals, naming the outlier. A host's finished comparison is
recorded under the results root (``campaigns/<campaign flow run>/``): retrying the campaign from the UI measures
only the hosts that did not finish.
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
import asyncio
import json

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact
from prefect.runtime import flow_run
from pydantic import BaseModel, Field

from flows.compare_speculation import ComparisonResult, compare_speculation
from orchestration.blocks import aresolve_results
from specsweep import engines
from specsweep.analysis.campaign import HostAnswer, KindAnswer, campaign_markdown, host_answer, kind_answers
from specsweep.analysis.compare import compare_runs
from specsweep.analysis.decision import DecisionConfig
from specsweep.engines import EngineSettingsParam
from specsweep.errors import ConfigError, MeasurementError
from specsweep.hosts import HostConfig
from specsweep.parameters import LOCAL_BENCHMARK, LOCAL_DECISION, BenchmarkSettings
from specsweep.results import ResultsStore


class CampaignResult(BaseModel):
    hosts: list[HostAnswer]
    kinds: list[KindAnswer]
    report: str = Field(description="The campaign's report (markdown): also the run's artifact.")


@flow(name="campaign")
async def campaign(hosts: list[HostConfig], settings: EngineSettingsParam = engines.local_settings(),
                   benchmark: BenchmarkSettings = LOCAL_BENCHMARK, decision: DecisionConfig = LOCAL_DECISION,
                   host_retries: int = 1) -> CampaignResult:
    """One comparison (an engine's baseline vs its speculation, from its settings) on each of ``hosts`` at once:
    one answer per kind of host, each host's beside it, and the hosts of a kind that disagree. A host that fails is
    retried on its own (host_retries) and reported; it never stops the others."""
    if not 0 <= host_retries <= 5:
        raise ConfigError(f"host_retries must be from 0 to 5 (got {host_retries})")
    if not hosts:
        raise ConfigError("hosts: give at least one host (each as the comparison's host parameter takes it, e.g. "
                          '{"block": "gpu-01"})')
    logger = get_run_logger()
    store = ResultsStore(await aresolve_results(benchmark.results, benchmark.results_block))
    folder = f"campaigns/{flow_run.get_id() or 'local'}"
    base, spec = settings.profile("baseline"), settings.profile("speculative")

    async def one(index: int, host: HostConfig) -> HostAnswer:
        record = f"{folder}/{index}.json"
        if await asyncio.to_thread(store.location.exists, record):  # an earlier try of this campaign finished it
            runs = json.loads(await asyncio.to_thread(store.location.read_bytes, record))
            comp = await asyncio.to_thread(compare_runs, store, runs[0], runs[1], decision=decision)
            logger.info("%s: finished in an earlier try of this campaign (runs %s, %s)", host.label, *runs)
            return host_answer(host.label, comp, store.run(runs[1]))
        why = ""
        for attempt in range(1, host_retries + 2):
            state = await compare_speculation(base, spec, host, benchmark, decision, return_state=True)
            if state.is_completed():
                result: ComparisonResult = await state.result()  # type: ignore[misc]  # an async flow's result
                comp = result.comparison
                runs = [comp.baseline_run_id, comp.speculative_run_id]
                await asyncio.to_thread(store.location.write_bytes, record, json.dumps(runs).encode())
                return host_answer(host.label, comp, store.run(runs[1]))
            why = state.message or state.name or "failed"
            logger.warning("%s: try %d of %d failed: %s", host.label, attempt, host_retries + 1, why)
        return HostAnswer(host=host.label, error=why)

    answers = await asyncio.gather(*(one(i, h) for i, h in enumerate(hosts)))
    kinds = kind_answers(answers, decision.margin)
    report = campaign_markdown(answers, kinds)
    await acreate_markdown_artifact(markdown=report, key="campaign",
                                    description=f"{len(kinds)} kind(s) of host, {len(answers)} host(s)")
    for k in kinds:
        (logger.warning if k.flagged else logger.info)("%s: %s%s", k.kind, k.recommendation.decision,
                                                       f" (hosts disagree; outlier {', '.join(k.outliers)})"
                                                       if k.flagged else "")
    if all(a.error is not None for a in answers):
        raise MeasurementError("no host answered: " + "; ".join(f"{a.host}: {a.error}" for a in answers))
    return CampaignResult(hosts=list(answers), kinds=kinds, report=report)
