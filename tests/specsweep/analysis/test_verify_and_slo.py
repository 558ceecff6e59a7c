"""The recommendation as the engine starts it, the verify stage's judgement, and the service-level view."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specsweep import engines
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.slo import SLO, Request, slo_view
from specsweep.analysis.verify import verify_levels
from specsweep.engines.base import AS_RECOMMENDED, with_setting
from specsweep.engines.llamacpp import speculative as llama_speculative
from specsweep.engines.sglang import eagle3
from specsweep.engines.vllm import speculative as vllm_speculative
from specsweep.errors import ConfigError
from specsweep.hosts import LocalHost
from specsweep.records import BlockRow


def recommended(profile, off_from: int):  # type: ignore[no-untyped-def]
    spec = engines.speculation_of(profile.masked_command(), profile.engine)
    assert spec is not None
    k = spec.num_speculative_tokens
    return engines.per_batch_setting(spec, [(1, k), (off_from, 0)], k)


def test_vllm_starts_with_its_per_batch_schedule_in_place_of_its_speculative_config() -> None:
    profile = vllm_speculative("/m/target", "draft_model", draft_model="/m/draft", k=4, max_model_len=512)
    setting = recommended(profile, 8)
    started = with_setting(profile, setting)
    argv = started.argv
    assert started.name == profile.name + AS_RECOMMENDED
    assert argv.count("--speculative-config") == 1
    cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert cfg == {"method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 4,
                   "num_speculative_tokens_per_batch_size": [[1, 7, 4], [8, 4096, 0]]}
    assert argv[argv.index("--max-model-len") + 1] == "512" and argv[:3] == profile.argv[:3]  # the rest as it was


def test_sglang_loads_the_adaptive_file_from_where_it_was_written_its_eagle_flags_not_doubled() -> None:
    profile = eagle3("/m/kimi", "/m/eagle3", num_steps=3, simulate=True)
    setting = recommended(profile, 16)
    with pytest.raises(ConfigError, match="must be written on the host first"):
        with_setting(profile, setting)
    argv = with_setting(profile, setting, "/home/u/.specsweep/files/r-sglang-adaptive-config.json").argv
    assert argv[argv.index("--speculative-adaptive-config") + 1] == "/home/u/.specsweep/files/r-sglang-adaptive-config.json"
    for flag in ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-adaptive",
                 "--speculative-algorithm", "--speculative-draft-model-path"):
        assert argv.count(flag) == 1, flag
    assert argv[argv.index("--speculative-num-steps") + 1] == "3"


def test_llamacpp_has_no_per_batch_switch_and_runs_its_setting_behind_the_router(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestration.verify import route_profile
    from specsweep.engines.base import Engine

    profile = llama_speculative(model_path="/m/t.gguf", draft_model_path="/m/d.gguf")
    setting = recommended(profile, 8)
    assert setting.route_off_from == 8 and setting.flags is None and "--off-from 8" in " ".join(setting.notes)
    with pytest.raises(ConfigError, match="llamacpp has no per-batch speculation switch"):
        with_setting(profile, setting)
    for name in ("llamacpp", "sglang", "vllm"):  # each can run its recommendation: itself, or behind the router
        engines.check_verifiable(name, "--verify")
    base = profile.model_copy(update={"port": 9001})
    routed = route_profile(base, profile.model_copy(update={"port": 9002}), 8, "/usr/bin/python3", 9003)
    assert routed.argv == ["/usr/bin/python3", "-m", "specsweep.route", "--host", "{host}", "--port", "{port}",
                           "--speculative", "http://127.0.0.1:9002", "--baseline", "http://127.0.0.1:9001",
                           "--off-from", "8"]
    assert routed.port == 9003 and routed.name.endswith(AS_RECOMMENDED) and routed.env == {}

    class NoSwitch(Engine):  # an engine that can run a recommendation neither itself nor behind the router
        name, label = "noswitch", "No Switch"
        no_per_batch_switch = "it has none."

    monkeypatch.setitem(engines.ENGINES, "noswitch", NoSwitch())
    with pytest.raises(ConfigError, match="--verify: it has none. Leave verify off for No Switch"):
        engines.check_verifiable("noswitch", "--verify")


def test_a_file_written_for_a_server_is_private_and_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    host = LocalHost()
    path = host.write_private_file("run-1-sglang-adaptive-config.json", b'{"1": {"candidate_steps": [3]}}')
    assert path == f"{tmp_path}/.specsweep/files/run-1-sglang-adaptive-config.json"
    assert Path(path).read_bytes() == b'{"1": {"candidate_steps": [3]}}'
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(Path(path).parent).st_mode & 0o777 == 0o700
    assert [p.name for p in Path(path).parent.iterdir()] == [Path(path).name]  # no temporary file left
    with pytest.raises(ValueError, match="file name '../x'"):
        host.write_private_file("../x", b"")


def rows(name: str, blocks: dict[int, list[float]]) -> list[BlockRow]:
    return [BlockRow(config_name=name, level_index=i, mode="concurrency", concurrency=c, repeat=rep,
                     output_tokens_per_s=t, requests=16, completed=16, duration_s=2.0)
            for i, (c, tps) in enumerate(blocks.items()) for rep, t in enumerate(tps)]


def twelve(values: list[float]) -> list[float]:
    """Twelve rounds from four: the distribution-free intervals (issue 43) need a dozen rounds to be bounded."""
    return values * 3


OFF = {1: twelve([100, 101, 99, 100.5]), 16: twelve([800, 805, 795, 802])}
ON = {1: twelve([150, 151, 149, 150.5]), 16: twelve([440, 445, 438, 442])}


def verify(schedule: dict[int, list[float]]):  # type: ignore[no-untyped-def]
    return verify_levels(rows("off", OFF), rows("on", ON), rows("schedule", schedule), off_from=16, setting="--x",
                         decision=DecisionConfig(), num_requests=16)


def test_a_schedule_that_matches_the_better_fixed_policy_everywhere_is_verified() -> None:
    v = verify({1: twelve([149, 150, 150, 151]), 16: twelve([801, 799, 803, 800])})
    assert v.status == "verified" and [lv.better_fixed for lv in v.levels] == ["on", "off"]
    assert [lv.speculates for lv in v.levels] == [True, False]
    assert v.summary.startswith("Verified") and "16: ×1.00 of always off (reaches)" in v.summary


def test_a_schedule_that_falls_short_where_it_should_be_off_fails() -> None:
    v = verify({1: twelve([149, 150, 150, 151]), 16: twelve([450, 452, 449, 451])})  # still speculating at 16
    assert v.status == "failed" and v.levels[1].result == "falls short" and v.levels[0].result == "reaches"


def test_a_noisy_schedule_is_undetermined_not_a_pass() -> None:
    v = verify({1: twelve([149, 150, 150, 151]), 16: twelve([600, 1000, 700, 900])})
    assert v.status == "undetermined" and v.levels[1].result == "undetermined"


def reqs(ttfts: list[float], tpot: float, tokens: int = 100, failed: int = 0) -> list[Request]:
    return [Request(ttft_ms=t, tpot_ms=tpot, output_tokens=tokens, ok=True) for t in ttfts] + [
        Request(ttft_ms=None, tpot_ms=None, output_tokens=0, ok=False)] * failed


def test_capacity_is_the_highest_level_up_to_which_every_level_meets_the_targets() -> None:
    slo = SLO(ttft_p99_ms=200, tpot_p99_ms=20)
    base = {1: (reqs([50] * 20, 10), 10.0), 4: (reqs([90] * 20, 12), 10.0), 16: (reqs([150] * 19 + [400], 15), 10.0)}
    spec = {1: (reqs([40] * 20, 7), 10.0), 4: (reqs([80] * 20, 25), 10.0), 16: (reqs([100] * 20, 30), 10.0)}
    view = slo_view(slo, base, spec)
    assert view.baseline_capacity == 4 and view.speculative_capacity == 1
    assert "speculation lowers the capacity" in view.summary and "TTFT p99 ≤ 200 ms and TPOT p99 ≤ 20 ms" in view.summary
    by_c = {lv.concurrency: lv for lv in view.levels}
    assert by_c[16].baseline.within == 19 and by_c[16].baseline.goodput_tokens_per_s == pytest.approx(190.0)
    assert by_c[4].speculative.goodput_tokens_per_s == 0.0 and not by_c[4].speculative.meets
    failing = slo_view(slo, {1: (reqs([50] * 9, 10, failed=1), 10.0)}, {1: (reqs([50] * 10, 10), 10.0)})
    assert not failing.levels[0].baseline.meets and failing.baseline_capacity is None
    assert "not even 1" in failing.summary


def test_targets_need_at_least_one_number() -> None:
    with pytest.raises(ValueError, match="give ttft_p99_ms, tpot_p99_ms or both"):
        SLO()
