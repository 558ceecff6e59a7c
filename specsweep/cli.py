"""The ``specsweep`` command line. Each stage runs alone here with the same code the Prefect tasks use."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
