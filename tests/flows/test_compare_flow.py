"""The flows end to end under a real (temporary) Prefect server, against real local targets."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterId
from prefect.deployments import run_deployment
from prefect.states import Scheduled

from flows.compare_speculation import compare_speculation
from specsweep.analysis.decision import DecisionConfig
from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.parameters import BenchmarkSettings, LifecycleConfig
from specsweep.results.store import ResultsStore
from tests.conftest import pids_with_marker
from tests.helpers.logs import flow_logs
from tests.helpers.runner import serving, wait_for_deployment, wait_for_state
from tests.helpers.sim import sim_profiles
from tests.helpers.sshd import free_port

pytestmark = pytest.mark.usefixtures("prefect_harness")


async def test_compare_speculation_end_to_end(tmp_path: Path) -> None:
    port = free_port(span=2)  # side by side, the speculative server takes the next port
    base, spec = sim_profiles(port)
    results = tmp_path / "results"
    state = await compare_speculation(
        base, spec, benchmark=BenchmarkSettings(
            workload=WorkloadConfig(input_len=16, output_len=32), results=str(results),
            sweep=SweepConfig(concurrency=[1, 16], num_requests=16, warmup_requests=2)),
        # Levels on both sides of the simulated crossover (near C=4, where x0.93 took up to 320 requests to decide
        # on the loaded suite: the decision tests measure near a crossover, tests/flows/test_decide_and_verify.py).
        # Six blocks each: the fewest that bound the unpaired (Mann-Whitney) interval at 2 levels (issue 43).
        decision=DecisionConfig(max_requests_per_level=96), return_state=True,
    )
    result = await state.result()
    comp = result.comparison
    assert [lv.concurrency for lv in comp.levels] == [1, 16]
    assert comp.levels[0].ratio > 1.05 and comp.levels[-1].ratio < 0.95  # the simulated crossover
    assert [lv.verdict for lv in comp.levels] == ["faster", "slower"], comp.levels
    assert comp.recommendation.status == "decided" and comp.recommendation.speculation_off_from == 16
    off = comp.recommendation.speculation_off_from
    assert comp.setting is not None and comp.setting.engine == "sglang"  # SGLang's own form of the answer
    # The engine's switch sits just above the largest batch it ran at the last level where it pays (C=1).
    assert comp.setting.content == {"1": {"candidate_steps": [3]}, "2": {"candidate_steps": [0]}}
    assert all(lv.ratio_low is not None and tuple(lv.blocks) == (6, 6) for lv in comp.levels)  # the budget's six
    assert comp.recommendation.decision.startswith("Off from 16.")
    assert pids_with_marker(port) == []

    store = ResultsStore(results)
    runs = store.runs()
    assert set(runs["status"]) == {"completed"} and len(runs) == 2
    assert set(runs["engine_version"]) == {"sglang 0.5.4-specsweep-sim"}
    levels = pd.read_parquet(results / "levels")
    # Every block is kept: those that count, and any the loaded machine disturbed (set aside, measured again).
    assert len(levels) == sum(sum(lv.blocks) + sum(lv.set_aside) for lv in comp.levels)
    plots = list((results / "reports").glob("*/*.png"))
    assert sorted(p.name for p in plots) == ["latency.png", "pareto.png", "speedup.png", "throughput.png"]
    assert all(p.stat().st_size < 400_000 for p in plots)

    async with get_client() as client:
        arts = await client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    by_key = {a.key: a for a in arts if a.key}
    # Each host and pair of configurations has its own history in the UI.
    report = by_key["speculation-local-sglang-baseline-vs-sglang-eagle3"]
    assert report.data.startswith(f"**Off from {off}.") and "data:image/png;base64," in report.data
    assert "sglang-baseline-local-levels" in by_key and "sglang-eagle3-local-levels" in by_key
    assert any(a.type == "progress" for a in arts)
    # The artifacts link to the data wherever it lies (here a file:// URL of the shared folder).
    # (A link artifact is kept as markdown: "[text](address)".)
    assert f"]({results.resolve().as_uri()}/levels/run_id=" in by_key["sglang-baseline-local-data"].data
    assert "/report.md)" in by_key["speculation-local-sglang-baseline-vs-sglang-eagle3-report"].data


async def test_retry_like_the_ui_reuses_finished_levels(tmp_path: Path) -> None:
    """A server crash fails the run before the third level; the UI's Retry resumes there and keeps levels 1-2."""
    port = free_port()
    once = tmp_path / "fault-fired"
    # The server dies right after the 24th request: levels 1 and 2 (12 each, warm-up included)
    # finish, level 3's warm-up finds it gone. The once-file makes the restarted server healthy.
    base, _ = sim_profiles(port, "--fault-die-after", "24", "--fault-once-file", str(once))
    results = tmp_path / "results"
    params = {
        "profile": base.as_parameters(),
        "benchmark": {"sweep": {"concurrency": [1, 2, 4], "num_requests": 10, "warmup_requests": 2},
                      "stages": {"warm_up_requests": 0},  # the fault counts requests from the first level on
                      "workload": {"input_len": 8, "output_len": 16}, "results": str(results)},
    }
    with serving("flows.benchmark_config", "benchmark_config", "retry-test"):
        await wait_for_deployment("benchmark-config/retry-test")
        run = await run_deployment("benchmark-config/retry-test", parameters=params, timeout=0)
        failed = await wait_for_state(run.id, {"Failed", "Completed", "Crashed"})
        assert failed.state.name == "Failed", failed.state
        assert once.exists() and pids_with_marker(port) == []
        first_files = {p.name: p.stat().st_mtime_ns for p in (results / "levels").glob("*/*.parquet")}
        # Levels 1 and 2 were written before the failure (a block the loaded machine disturbed is set aside and
        # measured again, which moves the server's death by a block: more blocks, never fewer).
        assert len(first_files) >= 2

        async with get_client() as client:
            await client.set_flow_run_state(run.id, Scheduled(name="AwaitingRetry"), force=True)
        done = await wait_for_state(run.id, {"Completed", "Failed", "Crashed"})
        assert done.state.name == "Completed", done.state
        assert done.run_count == 2

        async with get_client() as client:
            task_runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    bench = {}
    for tr in task_runs:
        if tr.name.startswith("benchmark "):
            bench.setdefault(tr.name, []).append(tr.state.name)
    # The blocks measured on the first try: measured once, then taken from the store on the retry (their files
    # untouched, below); the rest measured on the retry.
    kept = [name for name, states in bench.items() if states == ["Completed", "Completed"]]
    assert "benchmark sglang-baseline C=1 #0" in kept and len(kept) == len(first_files), bench
    stored = pd.read_parquet(results / "levels")
    assert sorted(stored.loc[stored["disturbed"].isna(), "concurrency"]) == [1, 2, 4]
    assert not (results / ".prefect-results").exists()  # nothing pickled under the results root
    files = {p.name: p.stat().st_mtime_ns for p in (results / "levels").glob("*/*.parquet")}
    assert len(files) == len(pd.read_parquet(results / "levels")) > len(first_files)
    assert all(files[name] == mtime for name, mtime in first_files.items())  # not measured again
    assert pids_with_marker(port) == []


async def test_retry_after_the_speculative_server_fails_to_start_keeps_the_baseline(tmp_path: Path) -> None:
    port = free_port()
    once = tmp_path / "fault-fired"
    base, spec = sim_profiles(port)
    spec = spec.model_copy(update={"argv": [*spec.argv, "--fault-crash-on-start", "--fault-once-file", str(once)]})
    results = tmp_path / "results"
    params = {
        "baseline": base.as_parameters(), "speculative": spec.as_parameters(),
        "benchmark": {"sweep": {"concurrency": [1, 4], "num_requests": 8, "warmup_requests": 1},
                      "workload": {"input_len": 8, "output_len": 16}, "results": str(results)},
        "decision": {"min_blocks": 2, "max_requests_per_level": 16},  # two blocks each: no verdict is asserted
    }
    with serving("flows.compare_speculation", "compare_speculation", "retry-spec"):
        await wait_for_deployment("compare-speculation/retry-spec")
        run = await run_deployment("compare-speculation/retry-spec", parameters=params, timeout=0)
        failed = await wait_for_state(run.id, {"Failed", "Completed", "Crashed"})
        assert failed.state.name == "Failed" and once.exists(), failed.state
        baseline_files = {p: p.stat().st_mtime_ns for p in (results / "levels").glob("*sglang-baseline*/*.parquet")}
        assert len(baseline_files) >= 2 * 2  # both levels, in blocks
        async with get_client() as client:
            await client.set_flow_run_state(run.id, Scheduled(name="AwaitingRetry"), force=True)
        done = await wait_for_state(run.id, {"Completed", "Failed", "Crashed"})
        assert done.state.name == "Completed", done.state
    assert {p: p.stat().st_mtime_ns for p in baseline_files} == baseline_files  # the baseline was not measured again
    runs = ResultsStore(results).runs()
    assert sorted(runs["status"]) == ["completed", "completed"]
    log = (Path(__file__).resolve().parents[2] / "data" / ".runner-retry-spec.log").read_text()
    assert "sglang-baseline finished in an earlier try of this flow run" in log
    assert pids_with_marker(port) == []


@pytest.mark.parametrize("alternate_by", ["side-by-side", "restart"])
async def test_alternate_design_takes_blocks_in_turn(alternate_by: str, tmp_path: Path) -> None:
    """Baseline and speculative blocks alternate at each level (ABBA), both servers up on two ports or
    one restarted for each block; the comparison pairs them and decides each level."""
    from specsweep.analysis.decision import DecisionConfig

    port = free_port(span=2)  # side by side, the speculative server takes the next port
    base, spec = sim_profiles(port)
    results = tmp_path / "results"
    state = await compare_speculation(
        base, spec, return_state=True,
        benchmark=BenchmarkSettings(workload=WorkloadConfig(input_len=16, output_len=32), results=str(results),
                                    sweep=SweepConfig(concurrency=[1, 16], num_requests=12, warmup_requests=1),
                                    # A start's warm-up, one request: with restarts, one start per block.
                                    stages=LifecycleConfig(warm_up_requests=1)),
        # Twelve rounds at most: at 2 levels the median's distribution-free interval is bounded from the ninth on
        # (issue 43); a level stops once it is settled.
        decision=DecisionConfig(design="alternate", alternate_by=alternate_by, max_requests_per_level=144),
    )
    comp = (await state.result()).comparison
    assert comp.design == f"alternate-{alternate_by}" and all(lv.paired for lv in comp.levels)
    assert comp.levels[0].verdict == "faster" and comp.levels[1].ratio < 0.9, comp.levels
    if alternate_by == "side-by-side":
        # Restarted for each block, a round's two blocks lie a restart apart, which the loaded suite stretches: once
        # 16 stayed undetermined within the budget. Side by side they follow each other, and 16 is decided.
        assert comp.levels[1].verdict == "slower", comp.levels
        assert comp.recommendation.speculation_off_from == 16
    store = ResultsStore(results)
    levels = store.levels().sort_values("started_at")
    for index in (0, 1):
        order = list(levels[levels["level_index"] == index]["config_name"])
        abba = ["sglang-baseline", "sglang-eagle3", "sglang-eagle3", "sglang-baseline"] * 12
        assert order == abba[:len(order)] and len(order) >= 8, order
    runs = store.runs().set_index("config_name")
    logs = "\n".join(await flow_logs(state.state_details.flow_run_id))
    started = logs.count("server sglang-eagle3 started: pid")
    if alternate_by == "side-by-side":
        assert runs.loc["sglang-eagle3", "base_url"].endswith(f":{port + 1}")  # its own port, beside the baseline
        assert started == 1
    else:
        # Started for each of its blocks, those set aside as disturbed (and measured again) included.
        assert started == sum(lv.blocks[1] + lv.set_aside[1] for lv in comp.levels)
        assert logs.count("sglang-eagle3 warmed up with") == started
    assert pids_with_marker(port) == [] and pids_with_marker(port + 1) == []


async def test_an_engine_upgrade_that_moves_the_answer_fails_the_nightly_run_naming_the_version(tmp_path: Path) -> None:
    """Two nights on one kind of host: the second night's simulator reports another version and speculation now pays
    at 16 too. The comparison appends each night's answer to the results' history, and the second night's last
    stage fails (decision.fail_on_drift, as the nightly deployments set it), naming the version that changed."""
    results = tmp_path / "results"
    benchmark = BenchmarkSettings(workload=WorkloadConfig(input_len=16, output_len=32), results=str(results),
                                  sweep=SweepConfig(concurrency=[1, 16], num_requests=16, warmup_requests=2))
    decision = DecisionConfig(max_requests_per_level=96, fail_on_drift=True)
    port = free_port(span=2)
    base, spec = sim_profiles(port)
    first = await compare_speculation(base, spec, benchmark=benchmark, decision=decision, return_state=True)
    assert first.is_completed(), first
    upgraded = [p.model_copy(update={"argv": [*p.argv, "--sim-version", "0.5.5-specsweep-sim"]}) for p in (base, spec)]
    upgraded[1] = upgraded[1].model_copy(update={"argv": [*upgraded[1].argv, "--sim-speedup", "1=2.0",
                                                          "--sim-speedup", "16=1.5"]})
    second = await compare_speculation(*upgraded, benchmark=benchmark, decision=decision, return_state=True)
    assert second.is_failed(), second
    logs = "\n".join(await flow_logs(second.state_details.flow_run_id))
    assert "Drift since" in logs and "engine_version: sglang 0.5.4-specsweep-sim -> sglang 0.5.5-specsweep-sim" in logs
    assert "off from 16 -> keep it on" in logs or "C=16" in logs
    history = ResultsStore(results).history()
    assert len(history) == 2 and history[0].key == history[1].key  # one kind, two nights
    assert pids_with_marker(port) == []
