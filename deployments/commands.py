"""The flows' commands of ``specsweep`` (registered through the entry point group ``specsweep.commands``,
pyproject.toml): each runs a flow in this process (Prefect starts a temporary local server when none is
configured) and prints the answer; and Prefect's host lock, which ``specsweep server start|kill`` hold.

    specsweep compare-local [--concurrency 1,2,4,8] [--num-prompts 12] [--output-len 64] [--design alternate]
    specsweep compare-speculation [--engine vllm] --settings vllm.json [--host-config h.json] [--verify]
    specsweep tune [--engine vllm --settings vllm.json] [--grid num_speculative_tokens=1,3,5] [--host-config h.json]

Not a flow: the command line's side of the flows. The engine is never named here: ``--settings`` is the
engine's form (``specsweep.engines``), the engine from ``--engine`` or the file's own ``engine``.
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
from specsweep.bench.config import SearchRange, SweepConfig, WorkloadConfig
from specsweep.cli.app import HostGuard
from specsweep.cli.options import (
    Budget,
    BudgetMinutes,
    Dataset,
    Design,
    HostFile,
    Levels,
    Margin,
    NumPrompts,
    OutputLen,
    PromptsFile,
    RequestRates,
    Results,
    Search,
    SloTpot,
    SloTtft,
    Temperatures,
    fail,
    host_config,
    number,
    numbers,
    setup_logging,
)
from specsweep.engines import EngineSettings
from specsweep.errors import ConfigError, SpecsweepError
from specsweep.hosts import Host
from specsweep.parameters import LOCAL_BENCHMARK, LOCAL_DECISION, BenchmarkSettings
from specsweep.profiles import describe_validation_error
from specsweep.reports.tables import print_comparison, print_tuning
from specsweep.results import comparison_folder, tuning_folder

_SWEEP, _WORKLOAD = LOCAL_BENCHMARK.sweep, LOCAL_BENCHMARK.workload
#: The main job: a search over 1..8 streams (the local servers have 8 slots: 16 in flight run the batch of 8 with 8
#: queued, a round there costing about 1.5 times one at 8: 16 s against 11 s), within 4 minutes of flow time (the
#: verify stage included): with the set-up, about 4.5 minutes on this machine. Blocks of 6 requests (2 per slot from
#: C=3 on) of up to 32 tokens, and at most 12 rounds a level (72 requests of one stream): the distribution-free
#: intervals need rounds more than long blocks, and the fewer looks a level may take, the fewer rounds bound its
#: interval (9 here, against 11 at 64).
MAIN_SEARCH, MAIN_BUDGET_MINUTES, MAIN_BLOCK, MAIN_OUTPUT_LEN, MAIN_LEVEL_REQUESTS = "1:8", 4.0, 6, 32, 72
T = TypeVar("T")
_SWITCHING = ", ".join(e.label for e in engines.ENGINES.values() if not e.no_per_batch_switch)
Engine = Annotated[Optional[str], typer.Option(
    help=f"One of {', '.join(engines.ENGINES)}; default the --settings file's own engine, else the local llama.cpp.")]


def _benchmark(levels: str, num_prompts: int, output_len: int, results: str, dataset: str = "synthetic",
               prompts_file: Path | None = None, temperatures: str | None = None,
               search: str | None = None, request_rate: str | None = None) -> BenchmarkSettings:
    temps = numbers(temperatures, float, "--temperatures") or []
    try:
        workload = WorkloadConfig.model_validate({**_WORKLOAD.model_dump(), "output_len": output_len,
                                                  "source": dataset, "prompts_file": prompts_file})
        # One temperature is the comparison's own; several, a comparison at each.
        request = LOCAL_BENCHMARK.request.model_validate({
            **LOCAL_BENCHMARK.request.model_dump(), "temperature": temps[0] if len(temps) == 1 else 0.0,
            "temperatures": temps if len(temps) > 1 else None})
        span = SearchRange.parse(search) if search else None
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "--dataset/--prompts-file/--temperatures/--search")) from None
    except ValueError as exc:
        raise ConfigError(f"--search: {exc}") from None
    rates = numbers(request_rate, float, "--request-rate")
    try:
        # A search's blocks hold 2 requests per slot (the default), not the grid's 3: its rounds are many and short.
        sweep = SweepConfig.model_validate({
            **_SWEEP.model_dump(), "concurrency": numbers(levels, int, "--concurrency"), "num_requests": num_prompts,
            "search": span, "request_rate": rates or None,
            "requests_per_slot": 2 if span is not None else _SWEEP.requests_per_slot})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "--concurrency/--request-rate/--search")) from None
    return LOCAL_BENCHMARK.model_copy(update={"sweep": sweep, "workload": workload, "request": request,
                                              "results": results})


def _run(flow_run: Coroutine[Any, Any, T]) -> T:
    """Run a flow in this process, against Prefect's temporary server when none is configured: started first,
    out of reach of the terminal's Ctrl-C (``deployments.temporary_server``), so that a Ctrl-C tears the run down
    through a live API."""
    from deployments.temporary_server import start_temporary_server

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
    refuted = [c for c in (comp, *getattr(result, "by_temperature", {}).values()) if c.recommendation.status == "refuted"]
    if refuted:  # the engine ran the setting and it fell short (at some temperature): not one to deploy
        typer.echo(refuted[0].recommendation.decision, err=True)
        raise typer.Exit(3)


def _decision(design: str, margin: float, budget: int, ttft: float | None, tpot: float | None,
              **more: Any) -> DecisionConfig:
    if design not in ("alternate", "sequential"):
        raise ConfigError(f"--design must be alternate or sequential (got {design!r})")
    if (minutes := more.get("budget_minutes")) is not None and minutes <= 0:
        raise ConfigError(f"--budget-minutes must be a positive number of minutes (got {minutes:g})")
    for name, value in (("--slo-ttft-p99-ms", ttft), ("--slo-tpot-p99-ms", tpot)):
        if value is not None and value <= 0:
            raise ConfigError(f"{name} must be a positive number of milliseconds (got {value:g})")
    slo = SLO(ttft_p99_ms=ttft, tpot_p99_ms=tpot) if ttft or tpot else None
    return LOCAL_DECISION.model_copy(update={"design": design, "margin": margin, "max_requests_per_level": budget,
                                             "slo": slo, **more})


def compare_local(
    levels: Levels = ",".join(map(str, _SWEEP.concurrency)),
    num_prompts: NumPrompts = MAIN_BLOCK,
    output_len: OutputLen = MAIN_OUTPUT_LEN,
    dataset: Dataset = _WORKLOAD.source,
    prompts_file: PromptsFile = None,
    temperatures: Temperatures = None,
    search: Search = MAIN_SEARCH,
    budget_minutes: BudgetMinutes = MAIN_BUDGET_MINUTES,
    design: Design = LOCAL_DECISION.design,
    margin: Margin = LOCAL_DECISION.margin,
    max_requests_per_level: Budget = MAIN_LEVEL_REQUESTS,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Then run the setting (behind specsweep route) "
                                         "against always on and always off.")] = True,
    slo_ttft: SloTtft = None,
    slo_tpot: SloTpot = None,
    results: Results = LOCAL_BENCHMARK.results,
) -> None:
    """The main job: llama.cpp baseline vs draft speculation on this machine's CPU (compare-engine with its
    defaults), then the comparison table, the answer and where the data and report are."""
    from flows.compare_speculation import compare_engine  # Prefect loads with the command, not with --help

    setup_logging()
    t0 = time.monotonic()
    try:
        decision = _decision(design, margin, max_requests_per_level, slo_ttft, slo_tpot, budget_minutes=budget_minutes,
                             verify=verify)
        benchmark = _benchmark(levels, num_prompts, output_len, results, dataset, prompts_file, temperatures, search)
        result = _run(compare_engine(settings=engines.local_settings(), benchmark=benchmark, decision=decision))
    except SpecsweepError as exc:
        fail(exc)
    _print_comparison(result, t0)


def compare_speculation(
    engine: Engine = None,
    settings: Annotated[Optional[Path], typer.Option(
        help="The engine's settings (JSON, as the flow's settings parameter; {\"engine\": \"sglang\", \"simulate\": "
        "true} rehearses SGLang on its simulator); default the local llama.cpp's.")] = None,
    host_file: HostFile = None,
    levels: Levels = ",".join(map(str, _SWEEP.concurrency)),
    num_prompts: NumPrompts = _SWEEP.num_requests,
    output_len: OutputLen = _WORKLOAD.output_len,
    dataset: Dataset = "synthetic",
    prompts_file: PromptsFile = None,
    temperatures: Temperatures = None,
    search: Search = None,
    request_rate: RequestRates = None,
    budget_minutes: BudgetMinutes = None,
    design: Design = LOCAL_DECISION.design,
    alternate_by: Annotated[str, typer.Option(help="side-by-side: the servers up at once; restart: one at a time, "
                                              "restarted per block (when they do not fit together).")]
    = LOCAL_DECISION.alternate_by,
    margin: Margin = LOCAL_DECISION.margin,
    max_requests_per_level: Budget = LOCAL_DECISION.max_requests_per_level,
    verify: Annotated[bool, typer.Option(help="Then run the recommended per-batch setting against always on and "
                                         f"always off ({_SWITCHING}).")] = False,
    verify_controller: Annotated[bool | None, typer.Option(
        "--verify-controller/--no-verify-controller",
        help="With --verify: also measure the engine's own speculation controller (SGLang --speculative-adaptive, "
             "vLLM adaptive verification) and say whether the measured schedule beats, matches or loses to it. "
             "Default: where the engine has one.")] = None,
    slo_ttft: SloTtft = None,
    slo_tpot: SloTpot = None,
    results: Results = LOCAL_BENCHMARK.results,
) -> None:
    """Baseline vs speculation on any engine (the compare-engine flow, as the deployments local, sglang and vllm
    run it), with the optional verify stage."""
    from flows.compare_speculation import compare_engine  # Prefect loads with the command

    setup_logging()
    t0 = time.monotonic()
    try:
        if alternate_by not in ("side-by-side", "restart"):
            raise ConfigError(f"--alternate-by must be side-by-side or restart (got {alternate_by!r})")
        chosen = _settings(engine, settings)
        decision = _decision(design, margin, max_requests_per_level, slo_ttft, slo_tpot, alternate_by=alternate_by,
                             verify=verify, budget_minutes=budget_minutes, verify_controller=verify_controller)
        if verify:
            engines.check_verifiable(chosen.engine, "--verify")
        benchmark = _benchmark(levels, num_prompts, output_len, results, dataset, prompts_file, temperatures, search,
                               request_rate)
        result = _run(compare_engine(settings=chosen, host=host_config(host_file), benchmark=benchmark,
                                     decision=decision))
    except SpecsweepError as exc:
        fail(exc)
    _print_comparison(result, t0)


def _grid(items: list[str], method_field: str | None = None) -> dict[str, list[int | float | str]] | None:
    """``--grid`` items as the flow's grid: numbers, but the names of methods for the engine's method field."""
    grid: dict[str, list[int | float | str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--grid takes FIELD=V1,V2,... such as draft_max=2,4,8 (got {item!r})")
        if key.strip() == method_field:
            grid[key.strip()] = [v.strip() for v in values.split(",") if v.strip()]
        else:
            grid[key.strip()] = list(numbers(values, number, f"--grid {key.strip()}") or [])
    return grid or None


def _settings(engine: str | None, path: Path | None) -> EngineSettings:
    """The engine's settings from ``--settings`` (JSON) for the engine ``--engine`` names, else the file's own
    ``engine``; without a file, the local llama.cpp's."""
    try:
        data: dict[str, Any] = json.loads(path.read_text()) if path else {}
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--settings {path}: cannot read it as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--settings {path}: give a JSON object (the engine's settings)")
    name = engine or data.get("engine") or engines.LOCAL.name
    chosen = engines.get(str(name), "--engine" if engine else f"--settings {path}: engine")
    if path is None and chosen is not engines.LOCAL:
        raise ConfigError(f"--engine {name} needs --settings FILE: the model and how to start it")
    try:
        return chosen.settings.model_validate({"engine": chosen.name, **data})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, f"--settings ({chosen.name})")) from None


def tune(
    engine: Engine = None,
    settings: Annotated[Optional[Path], typer.Option(
        help="The engine's settings (JSON, as the flow's settings parameter); default the local llama.cpp's.")] = None,
    grid: Annotated[Optional[list[str]], typer.Option(
        help="A speculation field and its values, FIELD=V1,V2 (repeatable), e.g. draft_max=2,4,8; the method field "
        "spans methods, e.g. spec_type=draft-simple,ngram-simple (llama.cpp), method=ngram,eagle3 (vLLM); default the "
        "engine's small grid.")] = None,
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
        points = _grid(grid or [], engines.of_settings(chosen).method_field)
        grid_profiles(chosen, points)  # a bad grid is refused before any flow run
        decision = LOCAL_DECISION.model_copy(update={"design": "sequential", "margin": margin,
                                                     "max_requests_per_level": max_requests_per_level})
        result = _run(tune_speculation(
            settings=chosen, grid=points, host=host_config(host_file),
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
    from orchestration.host import cli_lock

    return cli_lock(host, wait_s)


def register(app: typer.Typer) -> HostGuard:
    """The entry point (group ``specsweep.commands``): add the flows' commands to ``app``; the host lock is
    what the server commands hold."""
    # A temporary local Prefect server has no network to report usage to: do not try.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    app.command("compare-local")(compare_local)
    app.command("compare-speculation")(compare_speculation)
    app.command("tune")(tune)
    return _machine_lock
