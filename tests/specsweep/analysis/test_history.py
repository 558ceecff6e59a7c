"""The history dataset and drift: one row per comparison, read back (typed, and with pandas), and tonight's answer
held against the last comparable one, naming what moved and what changed between the two runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specsweep.analysis.compare import compare_levels
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.history import drift, history_row, history_table, identity, last_comparable
from specsweep.records import HistoryRow, RunRow
from specsweep.results.store import ResultsStore
from tests.specsweep.analysis.test_compare import rows

SPEC_COMMAND = ("python -m sglang.launch_server --model-path /m/kimi --port 30001 --speculative-algorithm EAGLE3 "
                "--speculative-num-steps 3")
# Faster at 1 and 2, slower from 8 on; tight blocks, so each level is decided.
# Ten rounds a level: enough for a bounded distribution-free interval at the simultaneous confidence.
JITTER = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0]
BASE = {c: [x * j for j in JITTER] for c, x in {1: 100, 2: 190, 8: 600, 16: 800}.items()}
SPEC = {c: [x * j for j in reversed(JITTER)] for c, x in {1: 150, 2: 260, 8: 420, 16: 500}.items()}
# After an upgrade: 8 went from x0.70 to x1.20, so the threshold moved from 8 to 16.
SPEC_AFTER = {**SPEC, 8: [720 * j for j in reversed(JITTER)]}


def run(name: str, version: str, port: int = 30001) -> RunRow:
    return RunRow(config_name=name, engine="sglang", engine_version=version, gpu="NVIDIA H100", gpu_count=8,
                  driver="550.54", model="kimi", host="gpu-01", flow_run_id="f",
                  command=SPEC_COMMAND.replace("30001", str(port)),
                  workload_json='{"source": "mt-bench", "input_len": 128, "output_len": 128}')


def row(spec: dict[int, list[float]], version: str, date: str, port: int = 30001) -> HistoryRow:
    comp = compare_levels(rows("b", BASE), rows("s", spec), decision=DecisionConfig(), paired=True, num_requests=16)
    comp.baseline_run_id, comp.speculative_run_id = f"b-{date}", f"s-{date}"
    return history_row(comp, run("b", version), run("s", version, port), date=date)


def test_a_night_like_the_last_flags_nothing() -> None:
    first, second = row(SPEC, "0.5.4", "2026-12-01T02:00:00Z"), row(SPEC, "0.5.4", "2026-12-02T02:00:00Z", port=30005)
    assert first.key == second.key == identity(second)  # another port is the same configuration
    assert first.off_from == 8 and first.threshold_low == first.threshold_high == 8
    d = drift(first, second)
    assert not d.flagged and d.changed == [] and d.summary().startswith("No drift since b-2026-12-01T02:00:00Z")


def test_an_upgrade_that_moves_the_threshold_is_flagged_and_named() -> None:
    before, after = row(SPEC, "0.5.4", "2026-12-01T02:00:00Z"), row(SPEC_AFTER, "0.5.5", "2026-12-02T02:00:00Z")
    assert before.key == after.key  # an engine upgrade is read against the night before it
    d = drift(before, after)
    assert d.flagged and d.threshold is not None and "off from 8 -> off from 16" in d.threshold
    assert d.levels == ["C=8: x1.20, outside the last run's " + d.levels[0].split("last run's ")[1]]
    assert d.changed == ["engine_version: 0.5.4 -> 0.5.5"]
    assert "engine_version: 0.5.4 -> 0.5.5" in d.summary()


def test_acceptance_that_fell_beyond_its_noise_is_flagged() -> None:
    import json

    before, after = row(SPEC, "0.5.4", "2026-12-01T02:00:00Z"), row(SPEC, "0.5.4", "2026-12-02T02:00:00Z")
    before = before.model_copy(update={"acceptance_json": json.dumps({"coding": {"mean": 3.2, "spread": 0.05},
                                                                      "roleplay": {"mean": 2.0, "spread": 0.3}})})
    after = after.model_copy(update={"acceptance_json": json.dumps({"coding": {"mean": 2.4, "spread": 0.05},
                                                                    "roleplay": {"mean": 1.7, "spread": 0.3}})})
    d = drift(before, after)
    # coding fell 25 % (noise 5 %): flagged; roleplay fell 15 % within its noise (2 x 0.3 / 2.0 = 30 %): not.
    assert d.acceptance == ["acceptance of coding: 2.40 tokens per step, down from 3.20 (more than its noise, 5%)"]


def test_the_history_dataset_reads_back_typed_and_with_pandas(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    rows_ = [row(SPEC, "0.5.4", "2026-12-01T02:00:00Z"), row(SPEC_AFTER, "0.5.5", "2026-12-02T02:00:00Z")]
    other = row(SPEC, "0.5.4", "2026-12-02T03:00:00Z").model_copy(update={"key": "another", "model": "other"})
    for r in [*rows_, other]:
        store.append_history(r)
    assert [r.date for r in store.history(rows_[0].key)] == [r.date for r in rows_]
    assert len(store.history()) == 3
    assert last_comparable(store.history(), rows_[1]) == rows_[0]
    assert last_comparable(store.history(), rows_[0]) is None
    frame = pd.read_parquet(tmp_path / "results" / "history")
    assert len(frame) == 3 and set(frame["engine_version"]) == {"0.5.4", "0.5.5"}
    table = history_table(store.history(rows_[0].key))
    assert [t["answer"] for t in table] == ["off from 8", "off from 16"] and table[0]["kind"] == "8x NVIDIA H100 " \
        "(driver 550.54)"


def test_the_history_command_prints_each_kind_and_the_latest_drift(tmp_path: Path) -> None:
    from tests.helpers.cli import invoke

    store = ResultsStore(tmp_path / "results")
    for r in (row(SPEC, "0.5.4", "2026-12-01T02:00:00Z"), row(SPEC_AFTER, "0.5.5", "2026-12-02T02:00:00Z")):
        store.append_history(r)
    out = invoke("history", "--kind", "h100", "--results", str(tmp_path / "results"), "--plot", str(tmp_path / "h.png"))
    assert out.returncode == 0, out.stderr
    assert "off from 8" in out.stdout and "off from 16" in out.stdout
    assert "Drift since" in out.stdout and "engine_version: 0.5.4 -> 0.5.5" in out.stdout
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
    none = invoke("history", "--kind", "a100", "--results", str(tmp_path / "results"))
    assert none.returncode == 0 and "no comparisons in the history" in none.stdout


def test_two_answers_whose_intervals_bound_no_range_are_no_drift() -> None:
    """Every interval unbounded (too few rounds): neither run says where the threshold may lie, so the same answer
    twice is not a threshold that moved (a nightly run failed on it every night)."""
    few = {c: v[:3] for c, v in BASE.items()}
    few_spec = {c: v[:3] for c, v in SPEC.items()}

    def unbounded(date: str) -> HistoryRow:
        comp = compare_levels(rows("b", few), rows("s", few_spec), decision=DecisionConfig(), paired=True,
                              num_requests=16)
        comp.baseline_run_id, comp.speculative_run_id = f"b-{date}", f"s-{date}"
        return history_row(comp, run("b", "0.5.4"), run("s", "0.5.4"), date=date)

    first, second = unbounded("2026-12-01T02:00:00Z"), unbounded("2026-12-02T02:00:00Z")
    assert not first.threshold_ranged and first.off_from == second.off_from
    assert drift(first, second).threshold is None and not drift(first, second).flagged
