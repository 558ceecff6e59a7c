"""The campaign flow under a real (temporary) Prefect server: one comparison on each host at once, each a subflow
of its own; a host that fails is retried on its own and reported, never stopping the others; the report gives one
answer per kind of host; a retried campaign measures only what did not finish."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.campaign import campaign
from specsweep.analysis.decision import DecisionConfig
from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.engines.sglang import SGLangSettings
from specsweep.hosts import HostConfig, SSHEndpoint
from specsweep.parameters import BenchmarkSettings
from tests.conftest import pids_with_marker
from tests.helpers.logs import flow_logs
from tests.helpers.sshd import free_port

pytestmark = pytest.mark.usefixtures("prefect_harness")


async def test_a_campaign_answers_per_kind_and_reports_a_host_that_fails_without_stopping_the_others(
        tmp_path: Path) -> None:
    port = free_port(span=2)
    settings = SGLangSettings(simulate=True, sim_profile="tiny-fast", port=port, model_path="/models/kimi",
                              draft_model_path="/models/eagle3")
    # The second host is refused before anything is sent to it (no such host in the worker's policy): it fails, is
    # tried again on its own, and is reported.
    gone = HostConfig(kind="ssh", ssh=SSHEndpoint(hostname="gpu-gone.invalid", user="bench",
                                                  key_path=tmp_path / "no-key", connect_timeout_s=1))
    results = tmp_path / "results"
    benchmark = BenchmarkSettings(workload=WorkloadConfig(input_len=16, output_len=32), results=str(results),
                                  sweep=SweepConfig(concurrency=[1, 16], num_requests=16, warmup_requests=2))
    state = await campaign(hosts=[HostConfig(), gone], settings=settings, benchmark=benchmark,  # type: ignore[arg-type]
                           decision=DecisionConfig(design="alternate", alternate_by="side-by-side",
                                                   max_requests_per_level=96),
                           host_retries=1, return_state=True)
    assert state.is_completed(), state
    result = await state.result()
    local, failed = result.hosts
    assert local.host == "local" and local.error is None and local.off_from == 16
    assert "gpu-gone.invalid" in failed.host and failed.error is not None and "key_path" in failed.error
    (kind,) = result.kinds
    assert kind.hosts == ["local"] and kind.recommendation.speculation_off_from == 16 and not kind.flagged
    assert "## Campaign: one answer per kind of host" in result.report and "| local |" in result.report
    logs = "\n".join(await flow_logs(state.state_details.flow_run_id))
    assert "try 1 of 2 failed" in logs and "try 2 of 2 failed" in logs
    records = list((results / "campaigns").glob("*/*.json"))
    assert [p.name for p in records] == ["0.json"]  # the host that finished, for a retried campaign
    assert pids_with_marker(port) == [] and pids_with_marker(port + 1) == []


@pytest.mark.parametrize(("queues", "words"), [({"gpu-nowhere": "q"}, "work_queues names gpu-nowhere"),
                                               ({"local": " "}, "the queue for local is empty")])
async def test_a_work_queue_for_no_host_is_refused_before_anything_runs(tmp_path: Path, queues: dict[str, str],
                                                                         words: str) -> None:
    state = await campaign(hosts=[HostConfig()], benchmark=BenchmarkSettings(results=str(tmp_path / "results")),
                           work_queues=queues, return_state=True)
    assert state.is_failed() and words in (state.message or ""), state.message
    assert not (tmp_path / "results" / "campaigns").exists()


async def test_a_host_whose_run_cannot_be_made_on_its_queue_is_reported_as_that_hosts_failure(tmp_path: Path) -> None:
    """A deployment that does not exist: the host's try fails with that reason, reported as the host's, and the
    campaign says no host answered (rather than dying of the error itself, leaving the others' runs unowned)."""
    state = await campaign(hosts=[HostConfig()], benchmark=BenchmarkSettings(results=str(tmp_path / "results")),
                           work_queues={"local": "gpu-queue"}, deployment="compare-speculation/nowhere",
                           host_retries=0, return_state=True)
    assert state.is_failed() and "no host answered: local:" in (state.message or ""), state.message
    assert "ObjectNotFound" in (state.message or "")  # the deployment it names does not exist
