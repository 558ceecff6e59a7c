"""The ``specsweep`` command: the core's commands (``specsweep.cli``: server, preset, bench, runs, report,
compare, ...) and the flows', which run a flow in this process (Prefect starts a temporary local
server when none is configured) and print the answer:

    specsweep compare-local [--concurrency 1,2,4,8] [--num-prompts 12] [--output-len 64] [--design alternate]
    specsweep tune [--engine vllm --settings vllm.json] [--grid num_speculative_tokens=1,3,5] [--host-config h.json]
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Coroutine
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar  # noqa: UP035 - typer reads Optional

import typer
from pydantic import ValidationError

from specsweep import engines
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.slo import SLO
from specsweep.bench.config import WorkloadConfig
from specsweep.cli import app
from specsweep.cli import server as server_cli
from specsweep.cli.options import (
    Budget,
    Dataset,
    Design,
    HostFile,
    Levels,
    Margin,
    NumPrompts,
    OutputLen,
    PromptsFile,
    Results,
    SloTpot,
    SloTtft,
    Temperatures,
    fail,
    host_config,
    number,
    numbers,
    setup_logging,
)
from specsweep.engines.llamacpp import LlamaCppSettings
from specsweep.engines.sglang import SGLangSettings
from specsweep.engines.vllm import VLLMSettings
from specsweep.errors import ConfigError, SpecsweepError
from specsweep.hosts import Host
from specsweep.parameters import LOCAL_BENCHMARK, LOCAL_DECISION, BenchmarkSettings
from specsweep.profiles import describe_validation_error
from specsweep.reports.tables import print_comparison, print_tuning
from specsweep.results import comparison_folder, tuning_folder

_SWEEP, _WORKLOAD = LOCAL_BENCHMARK.sweep, LOCAL_BENCHMARK.workload
T = TypeVar("T")


def _benchmark(levels: str, num_prompts: int, output_len: int, results: str, dataset: str = "synthetic",
               prompts_file: Path | None = None, temperatures: str | None = None) -> BenchmarkSettings:
    try:
        workload = WorkloadConfig.model_validate({**_WORKLOAD.model_dump(), "output_len": output_len,
                                                  "source": dataset, "prompts_file": prompts_file})
        request = LOCAL_BENCHMARK.request.model_validate({**LOCAL_BENCHMARK.request.model_dump(),
                                                         "temperatures": numbers(temperatures, float, "--temperatures")})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "--dataset/--prompts-file/--temperatures")) from None
    return LOCAL_BENCHMARK.model_copy(update={
        "sweep": _SWEEP.model_copy(update={"concurrency": numbers(levels, int, "--concurrency"),
                                           "num_requests": num_prompts}),
        "workload": workload, "request": request, "results": results,
    })


def _run(flow_run: Coroutine[Any, Any, T]) -> T:
    """Run a flow in this process, against Prefect's temporary server when none is configured: started first,
    out of reach of the terminal's Ctrl-C (``flows.temporary_server``), so that a Ctrl-C tears the run down
    through a live API."""
    from flows.temporary_server import start_temporary_server

    start_temporary_server()
    return asyncio.run(flow_run)


def _print_comparison(result: Any, t0: float) -> None:
    comp = result.comparison
    print_comparison(comp)
    typer.echo(f"\nruns: {result.baseline.run_id} (baseline), {result.speculative.run_id} (speculative)")
    if comp.verification is not None:
        typer.echo("verify stage runs: " + ", ".join(f"{rid} ({arm})" for arm, rid in comp.verification.runs.items()))
    typer.echo(f"Parquet data: {result.results}/runs, /levels, /requests (partitioned by run_id)")
    typer.echo(f"report and plots: {result.results}/{comparison_folder(comp.baseline_run_id, comp.speculative_run_id)}/")
    typer.echo(f"total time: {time.monotonic() - t0:.0f} s")


def _decision(design: str, margin: float, budget: int, ttft: float | None, tpot: float | None,
              **more: Any) -> DecisionConfig:
    if design not in ("alternate", "sequential"):
        raise ConfigError(f"--design must be alternate or sequential (got {design!r})")
    for name, value in (("--slo-ttft-p99-ms", ttft), ("--slo-tpot-p99-ms", tpot)):
        if value is not None and value <= 0:
            raise ConfigError(f"{name} must be a positive number of milliseconds (got {value:g})")
    slo = SLO(ttft_p99_ms=ttft, tpot_p99_ms=tpot) if ttft or tpot else None
    return LOCAL_DECISION.model_copy(update={"design": design, "margin": margin, "max_requests_per_level": budget,
                                             "slo": slo, **more})


@app.command("compare-local")
def compare_local(
    levels: Levels = ",".join(map(str, _SWEEP.concurrency)),
    num_prompts: NumPrompts = _SWEEP.num_requests,
    output_len: OutputLen = _WORKLOAD.output_len,
    dataset: Dataset = _WORKLOAD.source,
    prompts_file: PromptsFile = None,
    temperatures: Temperatures = None,
    design: Design = LOCAL_DECISION.design,
    margin: Margin = LOCAL_DECISION.margin,
    max_requests_per_level: Budget = LOCAL_DECISION.max_requests_per_level,
    slo_ttft: SloTtft = None,
    slo_tpot: SloTpot = None,
    results: Results = LOCAL_BENCHMARK.results,
) -> None:
    """The main job: llama.cpp baseline vs draft speculation on this machine's CPU (compare-local-llamacpp),
    then the comparison table, the answer and where the data and report are."""
    from flows.compare_speculation import compare_local_llamacpp  # Prefect loads with the command, not with --help

    setup_logging()
    t0 = time.monotonic()
    try:
        decision = _decision(design, margin, max_requests_per_level, slo_ttft, slo_tpot)
        benchmark = _benchmark(levels, num_prompts, output_len, results, dataset, prompts_file, temperatures)
        result = _run(compare_local_llamacpp(benchmark=benchmark, decision=decision))
    except SpecsweepError as exc:
        fail(exc)
    _print_comparison(result, t0)


@app.command("compare-speculation")
def compare_speculation(
    engine: Annotated[str, typer.Option(help=f"One of {', '.join(engines.ENGINES)}.")] = "llamacpp",
    settings: Annotated[Optional[Path], typer.Option(
        help="The engine's settings (JSON, as the flow's parameter; {\"simulate\": true} rehearses SGLang on "
        "its simulator); default the local llama.cpp's.")] = None,
    host_file: HostFile = None,
    levels: Levels = ",".join(map(str, _SWEEP.concurrency)),
    num_prompts: NumPrompts = _SWEEP.num_requests,
    output_len: OutputLen = _WORKLOAD.output_len,
    dataset: Dataset = "synthetic",
    prompts_file: PromptsFile = None,
    temperatures: Temperatures = None,
    design: Design = LOCAL_DECISION.design,
    alternate_by: Annotated[str, typer.Option(help="side-by-side: the servers up at once; restart: one at a time, "
                                              "restarted per block (when they do not fit together).")]
    = LOCAL_DECISION.alternate_by,
    margin: Margin = LOCAL_DECISION.margin,
    max_requests_per_level: Budget = LOCAL_DECISION.max_requests_per_level,
    verify: Annotated[bool, typer.Option(help="Then run the recommended per-batch setting against always on and "
                                         "always off (vLLM, SGLang).")] = False,
    verify_controller: Annotated[bool | None, typer.Option(
        "--verify-controller/--no-verify-controller",
        help="With --verify: also measure the engine's own speculation controller (SGLang --speculative-adaptive, "
             "vLLM adaptive verification) and say whether the measured schedule beats, matches or loses to it. "
             "Default: where the engine has one.")] = None,
    slo_ttft: SloTtft = None,
    slo_tpot: SloTpot = None,
    results: Results = LOCAL_BENCHMARK.results,
) -> None:
    """Baseline vs speculation on any engine (compare-sglang-eagle3, compare-vllm, compare-local-llamacpp), with
    the optional verify stage."""
    from flows import compare_speculation as flows_  # Prefect loads with the command

    setup_logging()
    t0 = time.monotonic()
    try:
        if alternate_by not in ("side-by-side", "restart"):
            raise ConfigError(f"--alternate-by must be side-by-side or restart (got {alternate_by!r})")
        chosen = _settings(engine, settings)
        decision = _decision(design, margin, max_requests_per_level, slo_ttft, slo_tpot, alternate_by=alternate_by,
                             verify=verify, verify_controller=verify_controller)
        if verify:
            engines.check_verifiable(engine, "--verify")
        benchmark = _benchmark(levels, num_prompts, output_len, results, dataset, prompts_file, temperatures)
        if isinstance(chosen, LlamaCppSettings):
            run = flows_.compare_local_llamacpp(llamacpp=chosen, benchmark=benchmark, decision=decision)
        elif isinstance(chosen, SGLangSettings):
            run = flows_.compare_sglang_eagle3(sglang=chosen, host=host_config(host_file), benchmark=benchmark,
                                               decision=decision)
        else:
            run = flows_.compare_vllm(vllm=chosen, host=host_config(host_file), benchmark=benchmark, decision=decision)
        result = _run(run)
    except SpecsweepError as exc:
        fail(exc)
    _print_comparison(result, t0)


def _grid(items: list[str]) -> dict[str, list[int | float]] | None:
    grid: dict[str, list[int | float]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--grid takes FIELD=V1,V2,... such as draft_max=2,4,8 (got {item!r})")
        grid[key.strip()] = numbers(values, number, f"--grid {key.strip()}") or []
    return grid or None


def _settings(engine: str, path: Path | None) -> LlamaCppSettings | VLLMSettings | SGLangSettings:
    if path is None and engine != "llamacpp":
        raise ConfigError(f"--engine {engine} needs --settings FILE: the model and how to start it")
    try:
        data: dict[str, Any] = json.loads(path.read_text()) if path else {}
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--settings {path}: cannot read it as JSON ({exc})") from None
    try:
        settings = engines.get(engine, "--engine").settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, f"--settings ({engine})")) from None
    assert isinstance(settings, LlamaCppSettings | VLLMSettings | SGLangSettings)
    return settings


@app.command("tune")
def tune(
    engine: Annotated[str, typer.Option(help=f"One of {', '.join(engines.ENGINES)}.")] = "llamacpp",
    settings: Annotated[Optional[Path], typer.Option(
        help="The engine's settings (JSON, as the flow's parameter); default the local llama.cpp's.")] = None,
    grid: Annotated[Optional[list[str]], typer.Option(
        help="A speculation field and its values, FIELD=V1,V2 (repeatable); default the engine's small grid.")] = None,
    host_file: HostFile = None,
    levels: Levels = ",".join(map(str, _SWEEP.concurrency)),
    num_prompts: NumPrompts = _SWEEP.num_requests,
    output_len: OutputLen = _WORKLOAD.output_len,
    dataset: Dataset = "synthetic",
    prompts_file: PromptsFile = None,
    margin: Margin = LOCAL_DECISION.margin,
    max_requests_per_level: Budget = LOCAL_DECISION.max_requests_per_level,
    results: Results = LOCAL_BENCHMARK.results,
) -> None:
    """The grid (tune-speculation): speculative settings x concurrency levels, the best setting per range, in
    the engine's own per-batch form."""
    from flows.tune_speculation import grid_profiles, tune_speculation  # Prefect loads with the command

    setup_logging()
    t0 = time.monotonic()
    try:
        chosen = _settings(engine, settings)
        points = _grid(grid or [])
        grid_profiles({engine: chosen, "grid": points})  # a bad grid is refused before any flow run
        decision = LOCAL_DECISION.model_copy(update={"design": "sequential", "margin": margin,
                                                     "max_requests_per_level": max_requests_per_level})
        result = _run(tune_speculation(
            **{engine: chosen}, grid=points, host=host_config(host_file),  # type: ignore[arg-type]
            benchmark=_benchmark(levels, num_prompts, output_len, results, dataset, prompts_file),
            decision=decision))
    except SpecsweepError as exc:
        fail(exc)
    print_tuning(result.tuning)
    typer.echo(f"\nruns: {result.baseline.run_id} (baseline), " + ", ".join(r.run_id for r in result.points.values()))
    typer.echo(f"report and plot: {result.results}/{tuning_folder(result.tuning.baseline_run_id)}/")
    typer.echo(f"total time: {time.monotonic() - t0:.0f} s")


def _machine_lock(host: Host, wait_s: float) -> AbstractContextManager[None]:
    """`specsweep server start|kill` hold the machine as the flow runs do (Prefect loaded only for them)."""
    from tasks.host import cli_lock

    return cli_lock(host, wait_s)


def main() -> None:
    # A temporary local Prefect server has no network to report usage to: do not try.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    server_cli.host_guard = _machine_lock
    app()


if __name__ == "__main__":
    main()
