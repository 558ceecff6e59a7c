"""Run tune-speculation from a terminal, then print the answer.

    .venv/bin/python -m flows.tune                                   # llama.cpp here, draft_max 2,4,8
    .venv/bin/python -m flows.tune --grid draft_max=1,3,6 --levels 1,4,8
    .venv/bin/python -m flows.tune --engine vllm --settings vllm.json --grid num_speculative_tokens=1,3,5 \\
        --host-config gpu-01.json

Runs the flow in this process (Prefect starts a temporary local server when none is
configured). --settings holds the engine's settings as JSON (the flow's vllm / sglang /
llamacpp parameter); --grid is repeatable, one speculation field per use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from flows.compare_speculation import LOCAL_BENCHMARK
from flows.tune_speculation import grid_profiles, tune_speculation
from specsweep.decision import DecisionConfig
from specsweep.errors import ConfigError, SpecsweepError
from specsweep.hosts import HostConfig
from specsweep.report import print_tuning
from specsweep.settings import LlamaCppSettings, SGLangSettings, VLLMSettings


def _numbers(text: str, what: str) -> list[int | float]:
    out: list[int | float] = []
    for part in (x.strip() for x in text.split(",") if x.strip()):
        try:
            out.append(int(part) if part.lstrip("-").isdigit() else float(part))
        except ValueError:
            raise ConfigError(f"{what} must be comma-separated numbers, like 1,3,5 (got {text!r})") from None
    return out


def _grid(items: list[str]) -> dict[str, list[int | float]] | None:
    grid: dict[str, list[int | float]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--grid takes FIELD=V1,V2,... such as draft_max=2,4,8 (got {item!r})")
        grid[key.strip()] = _numbers(values, f"--grid {key.strip()}")
    return grid or None


def _json_file(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{what} {path}: cannot read it as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a JSON object")
    return data


def _settings(engine: str, data: dict[str, Any]) -> LlamaCppSettings | VLLMSettings | SGLangSettings:
    kinds: dict[str, type[LlamaCppSettings | VLLMSettings | SGLangSettings]] = {
        "llamacpp": LlamaCppSettings, "vllm": VLLMSettings, "sglang": SGLangSettings}
    try:
        return kinds[engine].model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "settings"
        raise ConfigError(f"--settings ({engine}): {where}: {first['msg']}") from None


def main(argv: list[str] | None = None) -> int:
    sweep, workload = LOCAL_BENCHMARK.sweep, LOCAL_BENCHMARK.workload
    ap = argparse.ArgumentParser(prog="python -m flows.tune", description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=["llamacpp", "vllm", "sglang"], default="llamacpp")
    ap.add_argument("--settings", type=Path, help="the engine's settings (JSON); default the local llama.cpp's")
    ap.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2",
                    help="a speculation field and its values (repeatable); default the engine's small grid")
    ap.add_argument("--host-config", type=Path, help="the host (JSON, as the flows' host parameter); default here")
    ap.add_argument("--levels", default=",".join(map(str, sweep.concurrency)), help="concurrency levels")
    ap.add_argument("--num-prompts", type=int, default=sweep.num_requests, help="measured requests per block")
    ap.add_argument("--output-len", type=int, default=workload.output_len, help="tokens per request")
    ap.add_argument("--margin", type=float, default=DecisionConfig().margin, help="ratios within ±margin are equivalent")
    ap.add_argument("--max-requests-per-level", type=int, default=96, help="budget per level and setting")
    ap.add_argument("--results", default=LOCAL_BENCHMARK.results, help="results root: a folder or a URL")
    args = ap.parse_args(argv)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(message)s", datefmt="%H:%M:%S")
    t0 = time.monotonic()
    try:
        levels = [int(x) for x in _numbers(args.levels, "--levels")]
        settings = _json_file(args.settings, "--settings") if args.settings else None
        if args.engine != "llamacpp" and settings is None:
            raise ConfigError(f"--engine {args.engine} needs --settings FILE: the model and how to start it")
        host = HostConfig.model_validate(_json_file(args.host_config, "--host-config")) if args.host_config \
            else HostConfig()
        benchmark = LOCAL_BENCHMARK.model_copy(update={
            "sweep": sweep.model_copy(update={"concurrency": levels, "num_requests": args.num_prompts}),
            "workload": workload.model_copy(update={"output_len": args.output_len}),
            "results": args.results,
        })
        decision = DecisionConfig(margin=args.margin, max_requests_per_level=args.max_requests_per_level)
        chosen = _settings(args.engine, settings or {})
        grid_profiles({args.engine: chosen, "grid": _grid(args.grid)})  # a bad grid is refused before any flow run
        result = asyncio.run(tune_speculation(
            llamacpp=chosen if isinstance(chosen, LlamaCppSettings) else None,
            vllm=chosen if isinstance(chosen, VLLMSettings) else None,
            sglang=chosen if isinstance(chosen, SGLangSettings) else None,
            grid=_grid(args.grid), host=host, benchmark=benchmark, decision=decision))
    except SpecsweepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    print_tuning(result.tuning)
    print(f"\nruns: {result.baseline.run_id} (baseline), " + ", ".join(r.run_id for r in result.points.values()))
    print(f"report and plot: {result.results}/reports/tune-{result.baseline.run_id}/")
    print(f"total time: {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
