"""``specsweep bench``: benchmark a server that is already running, every level stored as it ends."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Optional  # noqa: UP035 - typer reads Optional

import typer
from pydantic import SecretStr, ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specsweep import engines
from specsweep.bench.config import RequestSpec, SweepConfig, WorkloadConfig
from specsweep.bench.remote import on_host
from specsweep.bench.workload import check_source
from specsweep.cli.app import app
from specsweep.cli.options import (
    RESULTS_DEFAULT,
    HostFile,
    InputLen,
    Levels,
    NumPrompts,
    OutputLen,
    Results,
    fail,
    host_config,
    numbers,
    setup_logging,
)
from specsweep.errors import ConfigError, SpecsweepError
from specsweep.hosts import Host, open_host
from specsweep.hosts.tunnel import ServerPath, open_path
from specsweep.profiles import describe_validation_error
from specsweep.records import BlockRow
from specsweep.reports.tables import console, summary_table
from specsweep.results import ResultsStore, new_run_id
from specsweep.results.run_record import RunRecorder
from specsweep.server.fingerprint import server_fingerprint
from specsweep.sweep import (
    BenchTarget,
    SweepJob,
    measure_level,
    new_run_row,
    repeats,
    run_levels,
    set_aside,
)


@app.command("bench")
def bench(
    url: Annotated[Optional[str], typer.Option(
        help="Base URL of a running server the client reaches directly, e.g. http://127.0.0.1:30000.")] = None,
    host_file: HostFile = None,
    port: Annotated[Optional[int], typer.Option(help="With --host-config: the server's port on that host.")] = None,
    bind: Annotated[str, typer.Option(help="With --host-config: the address the server listens on there.")] = "127.0.0.1",
    concurrency: Levels = "1,8,64",
    request_rate: Annotated[Optional[str], typer.Option(
        help="Open-loop levels instead: requests/s, comma-separated.")] = None,
    num_prompts: NumPrompts = 64,
    input_len: InputLen = 128,
    output_len: OutputLen = 128,
    endpoint: Annotated[Optional[str], typer.Option(
        help="completions, chat or generate (the native /generate). Default: chat for chat prompt sets, "
             "completions for text.")] = None,
    engine: Annotated[str, typer.Option(help=f"What the server runs: {', '.join(engines.ENGINES)} or "
                                        f"{engines.CUSTOM}.")] = engines.CUSTOM,
    dataset: Annotated[str, typer.Option(
        help="synthetic (generated words: not real traffic), mt-bench, humaneval, sharegpt, file or bundled.")
    ] = "synthetic",
    prompts_file: Annotated[Optional[Path], typer.Option(
        help="JSONL (prompts or chat messages) or Parquet (with --dataset file); ShareGPT JSON (sharegpt).")] = None,
    ignore_eos: Annotated[Optional[bool], typer.Option(
        "--ignore-eos/--natural-ends", help="Force every output to --output-len (default: only for synthetic "
        "prompts), or let real prompts end naturally under it.")] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (always sent).")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling (always sent).")] = 1.0,
    tokenizer: Annotated[Optional[Path], typer.Option(
        help="The model's tokenizer.json (or its folder): count prompt tokens here (default: the server's "
             "/tokenize).")] = None,
    warmup: Annotated[int, typer.Option(help="Warm-up requests per level, not counted.")] = 2,
    repeat: Annotated[int, typer.Option("--repeats", help="Times each level is measured.")] = 1,
    workers: Annotated[int, typer.Option(help="Client processes per level.")] = 1,
    stop_at_saturation: Annotated[bool, typer.Option(
        "--stop-at-saturation", help="Stop once throughput stops rising while latency grows.")] = False,
    timeout: Annotated[float, typer.Option(help="Per-request timeout in seconds.")] = 300.0,
    api_key_env: Annotated[Optional[str], typer.Option(help="Read the API key from this environment variable.")] = None,
    name: Annotated[str, typer.Option(help="Configuration name stored with the run.")] = "bench",
    results: Results = RESULTS_DEFAULT,
) -> None:
    """Benchmark a server that is already running; store every level as it ends and print the summary."""
    setup_logging(verbose=False)
    err = Console(stderr=True)
    path: ServerPath | None = None
    connection: Host | None = None
    host_label = "unknown"
    try:
        if (url is None) == (host_file is None) or (host_file is not None and port is None):
            raise ConfigError("give --url (a server the client reaches directly), or --host-config and --port (a "
                              "server on that host, reached the way the flows reach it: an SSH tunnel for SSH hosts)")
        engines.check_name(engine, "--engine")
        if host_file is not None and port is not None:
            connection = open_host(host_config(host_file))
            path = open_path(connection, bind, port, expect_listening=True)
            url, host_label = path.url, connection.label
            typer.echo(f"reaching port {port} on {connection.label} through {path.how} ({url})", err=True)
        assert url is not None
        try:
            api_key = os.environ.get(api_key_env) if api_key_env else None
            if api_key_env and not api_key:
                raise ConfigError(f"--api-key-env {api_key_env}: that environment variable is not set")
            target = BenchTarget(base_url=url, engine=engine, request=RequestSpec(
                endpoint=endpoint, api_key=SecretStr(api_key) if api_key else None, timeout_s=timeout,
                ignore_eos=ignore_eos, temperature=temperature, top_p=top_p))
            sweep = SweepConfig(concurrency=numbers(concurrency, int, "--concurrency") or [1],
                                request_rate=numbers(request_rate, float, "--request-rate"), num_requests=num_prompts,
                                warmup_requests=warmup, repeats=repeat, workers=workers,
                                stop_at_saturation=stop_at_saturation)
            store = ResultsStore(results)
            job = SweepJob(run_id=new_run_id(name), config_name=name, store=store, sweep=sweep,
                           workload=WorkloadConfig(source=dataset, input_len=input_len, output_len=output_len,
                                                   prompts_file=prompts_file, tokenizer=tokenizer))
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, "benchmark options")) from None
        store.check_writable()
        check_source(job.workload)
        levels = sweep_levels(sweep)
        generator = on_host(connection, bind, port) if connection is not None and port is not None else None
        if generator is not None:
            typer.echo(f"levels run on the host by {generator.python} against {generator.base_url}", err=True)
        row = new_run_row(config_name=name, engine=engine, job=job, host=host_label, base_url=url)
        with RunRecorder(store, job.run_id, row) as record, \
                Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                         console=err, transient=False) as progress:

            async def sweep_all() -> list[BlockRow]:
                async with target.api() as api:
                    record.record_fingerprint(await server_fingerprint(api, engine))
                bar = progress.add_task("requests", total=len(levels) * repeat * num_prompts)

                async def level_done(row: BlockRow, done: int, total: int) -> None:
                    if generator is not None:  # the host's load generator reports whole levels
                        progress.advance(bar, num_prompts)
                    if row.disturbed:  # measured again: a block more to go
                        progress.update(bar, total=(progress.tasks[bar].total or 0) + num_prompts)
                    progress.console.print(
                        f"level {row.label}: {row.output_tokens_per_s:.1f} output tok/s, TTFT median "
                        f"{(row.ttft_ms_median or 0):.1f} ms, {row.failed} failed"
                        + (f"  [set aside: {row.disturbed}]" if row.disturbed else
                           "  [client was the bottleneck]" if row.client_bottleneck else ""), markup=False)

                return await run_levels(
                    levels, lambda lv: measure_level(target, job, lv, on_request=lambda _r: progress.advance(bar),
                                                     on_host=generator),
                    more=repeats(repeat), stop_at_saturation=stop_at_saturation, on_level=level_done,
                    set_aside=lambda row: set_aside(job, row))

            rows = asyncio.run(sweep_all())
    except (SpecsweepError, RuntimeError) as exc:
        fail(exc)
    finally:
        if path is not None:
            path.close()
        if connection is not None:
            connection.close()
    console().print(summary_table(rows, title=f"{name} ({url})"))
    typer.echo(f"run id: {job.run_id}")
    typer.echo(f"results: {store}/levels/run_id={job.run_id}/ (levels), requests/ and runs/ beside it")
    if rows and not any(r.completed for r in rows):  # nothing was measured: say why, and fail
        fail(SpecsweepError(f"no request completed at any level: {rows[0].disturbed or 'every request failed'}"))
