"""The ``specsweep`` command line. Each stage runs alone here with the same code the Prefect tasks use."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional  # noqa: UP035

import typer

from specsweep.errors import ConfigError, SpecsweepError

if TYPE_CHECKING:
    from rich.console import Console

    from specsweep.hosts import HostConfig
    from specsweep.profiles import ServerProfile
    from specsweep.store import ResultsStore

app = typer.Typer(
    help="Benchmark LLM serving configurations and find where speculative decoding stops paying.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
ProfileOpt = Annotated[Path, typer.Option("--profile", "-p", help="Server profile file (JSON or TOML).", exists=False)]
HostCfgOpt = Annotated[
    Optional[Path], typer.Option("--host-config", help="Host file (JSON or TOML, the flows' HostConfig). Default: this machine.")
]
SSHOpt = Annotated[Optional[str], typer.Option("--ssh", help="Run on \\[user@]host\\[:port] over SSH instead of locally.")]
KeyOpt = Annotated[Optional[Path], typer.Option("--ssh-key", help="Private key file for --ssh.")]
JumpOpt = Annotated[Optional[str], typer.Option("--jump", help="Reach the --ssh host through this \\[user@]host\\[:port].")]
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
                 known: Path | None, trust: bool) -> HostConfig:
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


def _profile(profile: Path, port: int | None, host: str | None, name: str | None,
             log_path: str | None) -> ServerProfile:
    from specsweep.profiles import load_profile

    return load_profile(profile, port=port, host=host, name=name, log_path=log_path)


def _echo_model(model: Any) -> None:
    typer.echo(model.model_dump_json(indent=2))


class Action(str, Enum):
    start = "start"
    wait = "wait"
    kill = "kill"


@app.command("server", no_args_is_help=True)
def server(
    action: Annotated[Action, typer.Argument(help="start: launch the server detached and print its handle; "
                                             "wait: wait until it answers its health check; kill: stop it and "
                                             "its leftovers and print what was killed (all JSON).")],
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
    kill_port_holder: Annotated[bool, typer.Option(help="start: kill whatever holds the port first.")] = False,
    timeout: Annotated[Optional[float], typer.Option(help="wait: seconds; default the profile's startup_timeout_s.")] = None,
    follow_log: Annotated[bool, typer.Option(help="wait: print new server log lines while waiting.")] = True,
) -> None:
    """Run one server lifecycle stage (start, wait or kill) with the same code the Prefect tasks use."""
    from specsweep import lifecycle
    from specsweep.health import wait_for_health
    from specsweep.hosts import open_host
    from specsweep.server_api import ServerAPI
    from specsweep.tunnel import open_path

    _setup_logging()
    try:
        prof = _profile(profile, port, host, name, log_path)
        cfg = _host_config(host_config, ssh, ssh_key, jump, known_hosts, accept_unknown_host_key)
        saved = lifecycle.ServerHandle.model_validate_json(handle_file.read_text()) \
            if handle_file and handle_file.exists() and action.value != "start" else None
        with open_host(cfg) as h:
            if action.value == "start":
                result: Any = lifecycle.start_server(h, prof, kill_port_holder=kill_port_holder)
                if handle_file:
                    handle_file.write_text(result.model_dump_json(indent=2))
            elif action.value == "kill":
                result = lifecycle.kill_server(h, prof, saved)
            else:
                handle = saved or lifecycle.find_handle(h, prof)
                if handle is None:
                    raise ConfigError(f"no server started by specsweep runs for port {prof.port} on {h.label}: "
                                      "start one with 'specsweep server start' or pass --handle-file")
                sink = (lambda line: typer.echo(f"[server] {line}", err=True)) if follow_log else None

                path = open_path(h, cfg, prof.host, prof.port)

                async def wait() -> Any:
                    async with ServerAPI(path.url, prof.api_key) as api:
                        return await wait_for_health(h, prof, handle, api, path=path, timeout_s=timeout,
                                                     on_log_line=sink)

                try:
                    result = asyncio.run(wait())
                finally:
                    path.close()
    except SpecsweepError as exc:
        _fail(exc)
    _echo_model(result)


@app.command("preset")
def preset(
    name: Annotated[str, typer.Argument(help="sglang-baseline, sglang-eagle3, sim-baseline, sim-eagle3, llamacpp-baseline, "
                                        "llamacpp-speculative, vllm-baseline, vllm-eagle3, vllm-draft or vllm-ngram.")],
    model_path: Annotated[Optional[str], typer.Option(help="Target model path (SGLang and vLLM presets).")] = None,
    draft_model_path: Annotated[Optional[str], typer.Option(help="Draft model path (speculative presets).")] = None,
    python: Annotated[Optional[str], typer.Option(help="Interpreter that runs vLLM or SGLang on the host.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write the profile here instead of printing it.")] = None,
) -> None:
    """Print (or write) a ready-made server profile as JSON, to edit or to pass to --profile."""
    from specsweep import presets

    try:
        prof = presets.by_name(name, model_path=model_path, draft_model_path=draft_model_path, python=python)
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


def _csv_numbers(text: str | None, kind: type, name: str) -> list | None:
    if text is None:
        return None
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{name} must be a comma-separated list of numbers, like 1,8,64 (got {text!r})") from None


@app.command("bench", context_settings={"help_option_names": ["-h", "--help"]})
def bench(
    url: Annotated[Optional[str], typer.Option(help="Base URL of a running server the client reaches directly, "
                                               "e.g. http://127.0.0.1:30000.")] = None,
    host_config: HostCfgOpt = None,
    port: Annotated[Optional[int], typer.Option(help="With --host-config: the server's port on that host.")] = None,
    bind: Annotated[str, typer.Option(help="With --host-config: the address the server listens on there.")] = "127.0.0.1",
    concurrency: Annotated[str, typer.Option(help="Closed-loop levels, comma-separated.")] = "1,8,64",
    request_rate: Annotated[Optional[str], typer.Option(help="Open-loop levels instead: requests/s, comma-separated.")] = None,
    num_prompts: Annotated[int, typer.Option(help="Measured requests per level.")] = 64,
    input_len: Annotated[int, typer.Option(help="Prompt length in tokens (synthetic prompts).")] = 128,
    output_len: Annotated[int, typer.Option(help="Tokens to generate per request.")] = 128,
    endpoint: Annotated[str, typer.Option(help="completions, chat or generate (SGLang native).")] = "completions",
    engine: Annotated[str, typer.Option(help="sglang, vllm, llamacpp or custom (what the server runs).")] = "custom",
    dataset: Annotated[str, typer.Option(help="synthetic, bundled or file.")] = "synthetic",
    prompts_file: Annotated[Optional[Path], typer.Option(help="JSONL or Parquet prompts (with --dataset file).")] = None,
    tokenizer: Annotated[Optional[Path], typer.Option(
        help="The model's tokenizer.json (or its folder): count prompt tokens here (default: the server's /tokenize).")] = None,
    warmup: Annotated[int, typer.Option(help="Warm-up requests per level, not counted.")] = 2,
    repeats: Annotated[int, typer.Option(help="Times each level is measured.")] = 1,
    workers: Annotated[int, typer.Option(help="Client processes per level.")] = 1,
    stop_at_saturation: Annotated[bool, typer.Option(help="Stop once throughput stops rising while latency grows.")] = False,
    timeout: Annotated[float, typer.Option(help="Per-request timeout in seconds.")] = 300.0,
    api_key_env: Annotated[Optional[str], typer.Option(help="Read the API key from this environment variable.")] = None,
    name: Annotated[str, typer.Option(help="Configuration name stored with the run.")] = "bench",
    results: Annotated[str, typer.Option(help="Results root (Parquet): a folder or a URL.")] = "data/results",
) -> None:
    """Benchmark a server that is already running; store every level as it ends and print the summary."""
    import os

    from pydantic import SecretStr, ValidationError
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from specsweep.bench.config import RequestOptions, SweepConfig, WorkloadConfig
    from specsweep.bench.workload import check_source
    from specsweep.fingerprint import server_fingerprint
    from specsweep.hosts import open_host
    from specsweep.profiles import describe_validation_error
    from specsweep.records import LevelRow
    from specsweep.report import summary_table
    from specsweep.store import ResultsStore, new_run_id
    from specsweep.sweep import BenchTarget, RunRecorder, SweepJob, measure_level, new_run_row, points, run_levels
    from specsweep.sweep import repeats as fixed_repeats
    from specsweep.tunnel import ServerPath, open_path

    _setup_logging(verbose=False)
    console = Console(stderr=True)
    path: ServerPath | None = None
    connection = None
    host_label = "unknown"
    try:
        if (url is None) == (host_config is None) or (host_config is not None and port is None):
            raise ConfigError("give --url (a server the client reaches directly), or --host-config and --port (a "
                              "server on that host, reached the way the flows reach it: an SSH tunnel for SSH hosts)")
        if host_config is not None and port is not None:
            cfg = _host_config(host_config, None, None, None, None, False)
            connection = open_host(cfg)
            path = open_path(connection, cfg, bind, port, expect_listening=True)
            url, host_label = path.url, cfg.label
            typer.echo(f"reaching port {port} on {cfg.label} through {path.how} ({url})", err=True)
        assert url is not None
        try:
            api_key = os.environ.get(api_key_env) if api_key_env else None
            if api_key_env and not api_key:
                raise ConfigError(f"--api-key-env {api_key_env}: that environment variable is not set")
            target = BenchTarget(base_url=url, engine=engine, request=RequestOptions(
                endpoint=endpoint, api_key=SecretStr(api_key) if api_key else None, timeout_s=timeout))
            sweep = SweepConfig(concurrency=_csv_numbers(concurrency, int, "--concurrency") or [1],
                                request_rate=_csv_numbers(request_rate, float, "--request-rate"), num_requests=num_prompts,
                                warmup_requests=warmup, repeats=repeats, workers=workers, stop_at_saturation=stop_at_saturation)
            store = ResultsStore(results)
            job = SweepJob(run_id=new_run_id(name), config_name=name, results=store.url, sweep=sweep,
                           workload=WorkloadConfig(source=dataset, input_len=input_len, output_len=output_len,
                                                   prompts_file=prompts_file, tokenizer=tokenizer))
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, "benchmark options")) from None
        store.check_writable()
        check_source(job.workload)
        levels = points(sweep)
        on_host = path.on_host if path is not None else None
        with RunRecorder(store, job.run_id, new_run_row(config_name=name, engine=engine, job=job, host=host_label,
                                                        base_url=url)) as record, \
                Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                         console=console, transient=False) as progress:

            async def sweep_all() -> list[LevelRow]:
                async with target.api() as api:
                    record.record_fingerprint(await server_fingerprint(api))
                bar = progress.add_task("requests", total=len(levels) * repeats * num_prompts)

                async def level_done(row: LevelRow, done: int, total: int) -> None:
                    if on_host is not None:  # the host's load generator reports whole levels
                        progress.advance(bar, num_prompts)
                    progress.console.print(
                        f"level {row.label}: {row.output_tokens_per_s:.1f} output tok/s, TTFT median "
                        f"{(row.ttft_ms_median or 0):.1f} ms, {row.failed} failed"
                        + ("  [client was the bottleneck]" if row.client_bottleneck else ""))

                return await run_levels(
                    levels,
                    lambda lv: measure_level(target, job, lv, on_request=lambda _r: progress.advance(bar), on_host=on_host),
                    more=fixed_repeats(repeats), stop_at_saturation=stop_at_saturation, on_level=level_done)

            rows = asyncio.run(sweep_all())
    except (SpecsweepError, RuntimeError) as exc:
        _fail(exc)
    finally:
        if path is not None:
            path.close()
        if connection is not None:
            connection.close()
    _console().print(summary_table(rows, title=f"{name} ({url})"))
    typer.echo(f"run id: {job.run_id}")
    typer.echo(f"results: {store}/levels/run_id={job.run_id}/ (levels), requests/ and runs/ beside it")


@app.command("sim", context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})
def sim(ctx: typer.Context) -> None:
    """Run the SGLang-compatible simulator (SGLang's launch flags plus --sim-profile, --startup-s, --seed, --fault-*).

    Pass --help after 'sim' for its own options."""
    from specsweep.sim.server import main as sim_main

    sim_main(list(ctx.args))


ResultsOpt = Annotated[str, typer.Option("--results", help="Results root (Parquet): a folder or a URL.")]


def _console() -> Console:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


@app.command("runs")
def runs_cmd(results: ResultsOpt = "data/results") -> None:
    """List the runs in the store."""
    from rich.table import Table

    from specsweep.store import ResultsStore

    store = ResultsStore(results)
    df = store.runs()
    if df.empty:
        typer.echo(f"no runs in {store}")
        return
    levels = store.levels()
    counts = levels.groupby("run_id").size().to_dict() if not levels.empty else {}
    table = Table(title=f"runs in {store}")
    for col in ("run id", "started", "configuration", "engine", "host", "levels", "status"):
        table.add_column(col)
    for _, r in df.sort_values("started_at").iterrows():
        table.add_row(str(r["run_id"]), str(r["started_at"]), str(r["config_name"]), str(r["engine"]),
                      str(r["host"]), str(counts.get(r["run_id"], 0)), str(r["status"]))
    _console().print(table)


@app.command("report")
def report_cmd(
    run_ids: Annotated[Optional[list[str]], typer.Argument(help="Run ids; default the latest run.")] = None,
    results: ResultsOpt = "data/results",
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
            _console().print(summary_table(store.level_rows(rid), title=f"{run.config_name} — {rid} ({run.status})"))
        if len(run_ids) == 2:
            _compare(store, run_ids[0], run_ids[1], allow_mismatch=False, margin=None)
    except SpecsweepError as exc:
        _fail(exc)


def _compare(store: ResultsStore, a: str, b: str, *, allow_mismatch: bool, margin: float | None) -> None:
    from specsweep.compare import compare_runs, write_report
    from specsweep.decision import DecisionConfig
    from specsweep.report import print_comparison

    spec_run = store.run(b)
    decision = (DecisionConfig.model_validate_json(spec_run.decision_json) if spec_run.decision_json
                else DecisionConfig())
    update: dict[str, Any] = {"allow_mismatch": allow_mismatch or decision.allow_mismatch}
    if margin is not None:
        update["margin"] = margin
    comp = compare_runs(store, a, b, decision=decision.model_copy(update=update))
    print_comparison(comp, _console())
    urls = write_report(comp, store)
    typer.echo("report: " + ", ".join(urls.values()))


@app.command("compare")
def compare_cmd(
    baseline_run: Annotated[str, typer.Argument(help="Run id of the baseline.")],
    speculative_run: Annotated[str, typer.Argument(help="Run id of the speculative configuration.")],
    allow_mismatch: Annotated[bool, typer.Option(help="Compare even if GPU, driver, engine or model differ.")] = False,
    margin: Annotated[Optional[float], typer.Option(help="Equivalence margin (0.03: ±3 %); default the run's own.")] = None,
    results: ResultsOpt = "data/results",
) -> None:
    """Compare two stored runs: per-level verdicts, the answer, engine settings, the report folder."""
    from specsweep.store import ResultsStore

    try:
        _compare(ResultsStore(results), baseline_run, speculative_run, allow_mismatch=allow_mismatch, margin=margin)
    except SpecsweepError as exc:
        _fail(exc)


def main() -> None:
    import os

    # A temporary local Prefect server has no network to report usage to: do not try.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    app()


if __name__ == "__main__":
    main()
