"""The speculative-parameter grid: its points checked before anything runs, the best setting per
level, the ranges, and the engines' per-batch forms as vLLM and SGLang take them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsweep.analysis.compare import compare_runs
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.tuning import chains, grid_points, measure_first, predicted_to_lose, tune_runs
from specsweep.engines.llamacpp import LlamaCppSettings
from specsweep.engines.sglang import SGLangSettings
from specsweep.engines.sglang import check_adaptive_config as check_sglang_adaptive_config
from specsweep.engines.vllm import VLLMSettings
from specsweep.engines.vllm import check_speculative_config as check_vllm_speculative_config
from specsweep.errors import ConfigError
from specsweep.records import RunRow
from specsweep.reports.folders import write_tuning_report
from specsweep.results.store import ResultsStore
from tests.specsweep.analysis.test_compare import rows, steady

VLLM = VLLMSettings(model="/m/llama", method="draft_model", draft_model="/m/draft")
VLLM_SPEC = ("python -m vllm.entrypoints.openai.api_server --model /m/llama --speculative-config "
             "'{\"method\":\"draft_model\",\"model\":\"/m/draft\",\"num_speculative_tokens\":%d}'")
SGLANG_SPEC = ("python -m sglang.launch_server --model-path /m/kimi --speculative-algorithm EAGLE3 "
               "--speculative-draft-model-path /m/eagle3 --speculative-num-steps %d --speculative-eagle-topk 1")

def levels(values: dict[int, float]) -> dict[int, list[float]]:
    """12 blocks per level (the distribution-free intervals of issue 43 need rounds) about each value."""
    return {c: steady(x, 12) for c, x in values.items()}


BASE = levels({1: 100, 4: 300, 8: 500, 16: 700})
#: Long drafts pay for one stream, shorter ones under more load, none at 16.
K = {
    1: levels({1: 120, 4: 310, 8: 540, 16: 600}),
    3: levels({1: 150, 4: 360, 8: 520, 16: 560}),
    5: levels({1: 170, 4: 340, 8: 470, 16: 500}),
}


def grid_store(root: Path, base: dict[int, list[float]], points: dict[int, dict[int, list[float]]],
               command: str = VLLM_SPEC, engine: str = "vllm",
               batch: dict[int, tuple[float, float]] | None = None) -> ResultsStore:
    store = ResultsStore(root)
    runs = [("base", "vllm-baseline", base, "python -m vllm.entrypoints.openai.api_server --model /m/llama")]
    runs += [(f"k{k}", f"vllm-draft-k{k}", blocks, command % k) for k, blocks in points.items()]
    for run_id, name, blocks, cmd in runs:
        store.write_run(run_id, RunRow(config_name=name, engine=engine, host="gpu-01", status="completed", command=cmd,
                                       design="sequential", sweep_json=json.dumps({"num_requests": 16}),
                                       engine_version="vllm 0.32.0"))
        for r in rows(name, blocks, batch):
            store.write_level(run_id, r.level.key, r, [])
    return store


def test_the_best_k_per_range_becomes_vllms_schedule(tmp_path: Path) -> None:
    points = grid_points(VLLM, {"num_speculative_tokens": [1, 3, 5]})
    assert [(p.label, p.k) for p in points] == [("k1", 1), ("k3", 3), ("k5", 5)]
    store = grid_store(tmp_path / "res", BASE, K)
    tuning = tune_runs(store, "vllm", "base", {"k1": "k1", "k3": "k3", "k5": "k5"}, points, DecisionConfig())
    assert [(lv.concurrency, lv.best, lv.verdict) for lv in tuning.levels] == [
        (1, "k5", "faster"), (4, "k3", "faster"), (8, "k1", "faster"), (16, "k1", "slower")]
    assert tuning.recommendation.status == "decided" and tuning.recommendation.speculation_off_from == 16
    assert [(r.batch_from, r.batch_to, r.point, r.k) for r in tuning.ranges] == [
        (1, 1, "k5", 5), (2, 4, "k3", 3), (5, 8, "k1", 1), (9, 4096, None, 0)]  # each above the level before it
    assert tuning.setting is not None and tuning.setting.engine == "vllm"  # a vLLM grid gives vLLM's form
    cfg = tuning.setting.content
    assert cfg == {"method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 5,
                   "num_speculative_tokens_per_batch_size": [[1, 1, 5], [2, 4, 3], [5, 8, 1], [9, 4096, 0]]}
    check_vllm_speculative_config(cfg)
    # A grid has only the sequential design: the comparison's advice to alternate is replaced by what applies.
    assert not any("not taken alternately" in n for n in tuning.notes)
    assert any("one server at a time" in n and "compare-speculation" in n for n in tuning.notes), tuning.notes

    urls = write_tuning_report(tuning, store)
    folder = tmp_path / "res" / "reports" / "tune-base"
    assert sorted(p.name for p in folder.iterdir()) == ["report.md", "speedup.png", "tuning.json",
                                                        "vllm-speculative-config.json"]
    assert set(urls) == {"tuning", "vllm-speculative-config", "speedup", "report"}
    assert json.loads((folder / "vllm-speculative-config.json").read_text()) == cfg
    saved = json.loads((folder / "tuning.json").read_text())
    assert saved["status"] == "decided" and [r["point"] for r in saved["ranges"]] == ["k5", "k3", "k1", None]
    assert saved["levels"][0]["points"]["k5"]["verdict"] == "faster"
    report = (folder / "report.md").read_text()
    assert "| 1 | k5 | 5 |" in report and "| 9+ | off (baseline) | 0 |" in report
    assert "num_speculative_tokens_per_batch_size" in report
    assert (folder / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_grid_over_methods_gives_the_best_method_per_range_and_no_single_launch(tmp_path: Path) -> None:
    """n-gram drafting is cheap and pays for one stream; the draft model pays under more load; nothing at 16. The
    answer names the method per range, and says no single launch carries it."""
    points = grid_points(VLLM, {"method": ["ngram", "draft_model"], "num_speculative_tokens": [3]})
    assert [(p.label, p.method, p.k) for p in points] == [("ngram-k3", "ngram", 3), ("draft_model-k3", "draft_model", 3)]
    ngram = ("python -m vllm.entrypoints.openai.api_server --model /m/llama --speculative-config "
             "'{\"method\":\"ngram\",\"num_speculative_tokens\":%d,\"prompt_lookup_max\":4,\"prompt_lookup_min\":2}'")
    store = grid_store(tmp_path / "res", BASE, {3: K[3]})  # the draft model's run: k3
    for run_id, blocks in (("ng", levels({1: 190, 4: 320, 8: 480, 16: 520})),):
        store.write_run(run_id, RunRow(config_name="vllm-ngram-k3", engine="vllm", host="gpu-01", status="completed",
                                       command=ngram % 3, design="sequential",
                                       sweep_json=json.dumps({"num_requests": 16}), engine_version="vllm 0.32.0"))
        for r in rows("vllm-ngram-k3", blocks):
            store.write_level(run_id, r.level.key, r, [])
    tuning = tune_runs(store, "vllm", "base", {"ngram-k3": "ng", "draft_model-k3": "k3"}, points, DecisionConfig())
    assert [(lv.concurrency, lv.best) for lv in tuning.levels] == [
        (1, "ngram-k3"), (4, "draft_model-k3"), (8, "draft_model-k3"), (16, "draft_model-k3")]
    assert [(r.point, r.method) for r in tuning.ranges] == [("ngram-k3", "ngram"), ("draft_model-k3", "draft_model"),
                                                           (None, None)]
    assert tuning.setting is None
    assert any("best method changes with the load" in n and "ngram, draft_model" in n for n in tuning.notes)
    assert tuning.summary.startswith("1 in flight: ngram-k3; 2-8 in flight: draft_model-k3; 9 and more in flight: off")


def test_llamacpp_grids_span_its_drafting_methods() -> None:
    points = grid_points(LlamaCppSettings(), {"spec_type": ["draft-simple", "ngram-simple"], "draft_max": [4]})
    assert [(p.label, p.method, p.k) for p in points] == [("draft-simple-dmax4", "draft-simple", 4),
                                                          ("ngram-simple-dmax4", "ngram-simple", 4)]
    # Its draft model is a chain drafter: the largest draft_max first, the smaller ones perhaps spared; n-grams not.
    drafts = grid_points(LlamaCppSettings(), {"draft_max": [2, 4, 8]})
    assert [[p.label for p in g] for g in chains("llamacpp", drafts)] == [["dmax8", "dmax4", "dmax2"]]
    assert chains("llamacpp", grid_points(LlamaCppSettings(), {"spec_type": ["ngram-simple"], "draft_max": [2, 4]})) == []


def test_a_smaller_k_that_cannot_win_anywhere_is_skipped_by_prediction_and_said_so(tmp_path: Path) -> None:
    """K=5 of a draft model is measured first: its acceptance (marginals 0.9, 0.8, 0.7, 0.6, 0.5: 4.5 tokens a step)
    and its ratios (x2.2 at 1 stream, x1.6 at 16) leave K=1 (1.9 tokens a step) behind K=5 at every level even at
    the cheapest drafting K=5's intervals allow, so K=1 is skipped; K=3 (3.4 tokens a step) might win at 16, and is
    measured. Where an interval is unbounded, nothing is skipped."""
    points = grid_points(VLLM, {"num_speculative_tokens": [1, 3, 5]})
    groups = chains("vllm", points)
    assert [[p.label for p in g] for g in groups] == [["k5", "k3", "k1"]]
    assert [p.label for p in measure_first("vllm", points)] == ["k5"]
    store = grid_store(tmp_path / "res", levels({1: 100, 16: 700}), {5: levels({1: 220, 16: 1120})})
    comp = compare_runs(store, "base", "k5", decision=DecisionConfig())
    assert all(lv.ratio_high is not None for lv in comp.levels)
    marginal = [0.9, 0.8, 0.7, 0.6, 0.5]
    skipped = predicted_to_lose(groups[0][0], comp, marginal, groups[0][1:])
    assert list(skipped) == ["k1"] and skipped["k1"].startswith("PREDICTION, not measured")
    assert "1.90 tokens a step against 4.50" in skipped["k1"]
    # Nothing is predicted from too few rounds (unbounded intervals) or a profile shorter than K.
    few = grid_store(tmp_path / "few", {1: steady(100, 3)}, {5: {1: steady(220, 3)}})
    assert predicted_to_lose(groups[0][0], compare_runs(few, "base", "k5", decision=DecisionConfig()), marginal,
                             groups[0][1:]) == {}
    assert predicted_to_lose(groups[0][0], comp, marginal[:3], groups[0][1:]) == {}
    # The tuning says which points were not measured, and why.
    tuning = tune_runs(store, "vllm", "base", {"k5": "k5"}, points, DecisionConfig(), skipped)
    assert [p.label for p in tuning.points] == ["k5"] and tuning.skipped == skipped
    assert any(n.startswith("k1 not measured: PREDICTION") for n in tuning.notes)


def test_the_ranges_follow_the_batch_the_engine_ran_not_the_concurrency(tmp_path: Path) -> None:
    # The engine ran at most 3 at C=4 and 6 at C=8 (its max_num_seqs): each range starts above what it ran at
    # the level before, and the report shows concurrency and batch side by side.
    batches = {1: (1.0, 1.0), 4: (2.7, 3.0), 8: (5.6, 6.0), 16: (6.0, 6.0)}
    store = grid_store(tmp_path / "res", BASE, K, batch=batches)
    points = grid_points(VLLM, {"num_speculative_tokens": [1, 3, 5]})
    tuning = tune_runs(store, "vllm", "base", {"k1": "k1", "k3": "k3", "k5": "k5"}, points, DecisionConfig())
    assert [(r.batch_from, r.batch_to, r.point, r.k) for r in tuning.ranges] == [
        (1, 1, "k5", 5), (2, 3, "k3", 3), (4, 6, "k1", 1), (7, 4096, None, 0)]
    assert tuning.setting is not None
    assert tuning.setting.content["num_speculative_tokens_per_batch_size"] == [[1, 1, 5], [2, 3, 3], [4, 6, 1],
                                                                               [7, 4096, 0]]
    rec = tuning.recommendation
    assert rec.off_from_batch == 7 and "never ran a batch of 7 at 16 (at most 6)" in rec.reason
    report = (Path(write_tuning_report(tuning, store)["report"].removeprefix("file://"))).read_text()
    assert "| running batch, best point (max) |" in report and "| 4 | 2.7 (3) |" in report


def test_sglang_grid_gives_candidate_steps_per_batch_tier(tmp_path: Path) -> None:
    points = grid_points(SGLangSettings(), {"num_steps": [1, 3, 5]})
    assert [p.label for p in points] == ["steps1", "steps3", "steps5"]
    store = grid_store(tmp_path / "res", BASE, K, command=SGLANG_SPEC, engine="sglang")
    tuning = tune_runs(store, "sglang", "base", {f"steps{k}": f"k{k}" for k in (1, 3, 5)}, points, DecisionConfig())
    assert tuning.setting is not None and tuning.setting.engine == "sglang"
    cfg = tuning.setting.content
    assert cfg == {"1": {"candidate_steps": [5]}, "2": {"candidate_steps": [3]}, "5": {"candidate_steps": [1]},
                   "9": {"candidate_steps": [0]}}
    check_sglang_adaptive_config(cfg)
    assert tuning.setting.flags is not None and "--speculative-num-steps 5 --speculative-eagle-topk 1" in tuning.setting.flags


def test_one_setting_paying_everywhere_keeps_it_on_for_every_batch(tmp_path: Path) -> None:
    fast = {c: [x * 1.3 for x in v] for c, v in BASE.items()}
    store = grid_store(tmp_path / "res", BASE, {3: fast, 5: {c: [x * 1.1 for x in v] for c, v in BASE.items()}})
    points = grid_points(VLLM, {"num_speculative_tokens": [3, 5]})
    tuning = tune_runs(store, "vllm", "base", {"k3": "k3", "k5": "k5"}, points, DecisionConfig())
    assert tuning.recommendation.speculation_off_from is None
    assert tuning.setting is not None
    assert tuning.setting.content["num_speculative_tokens_per_batch_size"] == [[1, 4096, 3]]
    assert tuning.setting.content["num_speculative_tokens"] == 3


def test_an_open_level_leaves_the_grid_best_available_and_names_it(tmp_path: Path) -> None:
    # k3 at 16 could be either side of the baseline. Issue 43: the grid still names its setting (ranges and the
    # engine's form), marked best available with its bound, where it used to give none.
    noisy = {**K[3], 16: [760, 640, 720, 690, 610, 780, 700, 650, 740, 670, 715, 630]}
    store = grid_store(tmp_path / "res", BASE, {1: K[1], 3: noisy})
    points = grid_points(VLLM, {"num_speculative_tokens": [1, 3]})
    tuning = tune_runs(store, "vllm", "base", {"k1": "k1", "k3": "k3"}, points, DecisionConfig())
    assert tuning.levels[-1].best == "k3" and tuning.levels[-1].verdict == "undetermined"
    rec = tuning.recommendation
    assert rec.status == "best available" and 16 in rec.measure_next and rec.worst_case_level == 16
    assert tuning.ranges and tuning.setting is not None and tuning.setting.status == "best available"


@pytest.mark.parametrize(("engine", "grid", "settings", "words"), [
    ("vllm", {"draft_max": [2, 4]}, VLLM, "grid.draft_max is not a vLLM speculation setting: the grid takes "
                                          "method, num_speculative_tokens"),
    ("vllm", {"method": ["ngram", "beam"]}, VLLM, "grid point beam: method: Input should be"),
    ("llamacpp", {"spec_type": ["ngram-simple", "lookahead"]}, LlamaCppSettings(), "grid point lookahead: spec_type"),
    ("llamacpp", {"draft_max": []}, LlamaCppSettings(), "grid.draft_max must be a non-empty list"),
    ("llamacpp", {"draft_max": [2, 2]}, LlamaCppSettings(), "grid.draft_max lists a value twice"),
    ("llamacpp", {"draft_max": [0, 4]}, LlamaCppSettings(), "grid point dmax0: draft_max: Input should be greater "
                                                            "than or equal to 1"),
    ("llamacpp", {"draft_max": [2, 4], "draft_min": [3]}, LlamaCppSettings(),
     "grid point dmax2-dmin3: draft_min (3) must not exceed draft_max (2)"),
    ("vllm", {"num_speculative_tokens": list(range(1, 17)) * 2}, VLLM, "lists a value twice"),
    ("sglang", {"num_steps": [1, 2, 3, 4, 5], "eagle_topk": [1, 2, 4, 8, 16]}, SGLangSettings(),
     "the grid has 25 points (5 x 5); at most 24"),
    ("sglang", {"num_steps": [2, 3], "num_draft_tokens": [4]}, SGLangSettings(),
     "grid point steps2-draft4: with eagle_topk 1, SGLang needs num_draft_tokens = num_steps + 1"),
])
def test_a_bad_grid_is_refused_naming_the_field(engine: str, grid: dict, settings: object, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        grid_points(settings, grid)  # type: ignore[arg-type]
    assert words in str(info.value)


def test_the_default_grids_are_small_and_valid() -> None:
    assert [p.label for p in grid_points(LlamaCppSettings(), None)] == ["dmax2", "dmax4", "dmax8"]
    assert [p.k for p in grid_points(VLLM, None)] == [1, 3, 5]
    p = grid_points(LlamaCppSettings(), {"draft_max": [4], "draft_p_min": [0.5, 0.8]})
    assert [x.label for x in p] == ["dmax4-pmin0.5", "dmax4-pmin0.8"] and p[0].values == {"draft_max": 4,
                                                                                         "draft_p_min": 0.5}
