"""Prefect's overhead on a comparison: the flow's wall time minus the time spent inside its stages.

    .venv/bin/python benchmarks/prefect_overhead.py

Runs compare-engine with SGLang's settings against the simulator (tiny-fast profile; a few seconds of
work per stage), then reads the flow run and its task runs back from Prefect's API.
Without a configured server Prefect starts a temporary one (its start-up is not counted).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prefect.client.orchestration import get_client  # noqa: E402
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId  # noqa: E402

from flows.compare_speculation import compare_engine  # noqa: E402
from specsweep.analysis.decision import DecisionConfig  # noqa: E402
from specsweep.bench.config import SweepConfig, WorkloadConfig  # noqa: E402
from specsweep.engines.sglang import SGLangSettings  # noqa: E402
from specsweep.parameters import BenchmarkSettings  # noqa: E402


async def main() -> None:
    settings = SGLangSettings(model_path="/models/kimi", draft_model_path="/models/eagle3", port=18630,
                              bind_host="127.0.0.1", simulate=True, sim_profile="tiny-fast", python=sys.executable)
    results = tempfile.mkdtemp(prefix="specsweep-overhead-")
    t0 = time.monotonic()
    benchmark = BenchmarkSettings(workload=WorkloadConfig(input_len=16, output_len=64), results=results,
                                  sweep=SweepConfig(concurrency=[1, 4, 16], num_requests=24, repeats=2))
    state = await compare_engine(settings=settings, benchmark=benchmark, decision=DecisionConfig(), return_state=True)
    wall = time.monotonic() - t0
    flow_run_id = state.state_details.flow_run_id
    assert flow_run_id is not None
    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    inside = sum(t.total_run_time.total_seconds() for t in tasks)
    by_name: dict[str, float] = {}
    for t in tasks:
        key = t.name.split(" ")[0].rsplit("-", 1)[0]
        by_name[key] = by_name.get(key, 0.0) + t.total_run_time.total_seconds()
    flow_s = run.total_run_time.total_seconds()
    print(f"flow run {run.name}: {state.name}; {len(tasks)} task runs")
    print(f"flow run time (Prefect): {flow_s:.2f} s; wall time of the call: {wall:.2f} s")
    print(f"time inside the stages: {inside:.2f} s  ({', '.join(f'{k} {v:.2f} s' for k, v in sorted(by_name.items()))})")
    print(f"Prefect overhead: {flow_s - inside:.2f} s in the flow run ({(flow_s - inside) / len(tasks) * 1000:.0f} ms per "
          f"task run), {wall - inside:.2f} s counting the call's own start and finish")


if __name__ == "__main__":
    asyncio.run(main())
