"""The ``specsweep`` command line. Each stage runs alone here with the same code the Prefect tasks use."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, Optional  # noqa: UP035

import typer

from specsweep.errors import ConfigError, SpecsweepError

app = typer.Typer(
    help="Benchmark LLM serving configurations and find where speculative decoding stops paying.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
server_app = typer.Typer(help="Run one server lifecycle stage: start, wait or kill.", no_args_is_help=True)
app.add_typer(server_app, name="server")

ProfileOpt = Annotated[Path, typer.Option("--profile", "-p", help="Server profile file (JSON or TOML).", exists=False)]
HostCfgOpt = Annotated[
    Optional[Path], typer.Option("--host-config", help="Host file (JSON or TOML, the flows' HostConfig). Default: this machine.")
]
SSHOpt = Annotated[Optional[str], typer.Option("--ssh", help="Run on [user@]host[:port] over SSH instead of locally.")]
KeyOpt = Annotated[Optional[Path], typer.Option("--ssh-key", help="Private key file for --ssh.")]
JumpOpt = Annotated[Optional[str], typer.Option("--jump", help="Reach the --ssh host through this [user@]host[:port].")]
KnownOpt = Annotated[Optional[Path], typer.Option("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts).")]
TrustOpt = Annotated[bool, typer.Option("--accept-unknown-host-key", help="Trust an SSH host key not in known_hosts (logged).")]
PortOpt = Annotated[Optional[int], typer.Option("--port", help="Override the profile's port.")]
BindOpt = Annotated[Optional[str], typer.Option("--host", help="Override the profile's bind address.")]
NameOpt = Annotated[Optional[str], typer.Option("--name", help="Override the profile's name.")]
LogOpt = Annotated[Optional[str], typer.Option("--log-path", help="Override the server log path on the host.")]
HandleOpt = Annotated[
    Optional[Path], typer.Option("--handle-file", help="Where start writes the server handle (JSON) and wait/kill read it.")
]


def _setup_logging(verbose: bool = True) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)-7s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("paramiko").setLevel(logging.WARNING)


def _fail(exc: BaseException) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(2 if isinstance(exc, ConfigError) else 1)


def _endpoint(spec: str, key: Path | None, known: Path | None, trust: bool) -> dict[str, Any]:
    user, _, rest = spec.rpartition("@")
    hostname, _, port = rest.partition(":")
    if port and not port.isdigit():
        raise ConfigError(f"--ssh/--jump {spec!r}: the port after ':' must be a number")
    ep: dict[str, Any] = {"hostname": hostname, "accept_unknown_host_key": trust}
    if user:
        ep["user"] = user
    if port:
        ep["port"] = int(port)
    if key:
        ep["key_path"] = str(key)
    if known:
        ep["known_hosts"] = str(known)
    return ep


def _host_config(host_config: Path | None, ssh: str | None, key: Path | None, jump: str | None,
                 known: Path | None, trust: bool):  # type: ignore[no-untyped-def]
    from pydantic import ValidationError

    from specsweep.hosts.config import HostConfig
    from specsweep.profiles import describe_validation_error, read_mapping

    data: dict[str, Any] = read_mapping(host_config) if host_config else {}
    if ssh:
        data["kind"] = "ssh"
        data["ssh"] = _endpoint(ssh, key, known, trust)
    if jump:
        data["jump"] = _endpoint(jump, key, known, trust)
    try:
        return HostConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "host config")) from None


def _profile(profile: Path, port: int | None, host: str | None, name: str | None, log_path: str | None):  # type: ignore[no-untyped-def]
    from specsweep.profiles import load_profile

    return load_profile(profile, port=port, host=host, name=name, log_path=log_path)


def _echo_model(model: Any) -> None:
    typer.echo(model.model_dump_json(indent=2))


@server_app.command("start")
def server_start(
    profile: ProfileOpt,
    host_config: HostCfgOpt = None,
    ssh: SSHOpt = None,
    ssh_key: KeyOpt = None,
    jump: JumpOpt = None,
    known_hosts: KnownOpt = None,
    accept_unknown_host_key: TrustOpt = False,
    port: PortOpt = None,
    host: BindOpt = None,
    name: NameOpt = None,
    log_path: LogOpt = None,
    kill_port_holder: Annotated[bool, typer.Option(help="Kill whatever holds the port first.")] = False,
    handle_file: HandleOpt = None,
) -> None:
    """Launch the server detached and print its handle (JSON)."""
    from specsweep.hosts.config import build_host
    from specsweep.lifecycle import start_server

    _setup_logging()
    try:
        prof = _profile(profile, port, host, name, log_path)
        cfg = _host_config(host_config, ssh, ssh_key, jump, known_hosts, accept_unknown_host_key)
        with build_host(cfg) as h:
            handle = start_server(h, prof, kill_port_holder=kill_port_holder)
    except SpecsweepError as exc:
        _fail(exc)
    if handle_file:
        handle_file.write_text(handle.model_dump_json(indent=2))
    _echo_model(handle)


@server_app.command("wait")
def server_wait(
    profile: ProfileOpt,
    host_config: HostCfgOpt = None,
    ssh: SSHOpt = None,
    ssh_key: KeyOpt = None,
    jump: JumpOpt = None,
    known_hosts: KnownOpt = None,
    accept_unknown_host_key: TrustOpt = False,
    port: PortOpt = None,
    host: BindOpt = None,
    name: NameOpt = None,
    log_path: LogOpt = None,
    timeout: Annotated[Optional[float], typer.Option(help="Seconds to wait; default the profile's startup_timeout_s.")] = None,
    handle_file: HandleOpt = None,
    follow_log: Annotated[bool, typer.Option(help="Print new server log lines while waiting.")] = True,
) -> None:
    """Wait until the server answers its health check; print the time to ready (JSON)."""
    from specsweep.health import wait_for_health
    from specsweep.hosts.config import build_host
    from specsweep.lifecycle import ServerHandle, find_handle

    _setup_logging()
    try:
        prof = _profile(profile, port, host, name, log_path)
        cfg = _host_config(host_config, ssh, ssh_key, jump, known_hosts, accept_unknown_host_key)
        with build_host(cfg) as h:
            if handle_file:
                handle = ServerHandle.model_validate_json(handle_file.read_text())
            else:
                found = find_handle(h, prof)
                if found is None:
                    raise ConfigError(
                        f"no server started by specsweep runs for port {prof.port} on {h.label}: "
                        "start one with 'specsweep server start' or pass --handle-file"
                    )
                handle = found
            sink = (lambda line: typer.echo(f"[server] {line}", err=True)) if follow_log else None
            report = asyncio.run(wait_for_health(h, prof, handle, address=cfg.address, timeout_s=timeout, on_log_line=sink))
    except SpecsweepError as exc:
        _fail(exc)
    _echo_model(report)


@server_app.command("kill")
def server_kill(
    profile: ProfileOpt,
    host_config: HostCfgOpt = None,
    ssh: SSHOpt = None,
    ssh_key: KeyOpt = None,
    jump: JumpOpt = None,
    known_hosts: KnownOpt = None,
    accept_unknown_host_key: TrustOpt = False,
    port: PortOpt = None,
    host: BindOpt = None,
    name: NameOpt = None,
    log_path: LogOpt = None,
    handle_file: HandleOpt = None,
) -> None:
    """Kill the server, its leftovers on the port and matching processes; print what was killed (JSON)."""
    from specsweep.hosts.config import build_host
    from specsweep.lifecycle import ServerHandle, kill_server

    _setup_logging()
    try:
        prof = _profile(profile, port, host, name, log_path)
        cfg = _host_config(host_config, ssh, ssh_key, jump, known_hosts, accept_unknown_host_key)
        handle = ServerHandle.model_validate_json(handle_file.read_text()) if handle_file and handle_file.exists() else None
        with build_host(cfg) as h:
            report = kill_server(h, prof, handle)
    except SpecsweepError as exc:
        _fail(exc)
    _echo_model(report)


@app.command("preset")
def preset(
    name: Annotated[str, typer.Argument(help="sglang-baseline, sglang-eagle3, llamacpp-baseline or llamacpp-speculative.")],
    model_path: Annotated[Optional[str], typer.Option(help="Target model path (SGLang presets).")] = None,
    draft_model_path: Annotated[Optional[str], typer.Option(help="Draft model path (speculative presets).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write the profile here instead of printing it.")] = None,
) -> None:
    """Print (or write) a ready-made server profile as JSON, to edit or to pass to --profile."""
    from specsweep import presets

    try:
        prof = presets.by_name(name, model_path=model_path, draft_model_path=draft_model_path)
    except SpecsweepError as exc:
        _fail(exc)
    text = json.dumps(prof.model_dump(mode="json", exclude_none=True), indent=2)
    if out:
        out.write_text(text + "\n")
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text)


@app.command("make-models")
def make_models_cmd(
    out: Annotated[Path, typer.Option(help="Directory for target.gguf and draft.gguf.")] = Path("data/models"),
    seed: Annotated[int, typer.Option(help="Random seed: the same seed writes the same files.")] = 1234,
    force: Annotated[bool, typer.Option(help="Rewrite even if models with the same spec exist.")] = False,
    measure: Annotated[bool, typer.Option(help="Serve the pair and measure the draft acceptance rate (~15 s).")] = True,
) -> None:
    """Write the tiny llama.cpp target and draft models used by the local target."""
    import time

    from specsweep.llamacpp.models import ModelSpec, make_models

    t0 = time.perf_counter()
    files = make_models(out, ModelSpec(seed=seed), force=force)
    mb = lambda p: p.stat().st_size / 1e6  # noqa: E731
    typer.echo(f"target {files.target} ({files.target_params / 1e6:.1f}M parameters, {mb(files.target):.1f} MB)")
    typer.echo(f"draft  {files.draft} ({files.draft_params / 1e6:.1f}M parameters, {mb(files.draft):.1f} MB; "
               f"the target's first {files.spec.draft_layers} block(s))")
    typer.echo(f"vocabulary {files.vocab_size} tokens; written or reused in {time.perf_counter() - t0:.1f} s")
    if measure:
        from specsweep.llamacpp.acceptance import measure_acceptance

        rate, tokens = measure_acceptance(files)
        typer.echo(f"draft acceptance measured: {rate:.0%} of {tokens} drafted tokens (draft-simple, draft max 4)")
    else:
        typer.echo("draft acceptance expected: about 80 % (draft-simple, draft max 4); --measure measures it")


def _csv_numbers(text: str | None, kind: type, name: str) -> list | None:  # type: ignore[type-arg]
    if text is None:
        return None
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{name} must be a comma-separated list of numbers, like 1,8,64 (got {text!r})") from None


@app.command("bench", context_settings={"help_option_names": ["-h", "--help"]})
def bench(
    url: Annotated[str, typer.Option(help="Base URL of a running server, e.g. http://127.0.0.1:30000.")],
    concurrency: Annotated[str, typer.Option(help="Closed-loop levels, comma-separated.")] = "1,8,64",
    request_rate: Annotated[Optional[str], typer.Option(help="Open-loop levels instead: requests/s, comma-separated.")] = None,
    num_prompts: Annotated[int, typer.Option(help="Measured requests per level.")] = 64,
    input_len: Annotated[int, typer.Option(help="Prompt length in tokens (synthetic prompts).")] = 128,
    output_len: Annotated[int, typer.Option(help="Tokens to generate per request.")] = 128,
    endpoint: Annotated[str, typer.Option(help="completions, chat or generate (SGLang native).")] = "completions",
    dataset: Annotated[str, typer.Option(help="synthetic, bundled or file.")] = "synthetic",
    prompts_file: Annotated[Optional[Path], typer.Option(help="JSONL or Parquet prompts (with --dataset file).")] = None,
    warmup: Annotated[int, typer.Option(help="Warm-up requests per level, not counted.")] = 2,
    repeats: Annotated[int, typer.Option(help="Times each level is measured.")] = 1,
    workers: Annotated[int, typer.Option(help="Client processes per level.")] = 1,
    stop_at_saturation: Annotated[bool, typer.Option(help="Stop once throughput stops rising while latency grows.")] = False,
    timeout: Annotated[float, typer.Option(help="Per-request timeout in seconds.")] = 300.0,
    api_key_env: Annotated[Optional[str], typer.Option(help="Read the API key from this environment variable.")] = None,
    name: Annotated[str, typer.Option(help="Configuration name stored with the run.")] = "bench",
    results: Annotated[Path, typer.Option(help="Results root (Parquet).")] = Path("data/results"),
) -> None:
    """Benchmark a server that is already running; store every level as it ends and print the summary."""
    import os

    from pydantic import ValidationError
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specsweep.bench.config import RequestOptions, SweepConfig, WorkloadConfig
    from specsweep.bench.measure import BenchTarget, run_row, run_sweep
    from specsweep.fingerprint import server_fingerprint
    from specsweep.profiles import describe_validation_error
    from specsweep.report import summary_table
    from specsweep.store import ResultsStore, new_run_id, now_iso

    _setup_logging(verbose=False)
    console = Console(stderr=True)
    try:
        try:
            api_key = os.environ.get(api_key_env) if api_key_env else None
            if api_key_env and not api_key:
                raise ConfigError(f"--api-key-env {api_key_env}: that environment variable is not set")
            target = BenchTarget(base_url=url, request=RequestOptions(endpoint=endpoint, api_key=api_key, timeout_s=timeout))  # type: ignore[arg-type]
            workload = WorkloadConfig(source=dataset, input_len=input_len, output_len=output_len,  # type: ignore[arg-type]
                                      prompts_file=prompts_file)
            sweep = SweepConfig(concurrency=_csv_numbers(concurrency, int, "--concurrency") or [1],
                                request_rate=_csv_numbers(request_rate, float, "--request-rate"), num_requests=num_prompts,
                                warmup_requests=warmup, repeats=repeats, workers=workers, stop_at_saturation=stop_at_saturation)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, "benchmark options")) from None
        store = ResultsStore(results)
        store.check_writable()
        run_id = new_run_id(name)
        started = now_iso()
        fp = asyncio.run(server_fingerprint(url))
        store.write_run(run_id, run_row(config_name=name, engine="unknown", base_url=url, workload=workload, sweep=sweep,
                                        started_at=started, status="running", fingerprint=fp))
        total = len(sweep.levels()) * repeats * num_prompts
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as progress:
            bar = progress.add_task("requests", total=total)

            def level_done(row: dict[str, Any]) -> None:
                lvl = row["concurrency"] if row["concurrency"] is not None else f"{row['request_rate_per_s']:g}/s"
                progress.console.print(
                    f"level {lvl}: {row['output_tokens_per_s']:.1f} output tok/s, TTFT median "
                    f"{(row['ttft_ms_median'] or 0):.1f} ms, {row['failed']} failed"
                    + ("  [client was the bottleneck]" if row["client_bottleneck"] else "")
                )

            status, error = "completed", None
            try:
                rows = asyncio.run(run_sweep(target, workload, sweep, store=store, run_id=run_id, config_name=name,
                                             on_level=level_done, on_request=lambda _r: progress.advance(bar)))
            except BaseException as exc:
                status, error = ("interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"), str(exc)
                raise
            finally:
                store.write_run(run_id, run_row(config_name=name, engine="unknown", base_url=url, workload=workload,
                                                sweep=sweep, started_at=started, status=status, fingerprint=fp,
                                                ended_at=now_iso(), error=error))
    except SpecsweepError as exc:
        _fail(exc)
    except RuntimeError as exc:
        _fail(exc)
    Console(width=None if sys.stdout.isatty() else 200).print(summary_table(rows, title=f"{name} ({url})"))
    typer.echo(f"run id: {run_id}")
    typer.echo(f"results: {store.root}/levels/run_id={run_id}/ (levels), requests/ and runs/ beside it")


@app.command("sim", context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})
def sim(ctx: typer.Context) -> None:
    """Run the SGLang-compatible simulator (SGLang's launch flags plus --sim-profile, --startup-s, --seed, --fault-*).

    Pass --help after 'sim' for its own options."""
    from specsweep.sim.server import main as sim_main

    sim_main(list(ctx.args))


ResultsOpt = Annotated[Path, typer.Option("--results", help="Results root (Parquet).")]


def _console():  # type: ignore[no-untyped-def]
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


def print_comparison(comp: Any) -> None:
    from rich.table import Table

    table = Table(title=f"speculation: {comp.speculative} vs {comp.baseline}")
    for col in ("concurrency", "baseline tok/s", "speculative tok/s", "ratio", "verdict", "TTFT p50 ms (base/spec)",
                "ITL p50 ms (base/spec)", "accept"):
        table.add_column(col, justify="left" if col == "verdict" else "right")
    for r in comp.levels:
        ci = f" [{r.ratio_low:.2f}-{r.ratio_high:.2f}]" if r.ratio_low is not None else ""
        acc = (f"{r.speculative_accept_length:.2f}" if r.speculative_accept_length else
               f"{r.speculative_acceptance_rate:.0%}" if r.speculative_acceptance_rate else "-")
        table.add_row(str(r.concurrency), f"{r.baseline_tokens_per_s:,.1f}", f"{r.speculative_tokens_per_s:,.1f}",
                      f"{r.ratio:.2f}{ci}", r.verdict,
                      f"{r.baseline_ttft_ms or 0:,.1f} / {r.speculative_ttft_ms or 0:,.1f}",
                      f"{r.baseline_itl_ms or 0:.2f} / {r.speculative_itl_ms or 0:.2f}", acc)
    console = _console()
    console.print(table)
    console.print(f"[bold]{comp.recommendation}[/bold]")
    console.print(f"crossover: {comp.crossover if comp.crossover is not None else 'none within the measured levels'}")
    console.print(f"vLLM V1 speculative-config: num_speculative_tokens_per_batch_size = "
                  f"{json.dumps(comp.vllm_num_speculative_tokens_per_batch_size)}")
    console.print(f"SGLang router: {json.dumps(comp.router)}")
    pol = comp.policy_mean_tokens_per_s
    console.print(f"mean output tok/s over the levels: always off {pol['always_off']:,.1f}, always on "
                  f"{pol['always_on']:,.1f}, as recommended (on only where it clearly pays) {pol['switch_per_level']:,.1f}")
    for note in comp.notes:
        console.print(f"note: {note}")


@app.command("demo")
def demo(
    levels: Annotated[str, typer.Option(help="Concurrency levels, comma-separated.")] = "1,2,4,8",
    num_prompts: Annotated[int, typer.Option(help="Measured requests per level.")] = 8,
    output_len: Annotated[int, typer.Option(help="Tokens per request.")] = 64,
    repeats: Annotated[int, typer.Option(help="Repeats per level (for the noise estimate).")] = 2,
    results: ResultsOpt = Path("data/results"),
) -> None:
    """The main job: compare-speculation on this machine, llama.cpp baseline vs draft speculation (tiny models)."""
    import time

    from flows.compare_speculation import compare_local_llamacpp
    from specsweep.bench.config import SweepConfig, WorkloadConfig

    _setup_logging()
    t0 = time.monotonic()
    try:
        sweep = SweepConfig(concurrency=_csv_numbers(levels, int, "--levels") or [1], num_requests=num_prompts,
                            warmup_requests=2, repeats=repeats)
        result = asyncio.run(compare_local_llamacpp(workload=WorkloadConfig(input_len=16, output_len=output_len),
                                                    sweep=sweep, results_dir=str(results.resolve())))
    except SpecsweepError as exc:
        _fail(exc)
    print_comparison(result.comparison)
    root = Path(result.results_dir)
    plots = root / "plots" / f"{result.baseline.run_id}--{result.speculative.run_id}"
    typer.echo(f"\nruns: {result.baseline.run_id} (baseline), {result.speculative.run_id} (speculative)")
    typer.echo(f"Parquet data: {root}/runs, {root}/levels, {root}/requests (partitioned by run_id)")
    typer.echo(f"plots and report: {plots}/ (throughput.png, latency.png, speedup.png, report.md)")
    typer.echo(f"total time: {time.monotonic() - t0:.0f} s")


@app.command("runs")
def runs_cmd(results: ResultsOpt = Path("data/results")) -> None:
    """List the runs in the store."""
    from rich.table import Table

    from specsweep.store import ResultsStore

    store = ResultsStore(results)
    df = store.runs()
    if df.empty:
        typer.echo(f"no runs in {results}")
        return
    levels = store.levels()
    counts = levels.groupby("run_id").size().to_dict() if not levels.empty else {}
    table = Table(title=f"runs in {results}")
    for col in ("run id", "started", "configuration", "engine", "host", "levels", "status"):
        table.add_column(col)
    for _, r in df.sort_values("started_at").iterrows():
        table.add_row(str(r["run_id"]), str(r["started_at"]), str(r["config_name"]), str(r["engine"]),
                      str(r["host"]), str(counts.get(r["run_id"], 0)), str(r["status"]))
    _console().print(table)


@app.command("report")
def report_cmd(
    run_ids: Annotated[Optional[list[str]], typer.Argument(help="Run ids; default the latest run.")] = None,
    results: ResultsOpt = Path("data/results"),
) -> None:
    """Print the per-level tables of runs, and write plots when two runs are given (baseline first)."""
    from specsweep.report import summary_table
    from specsweep.store import ResultsStore

    store = ResultsStore(results)
    try:
        if not run_ids:
            runs = store.runs()
            if runs.empty:
                raise ConfigError(f"no runs in {results}")
            run_ids = [str(runs.sort_values("started_at").iloc[-1]["run_id"])]
        for rid in run_ids:
            run = store.run(rid)
            rows = store.levels([rid]).to_dict("records")
            _console().print(summary_table(rows, title=f"{run['config_name']} — {rid} ({run['status']})"))
        if len(run_ids) == 2:
            _compare(store, run_ids[0], run_ids[1], allow_mismatch=False, plots=True)
    except SpecsweepError as exc:
        _fail(exc)


def _compare(store: Any, a: str, b: str, *, allow_mismatch: bool, plots: bool) -> None:
    from specsweep.compare import compare_runs, comparison_markdown
    from specsweep.plots import comparison_plots

    comp = compare_runs(store, a, b, allow_mismatch=allow_mismatch)
    print_comparison(comp)
    if plots:
        out = store.root / "plots" / f"{a}--{b}"
        paths = comparison_plots(comp, out)
        (out / "report.md").write_text(comparison_markdown(comp) + "\n")
        typer.echo("plots: " + ", ".join(str(p) for p in paths.values()))


@app.command("compare")
def compare_cmd(
    baseline_run: Annotated[str, typer.Argument(help="Run id of the baseline.")],
    speculative_run: Annotated[str, typer.Argument(help="Run id of the speculative configuration.")],
    allow_mismatch: Annotated[bool, typer.Option(help="Compare even if GPU, driver, engine or model differ.")] = False,
    results: ResultsOpt = Path("data/results"),
) -> None:
    """Compare two stored runs (made at different times): per-level ratio, crossover, recommendation, plots."""
    from specsweep.store import ResultsStore

    try:
        _compare(ResultsStore(results), baseline_run, speculative_run, allow_mismatch=allow_mismatch, plots=True)
    except SpecsweepError as exc:
        _fail(exc)


def main() -> None:
    import os

    # A temporary local Prefect server has no network to report usage to: do not try.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    app()


if __name__ == "__main__":
    main()
