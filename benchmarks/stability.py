"""Does the main job give the same answer every time, and does it find the crossover of a real engine?

    .venv/bin/python benchmarks/stability.py [--runs 3] [--design alternate|sequential]

Each run is a separate flow run of compare-engine (the local llama.cpp) with the main job's defaults: a real
llama.cpp server on this CPU, baseline against draft speculation, one after the other on this
machine. Prints each run's answer (status, speculation off from, per-level verdicts with their
blocks), its time, and whether the answers agree. Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flows.compare_speculation import compare_engine  # noqa: E402
from specsweep.parameters import LOCAL_BENCHMARK, LOCAL_DECISION  # noqa: E402


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--design", choices=["alternate", "sequential"], default=LOCAL_DECISION.design)
    ap.add_argument("--results", default=str(ROOT / "data" / "results"))
    args = ap.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    decision = LOCAL_DECISION.model_copy(update={"design": args.design})
    benchmark = LOCAL_BENCHMARK.model_copy(update={"results": args.results})
    answers = []
    for i in range(args.runs):
        t0 = time.monotonic()
        result = await compare_engine(benchmark=benchmark, decision=decision)
        rec = result.comparison.recommendation
        verdicts = ", ".join(f"{lv.concurrency}: {lv.verdict} ×{lv.ratio:.2f} ({lv.blocks[0]}+{lv.blocks[1]} blocks)"
                             for lv in result.comparison.levels)
        answers.append((rec.status, rec.speculation_off_from, rec.worst_case_loss))
        print(f"run {i + 1}: {rec.status}, speculation off from {rec.speculation_off_from}; {time.monotonic() - t0:.0f} s",
              flush=True)
        print(f"  {verdicts}")
        print(f"  {rec.decision}", flush=True)
    same = len(set(answers)) == 1
    print(f"\n{args.runs} runs ({args.design} design): the answers {'AGREE' if same else 'DIFFER'}: "
          + "; ".join(f"{s} / off from {o}" for s, o, _ in answers))


if __name__ == "__main__":
    asyncio.run(main())
