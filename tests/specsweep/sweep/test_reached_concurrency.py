"""A block must hold its level: the GPU default once sent 32 requests per block up to C=64, so C=64 never had 64 in
flight, yet was labelled as if it had. Blocks now hold at least C x requests_per_slot (2 by default), and a block
that never reached its concurrency is flagged, in its row, the summary table and the comparison's notes."""

from __future__ import annotations

from pathlib import Path

from specsweep.analysis.compare import never_reached
from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.parameters import GPU_BENCHMARK
from specsweep.records import Block
from specsweep.reports.tables import summary_rows
from specsweep.results.store import ResultsStore
from specsweep.sweep import BenchTarget, SweepJob, measure_level
from tests.helpers.sim import running_sim


async def test_a_block_too_small_for_its_level_is_flagged_and_the_default_holds_it(tmp_path: Path) -> None:
    assert GPU_BENCHMARK.sweep.for_level("concurrency", 64).num_requests == 128  # 64 x 2, not the 32 it sent
    store = ResultsStore(tmp_path / "results")
    workload = WorkloadConfig(input_len=16, output_len=16)
    with running_sim("--sim-profile", "tiny-fast") as (url, _):
        target = BenchTarget(base_url=url, engine="sglang")

        async def block(sweep: SweepConfig, run_id: str):  # type: ignore[no-untyped-def]
            job = SweepJob(run_id=run_id, config_name=run_id, store=store, workload=workload, sweep=sweep)
            return await measure_level(target, job, Block(index=0, mode="concurrency", value=64))

        short = await block(SweepConfig(num_requests=32, requests_per_slot=0, warmup_requests=0), "short")
        held = await block(SweepConfig(num_requests=32, warmup_requests=0), "held")
    assert short.completed == 32 and short.reached_concurrency is False and short.steady_output_tokens_per_s is None
    assert held.completed == 128 and held.reached_concurrency is True and held.steady_output_tokens_per_s is not None
    assert summary_rows([short])[0][0].endswith("(never reached)") and "never" not in summary_rows([held])[0][0]
    assert never_reached([short], [held]) == ["C=64"] and never_reached([held], [held]) == []
    assert store.level_rows("short")[0].reached_concurrency is False  # kept in the levels dataset
