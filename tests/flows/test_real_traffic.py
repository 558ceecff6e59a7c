"""A comparison on MT-Bench under a real Prefect server, on the simulator: chat requests that end where
their answers end, the caches emptied between blocks, and the answer per category in the report a user
reads (table and plot) beside the answer for the mix."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from flows.compare_speculation import compare_speculation
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.traffic import MIX
from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.parameters import BenchmarkSettings
from tests.conftest import pids_with_marker
from tests.helpers.sim import sim_profiles
from tests.helpers.sshd import free_port

pytestmark = pytest.mark.usefixtures("prefect_harness")

CATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


async def test_mt_bench_comparison_answers_per_category_and_for_the_mix(tmp_path: Path) -> None:
    port = free_port(span=2)
    base, spec = sim_profiles(port)
    results = tmp_path / "results"
    benchmark = BenchmarkSettings(workload=WorkloadConfig(source="mt-bench", output_len=48), results=str(results),
                                  sweep=SweepConfig(concurrency=[1, 8], num_requests=40, warmup_requests=1))
    decision = DecisionConfig(design="alternate", alternate_by="side-by-side", min_blocks=2,
                              max_requests_per_level=80)
    state = await compare_speculation(base, spec, benchmark=benchmark, decision=decision, return_state=True)
    comp = (await state.result()).comparison
    view = comp.traffic
    assert view is not None and view.source == "mt-bench"
    assert set(view.categories) == CATEGORIES | {MIX}
    assert {lv.concurrency for lv in view.levels} == {1, 8} and all(lv.pairs > 0 for lv in view.levels)
    assert all(lv.accept_length and lv.accept_length > 1 for lv in view.levels)  # EAGLE-3's figures per request
    assert set(view.recommendations) == CATEGORIES | {MIX}
    # The simulator's greedy answers are the same on both servers: nothing flagged.
    assert view.lossless and all(lv.share == 1.0 for lv in view.lossless)
    assert not any("synthetic" in n or "Not like for like" in n for n in comp.notes)
    levels = pd.read_parquet(results / "levels")
    assert set(levels["endpoint"]) == {"chat"} and not levels["ignore_eos"].any()
    assert set(levels["cache_reset"]) == {"/flush_cache"}
    assert (levels["stop_share"] > 0).all()  # answers ended naturally
    report = next((results / "reports").glob("*/report.md")).read_text()
    assert "### By category of prompt (mt-bench prompts)" in report and "| humanities |" in report
    assert "### Output lengths" in report and "### Same outputs at temperature 0" in report
    assert next((results / "reports").glob("*/categories.png")).stat().st_size > 10_000
    assert pids_with_marker(port) == [] and pids_with_marker(port + 1) == []


async def test_a_list_of_temperatures_is_a_comparison_each_and_their_answers_side_by_side(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    port = free_port(span=2)
    base, spec = sim_profiles(port)
    results = tmp_path / "results"
    benchmark = BenchmarkSettings(workload=WorkloadConfig(source="humaneval", output_len=24), results=str(results),
                                  request={"temperatures": [0.0, 0.7]},  # type: ignore[arg-type]
                                  sweep=SweepConfig(concurrency=[1], num_requests=16, warmup_requests=1))
    decision = DecisionConfig(design="alternate", alternate_by="side-by-side", min_blocks=2,
                              max_requests_per_level=32)
    result = await compare_speculation(base, spec, benchmark=benchmark, decision=decision)
    assert set(result.by_temperature) == {"0", "0.7"}
    runs = pd.read_parquet(results / "runs")
    assert set(runs["config_name"]) == {"sglang-baseline-t0", "sglang-eagle3-t0", "sglang-baseline-t0.7",
                                        "sglang-eagle3-t0.7"}
    levels = pd.read_parquet(results / "levels")
    assert set(levels.groupby("config_name")["temperature"].first().items()) == {
        ("sglang-baseline-t0", 0.0), ("sglang-eagle3-t0", 0.0), ("sglang-baseline-t0.7", 0.7),
        ("sglang-eagle3-t0.7", 0.7)}
    # Outputs are compared at temperature 0 only (above it they are samples).
    assert result.by_temperature["0"].traffic.lossless and not result.by_temperature["0.7"].traffic.lossless
    async with get_client() as client:
        arts = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(
            like_="temperatures-")))
    assert arts and "| 0.7 |" in arts[0].data and "## Speculation by temperature" in arts[0].data
    assert len(list((results / "reports").glob("*/report.md"))) == 2


def _sharegpt(folder: Path) -> Path:
    """A ShareGPT-format file of our own text: a question per conversation and an answer of its own length."""
    path = folder / "conversations.json"
    path.write_text(json.dumps([{"id": str(i), "conversations": [
        {"from": "human", "value": f"question {i}: how does the river reach the sea in story {i}?"},
        {"from": "gpt", "value": " ".join(["water"] * (10 + 3 * i))}]} for i in range(12)]))
    return path


def _jsonl(folder: Path) -> Path:
    """The user's own JSONL: chat messages with a category of theirs on each line."""
    path = folder / "traffic.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": f"Summarise report {i}."}],
                                        "category": "support" if i % 2 else "search"}) + "\n" for i in range(12)))
    return path


@pytest.mark.parametrize(("source", "make", "categories"), [
    ("sharegpt", _sharegpt, {"(none)"}), ("file", _jsonl, {"support", "search"})])  # ShareGPT has no categories
async def test_each_prompt_source_through_a_comparison(source: str, make: object, categories: set[str],
                                                       tmp_path: Path) -> None:
    port = free_port(span=2)
    base, spec = sim_profiles(port)
    results = tmp_path / "results"
    prompts = make(tmp_path)  # type: ignore[operator]
    benchmark = BenchmarkSettings(workload=WorkloadConfig(source=source, prompts_file=prompts, output_len=64),
                                  results=str(results),
                                  sweep=SweepConfig(concurrency=[1, 4], num_requests=12, warmup_requests=1))
    # Two rounds, no more: no verdict is asserted here, only what each source sends and records.
    decision = DecisionConfig(design="alternate", alternate_by="side-by-side", min_blocks=2, max_requests_per_level=24)
    comp = (await compare_speculation(base, spec, benchmark=benchmark, decision=decision)).comparison
    assert comp.traffic is not None and comp.traffic.source == source
    assert set(comp.traffic.categories) == categories | {MIX}
    requests = pd.read_parquet(results / "requests")
    measured = requests[~requests["warmup"]]
    assert set(measured["endpoint"]) == {"chat"}
    assert set(measured["category"].fillna("(none)")) == categories
    if source == "sharegpt":  # each request stops where its answer's length says (the simulator honours it)
        assert measured["output_tokens"].nunique() > 3 and measured["output_tokens"].max() <= 64
    assert pids_with_marker(port) == [] and pids_with_marker(port + 1) == []


async def test_a_trace_replayed_at_request_rates_is_compared(tmp_path: Path) -> None:
    """A trace (arrival_s on every line) replayed at two rates, its recorded gaps scaled: at 8 requests a second
    speculation decodes faster; at 64 the speculative server falls behind the arrivals and queues them. The answer is
    in requests a second, carried to the engine's per-batch setting by the batch the engine ran."""
    port = free_port(span=2)
    # Speculation twice as fast for one request, far behind from a batch of four (the baseline ignores these).
    base, spec = sim_profiles(port, "--sim-speedup", "1=2.0", "--sim-speedup", "2=1.6", "--sim-speedup", "4=0.5",
                              "--sim-speedup", "8=0.3")
    results = tmp_path / "results"
    trace = tmp_path / "trace.jsonl"
    arrivals = [0.0, 0.02, 0.5, 0.52, 0.54, 1.3, 1.9, 1.95, 2.6, 3.0, 3.02, 3.9, 4.4, 4.45, 5.1, 5.5]  # bursty
    trace.write_text("".join(json.dumps({"prompt": f"Summarise ticket {i}.", "arrival_s": a, "max_tokens": 16,
                                         "category": "support"}) + "\n" for i, a in enumerate(arrivals)))
    benchmark = BenchmarkSettings(workload=WorkloadConfig(source="file", prompts_file=trace, output_len=16),
                                  results=str(results),
                                  sweep=SweepConfig(request_rate=[8.0, 64.0], num_requests=16, warmup_requests=1))
    decision = DecisionConfig(design="alternate", alternate_by="side-by-side", min_blocks=2, max_requests_per_level=32,
                              verify=True, verify_controller=False)
    comp = (await compare_speculation(base, spec, benchmark=benchmark, decision=decision)).comparison
    assert comp.mode == "rate" and [lv.concurrency for lv in comp.levels] == [8.0, 64.0]
    low, high = comp.levels
    assert low.ratio > 1.1 and high.ratio < 0.9, (low.ratio, high.ratio)
    rec = comp.recommendation
    assert rec.speculation_off_from == 64.0 and rec.decision.startswith("Off from 64 requests/s.")
    assert rec.batch_measured and rec.off_from_batch is not None  # the simulator's /metrics gauge
    assert comp.setting is not None and comp.setting.flags  # the engine's per-batch setting, carrying the answer
    # The verify stage ran that setting on the engine at the same rates, against always off and always on.
    assert comp.verification is not None and [lv.concurrency for lv in comp.verification.levels] == [8.0, 64.0]
    # Sent as the trace says: the same prompts to both, at the trace's own gaps scaled to the level's rate.
    requests = pd.read_parquet(results / "requests")
    measured = requests[~requests["warmup"] & (requests["level_value"] == 8.0)]
    first = measured[measured["run_id"] == measured["run_id"].iloc[0]]
    block = first[first["repeat"] == 0].sort_values("scheduled_s")
    gaps = block["scheduled_s"].diff().dropna().tolist()
    own = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    expected = [(b - a) * own / 8.0 for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert gaps == pytest.approx(expected, abs=1e-6)
    report = next((results / "reports").glob("*/report.md")).read_text()
    assert "| requests/s |" in report and "tok/s per request" in report
    assert pids_with_marker(port) == [] and pids_with_marker(port + 1) == []
