"""Traffic that shifts: phases of one category of a real prompt set, then another (high acceptance, then low),
each request row recording its phase; against the simulator's model of SGLang's adaptive controller."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.bench.workload import Prompt, build_prompts
from specsweep.errors import ConfigError
from specsweep.records import Block, RequestRow, arrow_schema
from specsweep.results.store import ResultsStore
from specsweep.sweep import BenchTarget, SweepJob, measure_level
from tests.helpers.sim import running_sim

SHIFT = WorkloadConfig(source="mt-bench", phases=["coding", "roleplay"], phase_requests=8, output_len=128)
#: MT-Bench's coding questions ask for programs and functions; its role-play ones never do.
CODE = r"(?i)program|function|implement|website|binary tree|sorted lists"


async def test_phases_take_each_category_in_turn_and_number_the_phases() -> None:
    prompts = await build_prompts(SHIFT, 40)
    assert [p.category for p in prompts] == (["coding"] * 8 + ["roleplay"] * 8) * 2 + ["coding"] * 8
    assert [p.phase for p in prompts] == [i // 8 for i in range(40)]
    assert len({p.text for p in prompts[:8]}) == 8  # a phase's prompts differ (10 coding questions in the set)
    mixed = await build_prompts(WorkloadConfig(source="mt-bench"), 16)
    assert all(p.phase is None for p in mixed) and len({p.category for p in mixed}) == 8


async def test_a_phase_the_set_lacks_and_phases_of_synthetic_text_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"workload.phases names \['poetry'\].*'coding'"):
        await build_prompts(WorkloadConfig(source="mt-bench", phases=["coding", "poetry"]), 8)
    with pytest.raises(ValidationError, match="phases name categories of a prompt set"):
        WorkloadConfig(phases=["a", "b"])


def test_a_client_of_before_phases_sends_prompts_without_one() -> None:
    old = ["text", 3, True, None, "coding", None, None]
    assert Prompt.from_wire(old).phase is None
    p = Prompt("t", 1, True, None, "coding", None, None, 2)
    assert Prompt.from_wire(p.to_wire()) == p


async def test_the_controller_follows_the_phases_and_each_row_records_its_phase(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    job = SweepJob(run_id="shift", config_name="shift", store=store, workload=SHIFT,
                   sweep=SweepConfig(concurrency=[4], num_requests=32, warmup_requests=2))
    tiers: list[int] = []
    stop = threading.Event()

    def watch(url: str) -> None:  # the active tier, as an engineer would sample it from /server_info
        while not stop.is_set():
            tiers.append(httpx.get(url + "/server_info").json()["internal_states"][0]["speculative_num_steps"])
            time.sleep(0.01)

    with running_sim("--sim-profile", "tiny-fast", "--speculative-algorithm", "EAGLE3", "--speculative-adaptive",
                     "--sim-accept-rule", f"{CODE}=3.8", "--sim-accept-rule", ".=1.2") as (url, _):
        watcher = threading.Thread(target=watch, args=(url,))
        watcher.start()
        try:
            row = await measure_level(BenchTarget(base_url=url, engine="sglang"), job,
                                      Block(index=0, mode="concurrency", value=4))
        finally:
            stop.set()
            watcher.join()
    assert row.completed == 32
    # The depth it drafted at, over the level's steps: between its lowest tier and its highest (both were used).
    assert row.spec_drafted_per_step is not None and 1 < row.spec_drafted_per_step < 7
    measured = store.requests(["shift"]).query("not warmup").sort_values("prompt_index")
    assert measured["phase"].tolist() == [i // 8 for i in range(32)]
    assert measured["category"].tolist() == (["coding"] * 8 + ["roleplay"] * 8) * 2
    # Code took it up to 7 drafts, role-play down to 1, and back: each shift seen while the level ran.
    changes = [t for i, t in enumerate(tiers) if i == 0 or t != tiers[i - 1]]
    assert {1, 7} <= set(changes) and changes.count(7) >= 2, changes


def test_requests_stored_before_phases_read_with_new_ones(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    row = RequestRow(index=0, mode="concurrency", level_value=1, repeat=0, scheduled_s=0.0, category="coding", phase=3)
    store.write_level("new", "L000", *_level_and([row]))
    old_schema = arrow_schema(RequestRow)
    old_schema = old_schema.remove(old_schema.get_field_index("phase"))
    old = {k: v for k, v in row.to_record().items() if k != "phase"}
    path = tmp_path / "results" / "requests" / "run_id=old" / "L000.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([old], schema=old_schema), path)
    both = store.requests(["old", "new"])
    assert both["phase"].isna().tolist() == [True, False] and both["phase"].iloc[1] == 3


def _level_and(requests: list[RequestRow]) -> tuple:  # type: ignore[type-arg]
    from specsweep.records import BlockRow

    return BlockRow(config_name="x", level_index=0, mode="concurrency", concurrency=1), requests


async def test_the_report_shows_each_phase_and_the_controllers_depth_changing_within_it(tmp_path: Path) -> None:
    """A comparison of the baseline and the simulator's adaptive controller on code / role-play phases: the report's
    phases table has every phase, and the controller drafts differently in a phase's first half than in its second
    (it is still at the last phase's depth when a phase opens: deeper as role-play opens, shallower as code does)."""
    from specsweep.analysis.compare import compare_runs
    from specsweep.analysis.decision import DecisionConfig
    from specsweep.records import RunRow
    from specsweep.reports.folders import write_comparison_report

    store = ResultsStore(tmp_path / "res")
    adaptive = ("--speculative-algorithm", "EAGLE3", "--speculative-adaptive", "--sim-accept-rule", f"{CODE}=3.8",
                "--sim-accept-rule", ".=1.2")
    for run_id, name, flags in (("base", "sim-baseline", ()), ("adaptive", "sim-adaptive", adaptive)):
        store.write_run(run_id, RunRow(config_name=name, engine="sglang", status="completed",
                                       decision_json=DecisionConfig().model_dump_json()))
        job = SweepJob(run_id=run_id, config_name=name, store=store, workload=SHIFT,
                       sweep=SweepConfig(concurrency=[4], num_requests=32, warmup_requests=1))
        with running_sim("--sim-profile", "tiny-fast", *flags) as (url, _):
            for repeat in range(2):
                await measure_level(BenchTarget(base_url=url, engine="sglang"), job,
                                    Block(index=0, mode="concurrency", value=4, repeat=repeat))
    write_comparison_report(compare_runs(store, "base", "adaptive"), store)
    report = (tmp_path / "res" / "reports" / "base--adaptive" / "report.md").read_text()
    assert "### Traffic that shifts (phases)" in report
    phases = report.split("### Traffic that shifts (phases)")[1]
    lines = [ln for ln in phases.splitlines() if ln.startswith("| 4 |")]
    assert [ln.split(" | ")[1:3] for ln in lines] == [["0", "coding"], ["1", "roleplay"], ["2", "coding"],
                                                      ["3", "roleplay"]]
    halves = [[float(x) for x in ln.split(" | ")[6].split(" -> ")] for ln in lines]
    # Code: it opens shallower than it ends (climbing to 7); role-play: it opens deeper (falling to 1).
    assert [first < second for first, second in halves] == [True, False, True, False], halves
