"""The main job: compare-local-llamacpp on this machine, then the answer on the terminal.

    .venv/bin/python -m flows.demo [--levels 1,2,4,8] [--num-prompts 12] [--output-len 96] [--design alternate]

Runs the flow in this process (Prefect starts a temporary local server when none is
configured), llama.cpp baseline vs draft speculation with tiny generated models, and
prints the comparison table, the recommendation and where the data and report are.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time

from flows.compare_speculation import LOCAL_BENCHMARK, LOCAL_DECISION, compare_local_llamacpp
from specsweep.errors import ConfigError, SpecsweepError
from specsweep.report import print_comparison


def _levels(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--levels must be a comma-separated list of numbers, like 1,2,4,8 (got {text!r})") from None


def main(argv: list[str] | None = None) -> int:
    sweep, workload = LOCAL_BENCHMARK.sweep, LOCAL_BENCHMARK.workload
    ap = argparse.ArgumentParser(prog="python -m flows.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default=",".join(map(str, sweep.concurrency)), help="concurrency levels")
    ap.add_argument("--num-prompts", type=int, default=sweep.num_requests, help="measured requests per level")
    ap.add_argument("--output-len", type=int, default=workload.output_len, help="tokens per request")
    ap.add_argument("--design", choices=["alternate", "sequential"], default=LOCAL_DECISION.design,
                    help="alternate: baseline and speculative blocks in turn; sequential: one configuration, then the other")
    ap.add_argument("--margin", type=float, default=LOCAL_DECISION.margin, help="ratios within ±margin are equivalent")
    ap.add_argument("--max-requests-per-level", type=int, default=LOCAL_DECISION.max_requests_per_level,
                    help="budget per level and configuration")
    ap.add_argument("--results", default=LOCAL_BENCHMARK.results, help="results root: a folder or a URL")
    args = ap.parse_args(argv)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no network to report usage to
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(message)s", datefmt="%H:%M:%S")
    t0 = time.monotonic()
    try:
        benchmark = LOCAL_BENCHMARK.model_copy(update={
            "sweep": sweep.model_copy(update={"concurrency": _levels(args.levels), "num_requests": args.num_prompts}),
            "workload": workload.model_copy(update={"output_len": args.output_len}),
            "results": args.results,
        })
        decision = LOCAL_DECISION.model_copy(update={"design": args.design, "margin": args.margin,
                                                      "max_requests_per_level": args.max_requests_per_level})
        result = asyncio.run(compare_local_llamacpp(benchmark=benchmark, decision=decision))
    except SpecsweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    print_comparison(result.comparison)
    comp = result.comparison
    print(f"\nruns: {result.baseline.run_id} (baseline), {result.speculative.run_id} (speculative)")
    print(f"Parquet data: {result.results}/runs, /levels, /requests (partitioned by run_id)")
    print(f"report and plots: {result.results}/reports/{comp.baseline_run_id}--{comp.speculative_run_id}/")
    print(f"total time: {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
