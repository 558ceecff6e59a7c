"""The verify stage's fourth arm: the measured schedule against the engine's own speculation controller (issue 44).
How each engine is started with its controller, the verdict per level and over the levels, and the error budget
the extra comparison takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsweep import engines
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.verify import overall_standing, verify_levels
from specsweep.engines.base import OWN_CONTROLLER, with_setting
from specsweep.engines.llamacpp import speculative as llama_speculative
from specsweep.engines.sglang import ENGINE as SGLANG
from specsweep.engines.sglang import eagle3
from specsweep.engines.vllm import speculative as vllm_speculative
from specsweep.errors import ConfigError
from specsweep.records import BlockRow
from specsweep.server.controller_state import tier_figures

OFF = {1: [100.0, 101, 99, 100.5] * 3, 16: [800.0, 805, 795, 802] * 3}
ON = {1: [150.0, 151, 149, 150.5] * 3, 16: [440.0, 445, 438, 442] * 3}
SCHEDULE = {1: [149.0, 150, 150, 151] * 3, 16: [801.0, 799, 803, 800] * 3}


def rows(name: str, blocks: dict[int, list[float]]) -> list[BlockRow]:
    return [BlockRow(config_name=name, level_index=i, mode="concurrency", concurrency=c, repeat=rep,
                     output_tokens_per_s=t, requests=16, completed=16, duration_s=2.0)
            for i, (c, tps) in enumerate(blocks.items()) for rep, t in enumerate(tps)]


def against(controller: dict[int, list[float]], decision: DecisionConfig = DecisionConfig()):  # type: ignore[no-untyped-def]
    return verify_levels(rows("off", OFF), rows("on", ON), rows("schedule", SCHEDULE), rows("controller", controller),
                         off_from=16, setting="--x", decision=decision, num_requests=16,
                         controller_setting="--speculative-adaptive")


def test_a_controller_that_keeps_drafting_at_high_load_loses_to_the_schedule_there() -> None:
    # The controller runs like always-on at 16 (x0.55 of the schedule), like the schedule at 1.
    v = against({1: [150.0, 149, 151, 150] * 3, 16: [450.0, 452, 449, 451] * 3})
    assert [lv.controller.result for lv in v.levels if lv.controller] == ["matches", "beats"]
    assert v.against_controller == "beats" and v.controller == "--speculative-adaptive"
    assert v.controller_summary.startswith("The measured schedule beats the engine's own controller at some level")
    assert "16: ×1.78 of the controller (beats)" in v.controller_summary
    assert v.status == "verified"  # the schedule's own verdict is untouched by the fourth arm
    assert round(v.mean_tokens_per_s["controller"]) == 300


def test_a_controller_ahead_of_the_schedule_wins_and_one_level_each_way_is_mixed() -> None:
    ahead = against({1: [180.0, 181, 179, 180.5] * 3, 16: [801.0, 800, 802, 799] * 3})
    assert [lv.controller.result for lv in ahead.levels if lv.controller] == ["loses", "matches"]
    assert ahead.against_controller == "loses"
    mixed = against({1: [180.0, 181, 179, 180.5] * 3, 16: [450.0, 452, 449, 451] * 3})
    assert mixed.against_controller == "mixed"


def test_a_noisy_controller_is_undetermined_never_a_verdict() -> None:
    v = against({1: [100.0, 200, 120, 180] * 3, 16: [801.0, 800, 802, 799] * 3})
    assert v.levels[0].controller is not None and v.levels[0].controller.result == "undetermined"
    assert v.against_controller == "undetermined"


def test_the_overall_standing_of_the_levels() -> None:
    assert overall_standing([]) is None
    assert overall_standing(["matches", "matches"]) == "matches"
    assert overall_standing(["matches", "no better"]) == "no better"
    assert overall_standing(["beats", "no better"]) == "beats"
    assert overall_standing(["beats", "undetermined"]) == "undetermined"
    assert overall_standing(["beats", "loses", "undetermined"]) == "mixed"


def test_the_extra_comparison_shares_the_levels_error_budget() -> None:
    # Two comparisons per level (against the better fixed policy, against the controller): each interval is held
    # at half the level's alpha, so it is wider than the three-arm stage's.
    d = DecisionConfig()
    one, two = d.look_confidence(16), d.look_confidence(16, comparisons=2)
    assert one < two < 1
    three = verify_levels(rows("off", OFF), rows("on", ON), rows("schedule", SCHEDULE), off_from=16, setting="--x",
                          decision=d, num_requests=16)
    four = against({1: [150.0, 149, 151, 150] * 3, 16: [450.0, 452, 449, 451] * 3})
    widths = [(lv.ratio_high or 0) - (lv.ratio_low or 0) for lv in (three.levels[0], four.levels[0])]
    assert widths[1] >= widths[0]
    assert three.against_controller is None and "controller" not in three.mean_tokens_per_s


def test_sglang_starts_its_controller_with_its_default_tiers_or_the_users_config() -> None:
    spec = eagle3("/m", "/d", port=30001)
    decision = DecisionConfig(verify=True)
    setting = engines.controller_setting(spec, decision)
    assert setting is not None and setting.flags == "--speculative-adaptive" and setting.file_name is None
    profile = with_setting(spec, setting, suffix=OWN_CONTROLLER)
    assert profile.name == spec.name + OWN_CONTROLLER and profile.argv.count("--speculative-adaptive") == 1
    assert profile.argv[:len(spec.argv)] == spec.argv  # its EAGLE settings kept
    users = engines.controller_setting(spec, decision.model_copy(update={"controller_config": {
        "candidate_steps": [1, 2, 4], "ema_alpha": 0.3}}))
    assert users is not None and users.content == {"candidate_steps": [1, 2, 4], "ema_alpha": 0.3}
    written = with_setting(spec, users, "/home/u/.specsweep/files/r-sglang-adaptive-controller.json", OWN_CONTROLLER)
    assert written.argv[-3:] == ["--speculative-adaptive", "--speculative-adaptive-config",
                                 "/home/u/.specsweep/files/r-sglang-adaptive-controller.json"]


def test_vllm_starts_adaptive_verification_or_the_users_per_batch_table_in_its_speculative_config() -> None:
    spec = vllm_speculative("/m", "draft_model", draft_model="/d", k=4, port=8001)
    setting = engines.controller_setting(spec, DecisionConfig(verify=True))
    assert setting is not None and setting.flags is not None
    cfg = json.loads(with_setting(spec, setting).argv[with_setting(spec, setting).argv.index("--speculative-config")
                                                        + 1])
    assert cfg["enable_adaptive_verification"] is True and cfg["num_speculative_tokens"] == 4
    table = engines.controller_setting(spec, DecisionConfig(verify=True, controller_config={
        "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 4096, 1]]}))
    assert table is not None and table.flags is not None and '"num_speculative_tokens_per_batch_size"' in table.flags
    assert "enable_adaptive_verification" not in table.flags
    with pytest.raises(ConfigError, match="decision.controller_config: .*num_speculative_tokens_per_batch_size"):
        engines.controller_setting(spec, DecisionConfig(verify=True, controller_config={
            "num_speculative_tokens_per_batch_size": {"1": 4}}))


def test_the_fourth_arm_is_left_out_where_the_engine_has_no_controller_and_refused_where_asked_for() -> None:
    llama = llama_speculative(model_path="/m/t.gguf", draft_model_path="/m/d.gguf")
    assert engines.controller_setting(llama, DecisionConfig(verify=True)) is None
    with pytest.raises(ConfigError, match="decision.verify_controller: llama.cpp has no speculation controller"):
        engines.controller_setting(llama, DecisionConfig(verify=True, verify_controller=True))
    topk = eagle3("/m", "/d", eagle_topk=4, num_draft_tokens=8, port=30001)
    assert engines.controller_setting(topk, DecisionConfig(verify=True)) is None
    with pytest.raises(ConfigError, match="topk 1 only"):
        engines.controller_setting(topk, DecisionConfig(verify=True, verify_controller=True))
    assert engines.controller_setting(eagle3("/m", "/d"), DecisionConfig(verify=True, verify_controller=False)) is None


def test_the_active_tier_is_read_only_from_a_server_running_the_controller() -> None:
    info = {"speculative_adaptive": True, "internal_states": [{"speculative_num_steps": 7}]}
    assert SGLANG.controller_tier(info) == 7
    assert SGLANG.controller_tier({"server_args": {"speculative_adaptive": True}, "internal_states": [
        {"speculative_num_steps": 3}]}) == 3
    assert SGLANG.controller_tier({"speculative_adaptive": False, "internal_states": [{"speculative_num_steps": 3}]}) is None
    figures = tier_figures([1, 1, 7, 7, 7, 3, 7, 7])
    assert figures["controller_tier_mean"] == 5.0
    assert json.loads(figures["controller_tiers"]) == {"1": 0.25, "3": 0.125, "7": 0.625}
    assert tier_figures([]) == {}


def test_a_per_batch_table_that_costs_at_the_lowest_level_is_reported_on_its_own() -> None:
    # vLLM's table at C=1 runs the same K as always-on, yet 14 % slower (vllm issue #49548's figure): the schedule's
    # own check there says falls short, and the cost is reported on its own, naming why.
    why = engines.get("vllm").per_batch_cost
    assert why is not None and "#49548" in why
    slow = {1: [129.0, 130, 128, 129.5] * 3, 16: [801.0, 799, 803, 800] * 3}
    v = verify_levels(rows("off", OFF), rows("on", ON), rows("schedule", slow), off_from=16, setting="--x",
                      decision=DecisionConfig(), num_requests=16, setting_cost=why)
    cost = v.setting_cost
    assert cost is not None and cost.concurrency == 1 and cost.verdict == "slower" and round(cost.ratio, 2) == 0.86
    assert cost.ratio_high is not None and cost.ratio_high < 0.9
    from specsweep.reports.markdown import verification_markdown
    assert "**The setting's own cost at C=1**" in "\n".join(verification_markdown(v))
    # An engine with no known cost (SGLang's file) gets none.
    assert engines.get("sglang").per_batch_cost is None
    assert verify_levels(rows("off", OFF), rows("on", ON), rows("schedule", slow), off_from=16, setting="--x",
                         decision=DecisionConfig(), num_requests=16).setting_cost is None


def test_a_level_stored_before_the_controller_columns_still_reads(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from specsweep.results.store import ResultsStore

    store = ResultsStore(tmp_path / "res")
    row = rows("x", {1: [100.0]})[0].model_copy(update={"controller_tier_mean": 3.0, "controller_tiers": '{"3": 1.0}'})
    store.write_level("old", row.level.key, row, [])
    (path,) = (tmp_path / "res" / "levels" / "run_id=old").glob("*.parquet")
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["controller_tier_mean", "controller_tiers"]), path)  # as an older version wrote
    assert "controller_tier_mean" not in pq.read_schema(path).names
    (back,) = store.level_rows("old")
    assert back.controller_tier_mean is None and back.controller_tiers is None and back.output_tokens_per_s == 100.0


def test_the_controller_arm_is_checked_by_the_engines_launch_rules_before_anything_runs() -> None:
    # A per-batch table as the controller under data parallelism: vLLM would drop it silently, so the arm would
    # measure a fixed K while claiming the table. Refused, naming the rule and the field.
    spec = vllm_speculative("/m", "eagle3", draft_model="/d", k=3, extra_args=["--data-parallel-size", "2"])
    table = DecisionConfig(verify=True, controller_config={
        "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 4096, 0]]})
    with pytest.raises(ConfigError, match=r"decision.controller_config \(vllm-eagle3-own-controller\) is refused: "
                                          r"\[per-batch-table-under-dp\]"):
        engines.check_controller(spec, table)
    # A table whose effective K never changes is warned about (it pays the table's graph cost for a fixed K).
    (finding,) = engines.check_controller(vllm_speculative("/m", "eagle3", draft_model="/d", k=3), DecisionConfig(
        verify=True, controller_config={"num_speculative_tokens_per_batch_size": [[1, 4096, 3]]}))
    assert finding.rule == "constant-table" and not finding.refused
    assert engines.check_controller(eagle3("/m", "/d"), DecisionConfig(verify=True)) == []
    assert engines.check_controller(spec, DecisionConfig(verify=True, verify_controller=False)) == []

