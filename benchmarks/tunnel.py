"""What the SSH tunnel costs: direct against the tunnel and the load generator on the host, on one server.

    .venv/bin/python benchmarks/tunnel.py [--requests 1024] [--levels 1,64,256] [--ways direct,openssh,on-host]
        [--limit-s 90]

A real OpenSSH server on loopback (started here, throwaway keys) is the "GPU host"; the
simulator runs on 127.0.0.1. For each way in (direct; the OpenSSH client tunnel; the load
generator on the host, ``load_generator: host``, run over SSH with its records brought back)
and each level:

1. a zero-delay server ("instant": every token at once, one per SSE event): streamed output
   tok/s, relative to direct, and CPU per streamed token of the client process and of the
   tunnel (the ssh client, and the sshd on the host side);
2. a server pacing tokens 5 ms apart ("paced-5ms", 64-token outputs): TTFT p50 and TPOT p50
   against direct (how much the tunnel adds), and the TPOT error against the pacing.

The sshd shares this machine's two cores with everything else: on a real GPU host its
share of the work runs there instead. Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specsweep.bench.config import RequestSpec, SweepConfig  # noqa: E402
from specsweep.bench.remote import HostLoadGenerator  # noqa: E402
from specsweep.bench.runner import Load, run_async, run_level  # noqa: E402
from specsweep.bench.workload import Prompt  # noqa: E402
from specsweep.hosts import SSHEndpoint, SSHHost  # noqa: E402
from specsweep.hosts.tunnel import Tunnel, open_tunnel  # noqa: E402
from specsweep.metrics import level_metrics  # noqa: E402
from specsweep.records import Block  # noqa: E402
from tests.helpers.sim import running_sim  # noqa: E402
from tests.helpers.sshd import keygen, start_sshd  # noqa: E402


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (FileNotFoundError, IndexError):
            pass
    return total


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    kids = [int(p) for p in out.split()]
    return kids + [g for k in kids for g in children(k)]


@contextmanager
def ways_in(port: int) -> Iterator[dict[str, tuple[str, list[int]]]]:
    """{"direct" | "openssh" | "on-host": (base URL, pids whose CPU is the tunnel's)}."""
    work = Path(tempfile.mkdtemp(prefix="specsweep-tunnel-bench-"))
    key = work / "id_ed25519"
    sshd = start_sshd(work / "sshd", [keygen(key)])
    known = work / "known_hosts"
    known.write_text(sshd.known_hosts_line() + "\n")
    endpoint = SSHEndpoint(hostname=sshd.address, port=sshd.port, user=sshd.user, key_path=key, known_hosts=known,
                           use_agent=False)
    host = SSHHost(endpoint)
    global ON_HOST
    ON_HOST = HostLoadGenerator(host, sys.executable, f"http://127.0.0.1:{port}")
    ON_HOST.check()
    tunnel: Tunnel = open_tunnel(host, "127.0.0.1", port)
    ssh_pids = [tunnel._proc.pid] if tunnel._proc is not None else []
    try:
        yield {"direct": (f"http://127.0.0.1:{port}", []),
               "openssh": (tunnel.url, ssh_pids + [sshd.proc.pid]),
               "on-host": (f"http://127.0.0.1:{port}", [sshd.proc.pid])}
    finally:
        tunnel.close()
        host.close()
        sshd.stop()


ON_HOST: HostLoadGenerator | None = None


async def measure(url: str, level: int, requests: int, output_len: int, tunnel_pids: list[int],
                  sshd_pid: int, on_host: bool = False) -> dict[str, float]:
    sweep = SweepConfig(num_requests=requests, warmup_requests=min(64, level))
    load = Load(url, RequestSpec(), (Prompt("a short prompt", 3, False),), output_len, sweep)
    watched = tunnel_pids + children(sshd_pid)
    cpu0, tun0, t0 = time.process_time(), cpu_s(watched), time.perf_counter()
    lv = Block(index=0, mode="concurrency", value=level)
    run = await ON_HOST.run(load, lv) if on_host and ON_HOST else await run_level(load, lv)
    watched_after = tunnel_pids + children(sshd_pid)
    m = level_metrics(run.records)
    tokens = max(1, m["output_tokens_total"])
    return {"tok_s": m["output_tokens_per_s"], "failed": m["failed"], "ttft_p50": m["ttft_ms_median"] or 0.0,
            "tpot_p50": m["tpot_ms_median"] or 0.0, "client_us": run.client_cpu_s / tokens * 1e6,
            "tunnel_us": (cpu_s(watched_after) - tun0) / tokens * 1e6, "wall": time.perf_counter() - t0,
            "cpu_all": time.process_time() - cpu0}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--levels", default="1,64,256")
    ap.add_argument("--ways", default="direct,openssh,on-host", help="Which ways in to measure (direct first).")
    ap.add_argument("--limit-s", type=float, default=90.0, help="Give up on one way in at one level after this long.")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    for profile, output_len in (("instant", 256), ("paced-5ms", 64)):
        print(f"\n{profile} server, {output_len}-token outputs, {args.requests} requests per level")
        print(f"  {'way in':<9} {'C':>4} {'out tok/s':>10} {'vs direct':>9} {'TTFT p50':>9} {'+TTFT':>7} {'TPOT p50':>9} "
              f"{'client µs/tok':>13} {'tunnel µs/tok':>13} {'failed':>6}")
        with running_sim("--sim-profile", profile, "--max-running-requests", "1024") as (url, proc):
            port = int(url.rsplit(":", 1)[1])
            with ways_in(port) as ways:
                sshd_pid = ways["openssh"][1][-1]
                for level in levels:
                    n = args.requests if profile == "instant" else max(64, min(args.requests, level * 4))
                    direct = None
                    for name, (base, pids) in ways.items():
                        if name not in args.ways.split(","):
                            continue
                        try:
                            r = await asyncio.wait_for(measure(base, level, n, output_len, pids[:-1] if pids else [],
                                                               sshd_pid, on_host=name == "on-host"), args.limit_s)
                        except TimeoutError:
                            print(f"  {name:<9} {level:>4} did not finish within {args.limit_s:.0f} s", flush=True)
                            continue
                        direct = direct or r
                        print(f"  {name:<9} {level:>4} {r['tok_s']:>10,.0f} {r['tok_s'] / direct['tok_s']:>8.2f}x "
                              f"{r['ttft_p50']:>7.2f}ms {r['ttft_p50'] - direct['ttft_p50']:>+6.2f} {r['tpot_p50']:>7.3f}ms "
                              f"{r['client_us']:>13.2f} {r['tunnel_us']:>13.2f} {r['failed']:>6.0f}", flush=True)


if __name__ == "__main__":
    run_async(main())
