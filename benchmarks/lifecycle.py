"""Measure the server lifecycle stages against real local processes.

    .venv/bin/python benchmarks/lifecycle.py [--runs 20] [--max-interval 1.0]

Prints, for the toy server in tests/helpers (a real HTTP server process):
- how long after the server turns healthy wait_for_health returns (the server prints the
  monotonic time it starts answering 200; both share the machine's monotonic clock; the
  target is a median of at most 250 ms);
- how long after a startup crash wait_for_health fails;
- how long kill_server takes for a tree of three processes in two sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specsweep.errors import ServerCrashedError  # noqa: E402
from specsweep.hosts import LocalHost  # noqa: E402
from specsweep.profiles import ServerProfile  # noqa: E402
from specsweep.server.api import ServerAPI  # noqa: E402
from specsweep.server.health import wait_for_health  # noqa: E402
from specsweep.server.lifecycle import kill_server, start_server  # noqa: E402
from tests.conftest import toy_profile  # noqa: E402


def stamp(log: str, key: str) -> float:
    m = re.search(rf"{key}=([0-9.]+)", Path(log).read_text())
    assert m, f"{key} not in {log}"
    return float(m.group(1))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--max-interval", type=float, default=ServerProfile.model_fields["health_poll_max_interval_s"].default,
                    help="health_poll_max_interval_s of the profile (default: the profile's own default)")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds the server answers 503 before 200")
    args = ap.parse_args()
    host = LocalHost()
    tmp = Path("/tmp/specsweep-bench-lifecycle")
    tmp.mkdir(exist_ok=True)

    ready_lag, crash_lag, kill_s = [], [], []
    rng = random.Random(1)
    for _ in range(args.runs):
        # Random phases, so the poll schedule does not line up the same way every run.
        warmup = args.warmup * rng.uniform(0.5, 1.5)
        p = toy_profile(tmp, "--listen-after", "0.5", "--warmup", f"{warmup:.3f}", "--spawn-grandchild",
                        health_poll_max_interval_s=args.max_interval)
        h = start_server(host, p)
        async with ServerAPI(f"http://127.0.0.1:{p.port}") as api:
            await wait_for_health(host, p, h, api)
        ready_lag.append(time.monotonic() - stamp(h.log_path, "ready_at_monotonic"))
        time.sleep(0.2)
        t0 = time.monotonic()
        report = kill_server(host, p, h)
        kill_s.append(time.monotonic() - t0)
        assert len(report.killed) >= 3, report

        c = toy_profile(tmp, "--crash-after", f"{rng.uniform(0.5, 2.0):.3f}", health_poll_max_interval_s=args.max_interval)
        ch = start_server(host, c)
        try:
            async with ServerAPI(f"http://127.0.0.1:{c.port}") as api:
                await wait_for_health(host, c, ch, api)
        except ServerCrashedError:
            crash_lag.append(time.monotonic() - stamp(ch.log_path, "exit_at_monotonic"))

    def line(name: str, xs: list[float]) -> str:
        return (f"{name:<44} median {statistics.median(xs) * 1000:7.0f} ms   p90 {pct(xs, 0.9) * 1000:7.0f} ms   "
                f"max {max(xs) * 1000:7.0f} ms   (n={len(xs)})")

    print(f"poll interval cap {args.max_interval} s, server warm-up {args.warmup * 0.5:.1f}-{args.warmup * 1.5:.1f} s")
    print(line("wait_for_health returns after healthy", ready_lag))
    print(line("wait_for_health fails after startup crash", crash_lag))
    print(line("kill_server, tree of 3 processes, 2 sessions", kill_s))


if __name__ == "__main__":
    asyncio.run(main())
