"""Does the simulator reproduce the published Kimi-K2.5 figures within 5 %?

    .venv/bin/python benchmarks/sim_calibration.py [--requests 24]

Starts the simulator (published profile) as SGLang baseline and as EAGLE-3, sweeps
concurrency with the load generator, and prints measured against published:
baseline 92.6 tok/s single stream and ~773 saturated; EAGLE-3 96.1 single stream and
~340-354 saturated (C >= 70); baseline ahead at every concurrency above 1.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specsweep.bench.config import SweepConfig, WorkloadConfig  # noqa: E402
from specsweep.records import Block  # noqa: E402
from specsweep.results import DEFAULT_ROOT, ResultsStore, new_run_id  # noqa: E402
from specsweep.sweep import BenchTarget, SweepJob, measure_level  # noqa: E402

LEVELS = [1, 2, 4, 8, 16, 32, 64, 80, 128]
PUBLISHED = {("baseline", 1): 92.6, ("baseline", 128): 773.0, ("eagle3", 1): 96.1, ("eagle3", 80): 347.0,
             ("eagle3", 128): 347.0}


async def sweep(spec: bool, requests: int, port: int) -> dict[int, float]:
    argv = [sys.executable, "-m", "specsweep.targets.sim", "--port", str(port), "--startup-s", "0.3", "--tp", "8"]
    if spec:
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "eagle3"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        out = {}
        run_id = new_run_id("sim-calibration")
        for i, c in enumerate(LEVELS):
            # Enough requests for a steady state at each level: several rounds of the batch.
            n = max(requests, 3 * c)
            job = SweepJob(run_id=run_id, config_name="sim-eagle3" if spec else "sim-baseline", store=ResultsStore(DEFAULT_ROOT),
                           workload=WorkloadConfig(input_len=128, output_len=64),
                           sweep=SweepConfig(num_requests=n, warmup_requests=min(c, 16)))
            row = await measure_level(BenchTarget(base_url=f"http://127.0.0.1:{port}", engine="sglang"), job,
                                      Block(index=i, mode="concurrency", value=c))
            out[c] = row.output_tokens_per_s
        return out
    finally:
        proc.terminate()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=24, help="at least this many requests per level (3 x C above)")
    args = ap.parse_args()
    base = await sweep(False, args.requests, 18520)
    spec = await sweep(True, args.requests, 18521)
    print(f"{'concurrency':>11} {'baseline tok/s':>15} {'EAGLE-3 tok/s':>14} {'published (base / EAGLE-3)':>28}")
    for c in LEVELS:
        pub = f"{PUBLISHED.get(('baseline', c), '-')} / {PUBLISHED.get(('eagle3', c), '-')}"
        print(f"{c:>11} {base[c]:>15.1f} {spec[c]:>14.1f} {pub:>28}")
    print("\nchecks (within 5 %):")
    for (kind, c), want in PUBLISHED.items():
        got = (base if kind == "baseline" else spec)[c]
        print(f"  {kind:<8} C={c:<4} measured {got:7.1f}, published {want:6.1f}: {got / want - 1:+.1%} "
              f"{'ok' if abs(got / want - 1) <= 0.05 else 'OFF'}")
    ahead = all(base[c] > spec[c] for c in LEVELS if c > 1)
    print(f"  baseline ahead at every concurrency above 1: {'yes' if ahead else 'NO'}")


if __name__ == "__main__":
    asyncio.run(main())
