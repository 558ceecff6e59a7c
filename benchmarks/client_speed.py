"""How fast and how exact is the load generator? (the instrument must never be the limit)

    .venv/bin/python benchmarks/client_speed.py [--requests 1024] [--workers 1,2]

1. Speed: against the simulator's "instant" profile (a separate process that streams
   every token at once, one per SSE event), concurrency 64, 256-token outputs: streamed
   tokens per second and the client's own CPU time per token inside the timed window,
   with the level in one process and spread over several.
2. Timing error: against the "paced-5ms" profile (one token every 5 ms per request,
   each send time recorded by the server on the shared monotonic clock): the client's
   TTFT and ITL timestamps minus the server's, at concurrency 1, 8 and 64.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specsweep.bench.config import RequestSpec, SweepConfig  # noqa: E402
from specsweep.bench.runner import Load, run_level  # noqa: E402
from specsweep.bench.workload import Prompt  # noqa: E402
from specsweep.records import Block  # noqa: E402


def start_sim(profile: str, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "specsweep.targets.sim", "--sim-profile", profile, "--port", str(port),
                             "--startup-s", "0.2", "--max-running-requests", "1024"], stdout=subprocess.DEVNULL)
    for _ in range(200):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError("simulator did not start")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def speed(requests: int, workers: list[int]) -> None:
    proc = start_sim("instant", 18411)
    url = "http://127.0.0.1:18411"
    prompts = (Prompt("a short prompt", 3, False),)
    print(f"1. speed: instant server, concurrency 64, 256-token outputs, {requests} requests")
    print(f"   {'workers':>7} {'streamed tok/s':>15} {'client CPU µs/token':>20} {'client CPU share':>17} {'failed':>7}")
    try:
        for w in workers:
            for rep in range(2):
                sweep = SweepConfig(num_requests=requests, warmup_requests=64, workers=w)
                run = await run_level(Load(url, RequestSpec(), prompts, 256, sweep), Block(index=0, mode="concurrency",
                                                                                              value=64))
                ok = [r for r in run.records if r.ok]
                tokens = sum(r.output_tokens or 0 for r in ok)
                start = min(r.sent_s for r in run.records if r.sent_s)
                end = max(r.end_s for r in run.records if r.end_s)
                print(f"   {w:>7} {tokens / (end - start):>15,.0f} {run.client_cpu_s / tokens * 1e6:>20.2f} "
                      f"{run.client_cpu_share:>17.2f} {len(run.records) - len(ok):>7}   (repeat {rep + 1})")
    finally:
        proc.terminate()


async def timing(requests: int) -> None:
    proc = start_sim("paced-5ms", 18412)
    url = "http://127.0.0.1:18412"
    prompts = (Prompt("a short prompt", 3, False),)
    print("\n2. timing error against the server's own send times (paced 5 ms per token, 64-token outputs)")
    print(f"   {'concurrency':>11} {'TTFT err median':>16} {'TTFT err p99':>13} {'ITL err median':>15} {'ITL err p99':>12}")
    try:
        async with httpx.AsyncClient() as client:
            for conc in (1, 8, 64):
                n = max(32, min(requests, conc * 8))
                sweep = SweepConfig(num_requests=n, warmup_requests=4)
                run = await run_level(Load(url, RequestSpec(), prompts, 64, sweep),
                                      Block(index=0, mode="concurrency", value=conc))
                ttft_err, itl_err = [], []
                for r in run.records:
                    truth = (await client.get(url + "/sim/token_times", params={"id": r.response_id})).json()["token_times_s"]
                    # First token: when the client saw it minus when the server wrote it.
                    ttft_err.append(abs(r.chunk_times_s[0] - truth[0]) * 1000)
                    # ITL: each gap as the client measured it minus the gap as the server sent it.
                    for i in range(1, min(len(truth), len(r.chunk_times_s))):
                        itl_err.append(abs((r.chunk_times_s[i] - r.chunk_times_s[i - 1]) - (truth[i] - truth[i - 1])) * 1000)
                print(f"   {conc:>11} {statistics.median(ttft_err):>13.3f} ms {pct(ttft_err, 0.99):>10.3f} ms "
                      f"{statistics.median(itl_err):>12.3f} ms {pct(itl_err, 0.99):>9.3f} ms")
    finally:
        proc.terminate()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    from specsweep.bench.runner import run_async

    run_async(speed(args.requests, [int(w) for w in args.workers.split(",")]))
    run_async(timing(args.requests))


if __name__ == "__main__":
    main()
