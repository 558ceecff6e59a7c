"""campaign: one comparison on every host of a fleet at once, one answer per hardware kind.

Each host gets the comparison (``compare-speculation``, as compare-engine runs it from an engine's settings) as a
subflow of its own, all at once: each holds its machine's lock, so hosts that are one machine take turns. A host that
fails is tried again on its own (``host_retries``) and, failing still, is reported without stopping the others.
The campaign's report (``specsweep.analysis.campaign``) gives one answer per kind of host, each host's beside it,
and the kinds whose hosts disagree beyond their intervals, naming the outlier. A host's finished comparison is
recorded under the results root (``campaigns/<campaign flow run>/``): retrying the campaign from the UI measures
only the hosts that did not finish.

A host named in ``work_queues`` gets its comparison as a run of ``deployment`` on that work queue, so the worker
polling it (on that host, or beside it) measures it, as a subflow of the campaign in the UI; the other hosts' run
in the campaign's own process. The run's answer comes back through the results root (its history row, found by
the run's id), which every worker must therefore share (an S3 root, say); each wait for it is bounded
(``host_timeout_minutes``, after which the run is cancelled and the host reported).
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
import asyncio
import json
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.deployments import arun_deployment
from prefect.runtime import flow_run
from prefect.states import Cancelling
from pydantic import BaseModel, Field

from flows.compare_speculation import ComparisonResult, compare_speculation
from orchestration.blocks import aresolve_results
from specsweep import engines
from specsweep.analysis.campaign import HostAnswer, KindAnswer, campaign_markdown, host_answer, kind_answers
from specsweep.analysis.compare import Comparison, compare_runs
from specsweep.analysis.decision import DecisionConfig
from specsweep.engines import EngineSettingsParam
from specsweep.errors import ConfigError, MeasurementError
from specsweep.hosts import HostConfig
from specsweep.parameters import LOCAL_BENCHMARK, LOCAL_DECISION, BenchmarkSettings
from specsweep.profiles import ServerProfile
from specsweep.results import ResultsStore

#: The deployment a host named in ``work_queues`` runs its comparison as (deployments/prefect.yaml).
COMPARE_DEPLOYMENT = "compare-speculation/profiles"


class CampaignResult(BaseModel):
    hosts: list[HostAnswer]
    kinds: list[KindAnswer]
    report: str = Field(description="The campaign's report (markdown): also the run's artifact.")


def host_key(host: HostConfig) -> str:
    """How ``work_queues`` names a host: its ssh-host block, else its hostname, else "local"."""
    if host.block:
        return host.block
    return host.ssh.hostname if host.kind == "ssh" and host.ssh is not None else "local"


def _queues(hosts: list[HostConfig], work_queues: dict[str, str]) -> dict[str, str]:
    keys = [host_key(h) for h in hosts]
    if unknown := sorted(set(work_queues) - set(keys)):
        raise ConfigError(f"work_queues names {', '.join(unknown)}, which is none of the hosts: name each host by its "
                          f"ssh-host block, else its hostname, else local ({', '.join(dict.fromkeys(keys))})")
    if empty := [k for k, q in work_queues.items() if not q.strip()]:
        raise ConfigError(f"work_queues: the queue for {', '.join(empty)} is empty: name the work queue its worker "
                          "polls (prefect worker start --pool POOL --work-queue QUEUE)")
    return work_queues


async def _answer_of_run(store: ResultsStore, run_id: UUID, decision: DecisionConfig) -> Comparison | None:
    """The comparison a deployment run recorded (its history row names the run)."""
    rows = [r for r in await asyncio.to_thread(store.history) if r.flow_run_id == str(run_id)]
    if not rows:
        return None
    return await asyncio.to_thread(compare_runs, store, rows[-1].baseline_run_id, rows[-1].speculative_run_id,
                                   decision=decision)


async def _on_queue(queue: str, deployment: str, parameters: dict[str, Any], store: ResultsStore,
                    decision: DecisionConfig, timeout_s: float) -> tuple[Comparison | None, str]:
    """Run the comparison as a deployment run on ``queue`` and wait for it (bounded): its answer, or why none."""
    child = await arun_deployment(deployment, parameters=parameters, work_queue_name=queue, as_subflow=True,
                                  timeout=timeout_s, poll_interval=2)
    state = child.state
    if state is None or not state.is_final():
        async with get_client() as client:
            await client.set_flow_run_state(child.id, Cancelling(message="the campaign stopped waiting"), force=True)
        return None, (f"its run {child.name} on work queue {queue} did not finish within {timeout_s / 60:g} min "
                      "(cancelled): is a worker polling that queue?")
    if not state.is_completed():
        return None, f"its run {child.name} on work queue {queue}: {state.message or state.name}"
    comp = await _answer_of_run(store, child.id, decision)
    if comp is None:
        return None, (f"its run {child.name} on work queue {queue} finished but its answer is not in the results "
                      f"root {store} (every worker must share the campaign's results root)")
    return comp, ""


@flow(name="campaign")
async def campaign(hosts: list[HostConfig], settings: EngineSettingsParam = engines.local_settings(),
                   benchmark: BenchmarkSettings = LOCAL_BENCHMARK, decision: DecisionConfig = LOCAL_DECISION,
                   host_retries: int = 1, work_queues: dict[str, str] | None = None,
                   deployment: str = COMPARE_DEPLOYMENT, host_timeout_minutes: float = 240.0) -> CampaignResult:
    """One comparison (an engine's baseline vs its speculation, from its settings) on each of ``hosts`` at once:
    one answer per kind of host, each host's beside it, and the hosts of a kind that disagree. A host that fails is
    retried on its own (host_retries) and reported; it never stops the others. work_queues: per host (its ssh-host
    block, else its hostname, else local), the work queue whose worker runs its comparison as a run of
    ``deployment``; hosts not named run in this flow's process. host_timeout_minutes bounds each such run."""
    if not 0 <= host_retries <= 5:
        raise ConfigError(f"host_retries must be from 0 to 5 (got {host_retries})")
    if not hosts:
        raise ConfigError("hosts: give at least one host (each as the comparison's host parameter takes it, e.g. "
                          '{"block": "gpu-01"})')
    if not 0 < host_timeout_minutes <= 24 * 60:
        raise ConfigError(f"host_timeout_minutes must lie in (0, 1440] (got {host_timeout_minutes:g})")
    if benchmark.sweep.request_rate:
        raise ConfigError("benchmark.sweep.request_rate: a campaign's answers per kind of host are concurrency "
                          "thresholds; give benchmark.sweep.concurrency (or search), or compare one host at request "
                          "rates with compare-speculation")
    queues = _queues(hosts, work_queues or {})
    logger = get_run_logger()
    store = ResultsStore(await aresolve_results(benchmark.results, benchmark.results_block))
    folder = f"campaigns/{flow_run.get_id() or 'local'}"
    base, spec = settings.profile("baseline"), settings.profile("speculative")

    async def measured(host: HostConfig) -> tuple[Comparison | None, str]:
        queue = queues.get(host_key(host))
        if queue is not None:
            return await _on_queue(queue, deployment, _parameters(base, spec, host, benchmark, decision), store,
                                   decision, host_timeout_minutes * 60)
        state = await compare_speculation(base, spec, host, benchmark, decision, return_state=True)
        if state.is_completed():
            result: ComparisonResult = await state.result()  # type: ignore[misc]  # an async flow's result
            return result.comparison, ""
        return None, state.message or state.name or "failed"

    async def one(index: int, host: HostConfig) -> HostAnswer:
        record = f"{folder}/{index}.json"
        if await asyncio.to_thread(store.location.exists, record):  # an earlier try of this campaign finished it
            runs = json.loads(await asyncio.to_thread(store.location.read_bytes, record))
            comp = await asyncio.to_thread(compare_runs, store, runs[0], runs[1], decision=decision)
            logger.info("%s: finished in an earlier try of this campaign (runs %s, %s)", host.label, *runs)
            return host_answer(host.label, comp, store.run(runs[1]))
        why = ""
        for attempt in range(1, host_retries + 2):
            try:
                answer, why = await measured(host)
            except Exception as exc:  # noqa: BLE001  # a host's failure is its own: the others go on
                answer, why = None, f"{type(exc).__name__}: {exc}"
            if answer is not None:
                runs = [answer.baseline_run_id, answer.speculative_run_id]
                await asyncio.to_thread(store.location.write_bytes, record, json.dumps(runs).encode())
                return host_answer(host.label, answer, store.run(runs[1]))
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


def _parameters(base: ServerProfile, spec: ServerProfile, host: HostConfig, benchmark: BenchmarkSettings,
                decision: DecisionConfig) -> dict[str, Any]:
    """The comparison's parameters as a deployment run takes them (JSON)."""
    return {"baseline": base.as_parameters(), "speculative": spec.as_parameters(),
            "host": host.model_dump(mode="json", exclude_none=True), "benchmark": benchmark.model_dump(mode="json"),
            "decision": decision.model_dump(mode="json")}
