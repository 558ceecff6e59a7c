"""Tokens per second of the local llama.cpp presets at concurrency 1 and 8, and the draft acceptance rate.

    .venv/bin/python benchmarks/llamacpp.py [--requests 16] [--output-len 128]

Starts each preset through the same lifecycle code the flows use (kill → start → wait),
measures it with the load generator (closed loop, greedy, ignore_eos), then kills it.
Nothing else should run on the machine: llama.cpp's threads busy-wait.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specsweep.bench.config import SweepConfig, WorkloadConfig  # noqa: E402
from specsweep.engines.llamacpp import baseline as baseline_profile  # noqa: E402
from specsweep.engines.llamacpp import speculative as speculative_profile  # noqa: E402
from specsweep.hosts import LocalHost  # noqa: E402
from specsweep.results import DEFAULT_ROOT, ResultsStore, new_run_id  # noqa: E402
from specsweep.server.api import ServerAPI  # noqa: E402
from specsweep.server.health import wait_for_health  # noqa: E402
from specsweep.server.lifecycle import kill_server, start_server  # noqa: E402
from specsweep.sweep import BenchTarget, SweepJob, measure_level, repeats, run_levels, sweep_levels  # noqa: E402


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=16, help="prompt tokens (prefill is slow on this CPU)")
    args = ap.parse_args()
    host = LocalHost()
    table = []
    for profile in (baseline_profile(port=18480), speculative_profile(port=18480)):
        kill_server(host, profile)
        handle = start_server(host, profile)
        try:
            target = BenchTarget(base_url=f"http://127.0.0.1:{profile.port}", engine=profile.engine)
            async with ServerAPI(target.base_url) as api:
                ready = await wait_for_health(host, profile, handle, api)
            job = SweepJob(run_id=new_run_id(profile.name), config_name=profile.name, store=ResultsStore(DEFAULT_ROOT),
                           workload=WorkloadConfig(input_len=args.input_len, output_len=args.output_len),
                           sweep=SweepConfig(concurrency=[1, 8], num_requests=args.requests, warmup_requests=2,
                                             repeats=args.repeats))
            rows = await run_levels(sweep_levels(job.sweep), functools.partial(measure_level, target, job),
                                    more=repeats(job.sweep.repeats))
        finally:
            kill_server(host, profile, handle)
        for r in rows:
            table.append((profile.name, r.concurrency, r.output_tokens_per_s, r.ttft_ms_median, r.tpot_ms_median,
                          r.spec_acceptance_rate, ready.time_to_ready_s))
    print(f"{'preset':<22} {'C':>3} {'output tok/s':>13} {'TTFT p50 ms':>12} {'TPOT p50 ms':>11} {'acceptance':>11} "
          f"{'ready s':>8}")
    for name, c, tps, ttft, itl, acc, ready_s in table:
        acc_s = f"{acc:.0%}" if acc is not None else "-"
        print(f"{name:<22} {c:>3} {tps:>13.1f} {ttft:>12.1f} {itl:>11.2f} {acc_s:>11} {ready_s:>8.2f}")
    print(f"(median of {args.repeats} repeats of {args.requests} requests, {args.output_len}-token outputs, "
          f"{args.input_len}-token prompts)")


if __name__ == "__main__":
    asyncio.run(main())
