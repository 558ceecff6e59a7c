"""The answer decided and proven, on the simulator under a real Prefect server: a profile where speculation
always pays is "keep it on", one where it never does is "turn it off", a block the engine stalls is set
aside (kept in Parquet with its reason) and measured again, and the verify stage runs the recommended
SGLang adaptive file on the engine against always on and always off."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from flows.compare_speculation import compare_speculation
from specsweep.analysis.decision import DecisionConfig
from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.engines.sglang import baseline as sglang_baseline
from specsweep.engines.sglang import eagle3 as sglang_eagle3
from specsweep.errors import ConfigError
from specsweep.parameters import BenchmarkSettings, LifecycleConfig
from specsweep.profiles import ServerProfile
from specsweep.results.store import ResultsStore
from tests.conftest import pids_with_marker
from tests.helpers.logs import flow_logs
from tests.helpers.sshd import free_port

pytestmark = pytest.mark.usefixtures("prefect_harness")

IN_TURN = DecisionConfig(design="alternate", alternate_by="side-by-side", max_requests_per_level=96)


def sim_pair(port: int, sim_profile: str, *extra: str) -> tuple[ServerProfile, ServerProfile]:
    common = dict(port=port, host="127.0.0.1", simulate=True, sim_profile=sim_profile, sim_startup_s=0.3, tp=8)
    base = sglang_baseline("/models/kimi", extra_args=list(extra), **common)  # type: ignore[arg-type]
    spec = sglang_eagle3("/models/kimi", "/models/eagle3", extra_args=list(extra), **common)  # type: ignore[arg-type]
    return base, spec


def settings(results: Path, levels: list[int], num_requests: int = 12) -> BenchmarkSettings:
    return BenchmarkSettings(workload=WorkloadConfig(input_len=16, output_len=32), results=str(results),
                             sweep=SweepConfig(concurrency=levels, num_requests=num_requests, warmup_requests=1,
                                               requests_per_slot=2))


# Alone on the machine (scripts/test.sh's second phase): blocks of 0.6 s, which four tests at once on two cores
# stretched so unevenly that C=1 of tiny-pays stayed undetermined at x3.25 after 240 requests once.
@pytest.mark.solo
@pytest.mark.parametrize(("sim_profile", "off_from", "words"), [
    ("tiny-pays", None, "Keep it on."),
    ("tiny-never", 1, "Turn it off."),
])
async def test_without_a_crossover_the_answer_is_decided_always_or_never(
        sim_profile: str, off_from: int | None, words: str, tmp_path: Path) -> None:
    port = free_port(span=2)
    base, spec = sim_pair(port, sim_profile)
    # A budget that lets the machine's noise settle (four tests at once on two cores left C=8 at x1.42 undetermined
    # after 96 requests once); a quiet machine decides within the first blocks.
    state = await compare_speculation(base, spec, benchmark=settings(tmp_path / "results", [1, 8]),
                                      decision=IN_TURN.model_copy(update={"max_requests_per_level": 240}),
                                      return_state=True)
    rec = (await state.result()).comparison.recommendation
    assert rec.status == "decided" and rec.speculation_off_from == off_from and words in rec.reason, rec.reason
    assert pids_with_marker(port) == [] and pids_with_marker(port + 1) == []


async def test_a_block_the_engine_stalls_is_set_aside_kept_and_measured_again(tmp_path: Path) -> None:
    # The speculative engine stalls once for 1.5 s as its 24th request arrives: the 6th measured request of its
    # second block (a start's 4 warm-up requests, then blocks of 1 warm-up and 12 measured). The start's warm-up is
    # held at 4: until its TTFT settles it took 16 once on the loaded suite, and the stall fell on a block's warm-up.
    port = free_port(span=2)
    base, _ = sim_pair(port, "tiny-fast")
    _, spec = sim_pair(port, "tiny-fast", "--fault-engine-stall-after", "24", "--fault-engine-stall-s", "1.5")
    results = tmp_path / "results"
    benchmark = settings(results, [1]).model_copy(update={"stages": LifecycleConfig(warm_up_requests=4)})
    state = await compare_speculation(base, spec, benchmark=benchmark, return_state=True,
                                      decision=IN_TURN.model_copy(update={"min_blocks": 3}))
    comp = (await state.result()).comparison
    lv = comp.levels[0]
    # The stalled block and the baseline's block of the same round (and any other round the loaded machine
    # disturbed: the suite runs four tests at once on two cores).
    assert lv.set_aside[0] == lv.set_aside[1] >= 1, lv
    assert lv.verdict == "faster" and lv.ratio_low is not None and lv.ratio_low > 1.0  # the interval stays useful
    levels = pd.read_parquet(results / "levels")
    aside = levels[levels["disturbed"].notna()]
    assert len(aside) == sum(lv.set_aside) and len(levels) == sum(lv.blocks) + sum(lv.set_aside)  # nothing lost
    # The stalled block is seen as the stall, or, where the loaded machine's client lagged as long in the same block
    # (the lag then explains the gap), by its round's ratio (x0.1 against about x1.7).
    spec_aside = aside[aside["config_name"] == "sglang-eagle3"]
    stall = ("no token arrived for ", "the ratio of its round")  # the gap: the 1.5 s stall and whatever lag joined it
    stalled = spec_aside[spec_aside["disturbed"].str.startswith(stall)]
    assert len(stalled), list(spec_aside["disturbed"])
    # Its round's baseline block goes with it: marked as measured beside the stall, set aside by the round's ratio,
    # or (the loaded machine's client lagged in it, once) for its own reason. Other rounds' blocks may be set aside
    # for their own reasons too.
    base_aside = aside[aside["config_name"] != "sglang-eagle3"]
    assert set(stalled["repeat"]) <= set(base_aside["repeat"]), list(aside[["config_name", "repeat", "disturbed"]]
                                                                     .itertuples(index=False))
    assert any("Blocks set aside as disturbed" in n for n in comp.notes)
    logs = "\n".join(await flow_logs(state.state_details.flow_run_id))
    assert re.search(r"sglang-eagle3 C=1 #\d+: set aside, measured again \((no token arrived for \d|the ratio of "
                     "its round)", logs), logs


# Alone on the machine (scripts/test.sh's second phase): "reaches" needs the three arms' ratio known within the 3 %
# margin, which four tests at once on two cores blur past any budget (x1.06 and x1.00 stayed undetermined after 240
# requests a level).
@pytest.mark.solo
async def test_verify_runs_the_recommended_adaptive_file_against_both_fixed_policies(tmp_path: Path) -> None:
    port = free_port(span=3)  # three servers side by side
    base, spec = sim_pair(port, "tiny-fast")
    results = tmp_path / "results"
    state = await compare_speculation(base, spec, benchmark=settings(results, [1, 16]), return_state=True,
                                      decision=IN_TURN.model_copy(update={"verify": True, "min_blocks": 3,
                                                                              "max_requests_per_level": 240}))
    comp = (await state.result()).comparison
    assert comp.recommendation.speculation_off_from == 16
    v = comp.verification
    assert v is not None and v.status == "verified", v
    # The engine took the file: with it, C=16 runs at the baseline's speed, far ahead of always-on (x0.55 there),
    # and C=1 at always-on's, ahead of the baseline.
    by_c = {lv.concurrency: lv for lv in v.levels}
    assert by_c[16].better_fixed == "off" and by_c[16].schedule_tokens_per_s > 1.4 * by_c[16].on_tokens_per_s
    assert by_c[1].better_fixed == "on" and by_c[1].schedule_tokens_per_s > 1.2 * by_c[1].off_tokens_per_s
    assert [lv.speculates for lv in v.levels] == [True, False] and all(lv.blocks >= 3 for lv in v.levels)
    assert "--speculative-adaptive-config" in v.setting and f"{Path.home()}/.specsweep/files/" in v.setting
    written = Path(v.setting.split("--speculative-adaptive-config ")[1].split()[0])
    assert json.loads(written.read_text()) == {"1": {"candidate_steps": [3]}, "2": {"candidate_steps": [0]}}
    assert written.stat().st_mode & 0o077 == 0  # the user's alone

    store = ResultsStore(results)
    runs = store.runs().set_index("run_id")
    assert sorted(runs["verify_arm"].dropna()) == ["off", "on", "schedule"]
    assert set(runs["verifies"].dropna()) == {f"{comp.baseline_run_id}--{comp.speculative_run_id}"}
    assert set(runs["status"]) == {"completed"}
    folder = results / "reports" / f"{comp.baseline_run_id}--{comp.speculative_run_id}"
    rec = json.loads((folder / "recommendation.json").read_text())
    assert rec["verified"]["status"] == "verified" and [x["result"] for x in rec["verified"]["levels"]] == [
        "reaches", "reaches"]
    report = (folder / "report.md").read_text()
    assert "### Verified?" in report and "Verified: run by the engine" in report
    assert all(pids_with_marker(p) == [] for p in (port, port + 1, port + 2))


async def test_verify_is_refused_before_anything_runs_where_the_engine_has_no_per_batch_switch(tmp_path: Path) -> None:
    from specsweep.engines.llamacpp import baseline as llama_baseline
    from specsweep.engines.llamacpp import speculative as llama_speculative

    base = llama_baseline(model_path="/nowhere/t.gguf")
    spec = llama_speculative(model_path="/nowhere/t.gguf", draft_model_path="/nowhere/d.gguf")
    with pytest.raises(ConfigError, match="decision.verify: llama.cpp cannot take a per-batch schedule"):
        await compare_speculation(base, spec, benchmark=settings(tmp_path / "results", [1]),
                                  decision=IN_TURN.model_copy(update={"verify": True}))
    assert not (tmp_path / "results").exists()
