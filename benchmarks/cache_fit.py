"""Does drafting pay on this CPU because the target's weights do not fit its last-level cache?

    .venv/bin/python benchmarks/cache_fit.py [--pairs 6] [--levels 1,8] [--threads 2]

The reasoning to check: one decode step of a small batch reads every weight once. Where the weights
exceed the L3 cache, a step is bound by memory traffic (like a GPU at low batch), verifying k drafted
tokens costs about as much as one step, and drafting pays. Where they fit, a step is bound by
arithmetic, verifying k tokens costs about k steps' work, and drafting cannot save anything.

For targets of several sizes (generated the way the main job's are: the draft is the target's first
block, so acceptance stays alike) the baseline and the speculative llama.cpp servers run side by side
and the script measures blocks in turn (paired) at each level. Per target it prints the weights'
size against L3, the baseline's rate and the memory traffic it implies (weights read per token), the
speculative rate, the paired ratio with its 95 % interval and the product's verdict on it (margin
3 %), and the acceptance. With ``--threads 2`` the 40M target shows a real crossover: faster alone,
no gain at 8 in flight. Nothing else should
run on the machine meanwhile: llama.cpp's threads busy-wait.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specsweep.analysis.stats import ratio_interval, verdict  # noqa: E402
from specsweep.bench.config import SweepConfig, WorkloadConfig  # noqa: E402
from specsweep.engines.llamacpp import baseline as baseline_profile  # noqa: E402
from specsweep.engines.llamacpp import default_models_dir  # noqa: E402
from specsweep.engines.llamacpp import speculative as speculative_profile  # noqa: E402
from specsweep.hosts import LocalHost  # noqa: E402
from specsweep.records import Block  # noqa: E402
from specsweep.results import ResultsStore, new_run_id  # noqa: E402
from specsweep.server.api import ServerAPI  # noqa: E402
from specsweep.server.health import wait_for_health  # noqa: E402
from specsweep.server.lifecycle import kill_server, start_server  # noqa: E402
from specsweep.sweep import BenchTarget, SweepJob, measure_level, settle  # noqa: E402
from specsweep.targets.llamacpp.models import ModelSpec, make_models  # noqa: E402

TARGETS = {  # name: shape; f16 weights, so bytes = 2 x parameters
    "7M (fits)": ModelSpec(n_embd=256, n_layer=8, n_head=4, n_ff=704),
    "27M": ModelSpec(),
    "40M (main job)": ModelSpec(n_layer=12),
    "150M": ModelSpec(n_embd=1024, n_layer=12, n_head=16, n_ff=2816),
}


def l3_bytes() -> int | None:
    """The last-level cache one core sees (sysfs), or None."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"), reverse=True):
        try:
            if (index / "level").read_text().strip() == "3":
                text = (index / "size").read_text().strip().upper()
                unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
                return int(text.rstrip("KMG")) * unit
        except (OSError, ValueError):
            continue
    return None


async def measure(spec: ModelSpec, folder: Path, args: argparse.Namespace, store: ResultsStore) -> list[str]:
    files = make_models(folder, spec)
    host = LocalHost()
    profiles = (baseline_profile(port=18490, model_path=str(files.target), threads=args.threads),
                speculative_profile(port=18491, model_path=str(files.target), draft_model_path=str(files.draft),
                                    threads=args.threads))
    handles = []
    try:
        targets, jobs = [], []
        for profile in profiles:
            kill_server(host, profile)
            handle = start_server(host, profile)
            handles.append((profile, handle))
            target = BenchTarget(base_url=f"http://127.0.0.1:{profile.port}", engine=profile.engine)
            async with ServerAPI(target.base_url) as api:
                await wait_for_health(host, profile, handle, api)
            job = SweepJob(run_id=new_run_id(profile.name), config_name=profile.name, store=store,
                           workload=WorkloadConfig(input_len=16, output_len=args.output_len),
                           sweep=SweepConfig(concurrency=args.levels, num_requests=args.requests, warmup_requests=2,
                                             requests_per_slot=3))
            await settle(target, job)
            targets.append(target)
            jobs.append(job)
        lines = []
        for index, c in enumerate(args.levels):
            rows: list[list] = [[], []]
            for pair in range(args.pairs):
                order = (0, 1) if pair % 2 == 0 else (1, 0)  # ABBA: drift lands on both alike
                for arm in order:
                    level = Block(index=index, mode="concurrency", value=c, repeat=pair)
                    rows[arm].append(await functools.partial(measure_level, targets[arm], jobs[arm])(level))
            base = [r.throughput for r in rows[0]]
            spec_ = [r.throughput for r in rows[1]]
            iv = ratio_interval(base, spec_, paired=True, confidence=0.95)
            acc = statistics.fmean(r.spec_acceptance_rate or 0 for r in rows[1])
            mb = files.target.stat().st_size / 1e6
            lines.append(f"{files.target_params / 1e6:>6.0f}M {mb:>8.0f} {c:>3} {statistics.median(base):>10.1f} "
                         f"{statistics.median(base) * mb / 1e3:>9.1f} {statistics.median(spec_):>10.1f} "
                         f"{iv.ratio:>6.2f} [{iv.low:.2f}, {iv.high:.2f}] {verdict(iv, 0.03):>12} {acc:>7.0%}")
        return lines
    finally:
        for profile, handle in handles:
            kill_server(host, profile, handle)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=6, help="blocks of each configuration per level (paired)")
    ap.add_argument("--requests", type=int, default=8, help="requests per block (at least 3 per slot)")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--targets", default=",".join(TARGETS), help="which of: " + ", ".join(TARGETS))
    args = ap.parse_args()
    args.levels = [int(x) for x in args.levels.split(",")]
    l3 = l3_bytes()
    print(f"L3 cache (one core's view): {l3 / (1 << 20):.0f} MiB" if l3 else "L3 cache: unknown")
    print(f"{'target':>7} {'MB f16':>8} {'C':>3} {'base tok/s':>10} {'GB/s read':>9} {'spec tok/s':>10} "
          f"{'ratio [95 % interval]':>21} {'verdict':>12} {'accept':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        store = ResultsStore(Path(tmp) / "results")
        for name in args.targets.split(","):
            for line in await measure(TARGETS[name], default_models_dir() / "cache-fit" / name.split()[0], args,
                                      store):
                print(line, flush=True)
    print(f"({args.pairs} paired blocks per level, {args.output_len}-token outputs, llama.cpp -t {args.threads}; "
          "GB/s read: the baseline's tokens/s times the weights' size, the traffic if every token read them all)")


if __name__ == "__main__":
    asyncio.run(main())
