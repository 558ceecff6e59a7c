"""GPU energy per output token and per accepted draft token, from the power the fake nvidia-smi on PATH reports
(this machine has no GPU) while levels run against the real simulator, and in the comparison's report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specsweep.analysis.decision import DecisionConfig
from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.hosts import LocalHost
from specsweep.metrics import energy_figures
from specsweep.records import Block, BlockRow, RequestRecord, RunRow
from specsweep.results.store import ResultsStore
from specsweep.server.gpus import GpuWatch
from specsweep.sweep import BenchTarget, SweepJob, measure_level
from tests.helpers.sim import running_sim

#: specsweep's own query as nvidia-smi answers it: two GPUs drawing 412.35 W and 71.20 W, one without a reading.
ROWS = """index, uuid, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W]
0, GPU-107f0d10-2c02-7c73-7b9f-680acd29b484, 87, 71324, 81559, 412.35
1, GPU-8c958eaa-b244-64cb-6283-d37792aac963, 91, 70110, 81559, [N/A]
2, GPU-5f0c7d2e-91a4-3b6f-8e2d-4c1a9b7e6d50, 3, 1024, 81559, 71.20
"""
WATTS = 412.35 + 71.20


def test_energy_by_hand() -> None:
    row = BlockRow(config_name="s", level_index=0, mode="concurrency", concurrency=2, duration_s=2.0,
                   output_tokens_total=400, gpu_power_mean_w=500.0, spec_accepted_tokens=999.0)
    said = [RequestRecord(index=i, scheduled_s=0.0, spec_accepted_tokens=100) for i in range(2)]
    assert energy_figures(row, said) == {"gpu_energy_j": 1000.0, "joules_per_output_token": 2.5,
                                         "joules_per_accepted_token": 5.0}  # the requests' own 200, not 999
    assert energy_figures(row, [])["joules_per_accepted_token"] == 1000.0 / 999.0  # else the counters'
    no_power = energy_figures(row.model_copy(update={"gpu_power_mean_w": None}), said)
    assert set(no_power.values()) == {None}


async def test_energy_per_level_and_in_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specsweep.analysis.compare import compare_runs
    from specsweep.reports.folders import write_comparison_report

    rows = tmp_path / "rows.csv"
    rows.write_text(ROWS)
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(f"#!/bin/sh\ncat {rows}\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    store = ResultsStore(tmp_path / "res")
    configs = {"base": ("sglang-baseline", ()), "spec": ("sglang-eagle3", ("--speculative-algorithm", "EAGLE3"))}
    measured: dict[str, list[BlockRow]] = {}
    for run_id, (name, flags) in configs.items():
        store.write_run(run_id, RunRow(config_name=name, engine="sglang", status="completed",
                                       decision_json=DecisionConfig().model_dump_json()))
        job = SweepJob(run_id=run_id, config_name=name, store=store, workload=WorkloadConfig(input_len=16, output_len=64),
                       sweep=SweepConfig(concurrency=[1], num_requests=12, warmup_requests=1))
        with running_sim("--sim-profile", "tiny-fast", *flags) as (url, _):
            measured[run_id] = [await measure_level(BenchTarget(base_url=url, engine="sglang"), job,
                                                    Block(index=0, mode="concurrency", value=1, repeat=r),
                                                    gpus=GpuWatch(LocalHost(), interval_s=0.05)) for r in range(2)]
    for row in measured["base"] + measured["spec"]:
        assert row.gpu_power_mean_w == pytest.approx(WATTS)
        assert row.gpu_energy_j == pytest.approx(WATTS * row.duration_s, abs=1e-3)
        assert row.joules_per_output_token == pytest.approx(row.gpu_energy_j / row.output_tokens_total, rel=1e-4)
    assert all(r.joules_per_accepted_token is None for r in measured["base"])  # nothing drafted
    for row in measured["spec"]:  # per accepted draft token: more than per output token (not every token is one)
        assert row.joules_per_accepted_token is not None
        assert row.joules_per_accepted_token > row.joules_per_output_token
    # One stream on tiny-fast: speculation is faster at the same power, so it spends less energy per token.
    assert max(r.joules_per_output_token or 0 for r in measured["spec"]) < min(
        r.joules_per_output_token or 0 for r in measured["base"])

    write_comparison_report(compare_runs(store, "base", "spec"), store)
    folder = tmp_path / "res" / "reports" / "base--spec"
    (energy,) = json.loads((folder / "recommendation.json").read_text())["energy"]
    assert energy["concurrency"] == 1 and energy["speculative_j_per_token"] < energy["baseline_j_per_token"]
    report = (folder / "report.md").read_text()
    assert "### Energy (GPU)" in report and "| concurrency | baseline J/token | speculative J/token" in report
