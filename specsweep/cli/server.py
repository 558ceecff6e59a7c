"""``specsweep server start|wait|kill`` and ``preset``: a server alone, with the same code the flows' tasks use."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import AbstractContextManager, nullcontext
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional  # noqa: UP035 - typer reads Optional

import typer

from specsweep import engines
from specsweep.cli.app import HostGuard, Installed, app
from specsweep.cli.options import HostFile, fail, host_config, setup_logging
from specsweep.errors import ConfigError, SpecsweepError
from specsweep.hosts import Host, open_host
from specsweep.hosts.tunnel import open_path
from specsweep.profiles import load_profile
from specsweep.server import lifecycle
from specsweep.server.api import ServerAPI
from specsweep.server.health import wait_for_health


def _unguarded(host: Host, wait_s: float) -> AbstractContextManager[None]:
    _log.warning("%s is not locked against benchmark runs: no host lock is installed (the flows' commands bring "
                 "Prefect's: install the checkout with `pip install -e .`)", host.label)
    return nullcontext()


def host_guard(ctx: typer.Context) -> HostGuard:
    """The host guard the registrations handed over (``specsweep.cli.main``), else none (a warning)."""
    installed = ctx.find_object(Installed)
    return installed.host_guard if installed is not None and installed.host_guard is not None else _unguarded


_log = logging.getLogger("specsweep.cli")


class Action(str, Enum):
    start = "start"
    wait = "wait"
    kill = "kill"


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


@app.command("server", no_args_is_help=True)
def server(
    ctx: typer.Context,
    action: Annotated[Action, typer.Argument(help="start: launch the server detached and print its handle; "
                                             "wait: wait until it answers its health check; kill: stop it and "
                                             "its leftovers and print what was killed (all JSON).")],
    profile: Annotated[Path, typer.Option("--profile", "-p", help="Server profile file (JSON or TOML).")],
    host_file: HostFile = None,
    ssh: Annotated[Optional[str], typer.Option(help="Run on [user@]host[:port] over SSH instead of locally.")] = None,
    ssh_key: Annotated[Optional[Path], typer.Option(help="Private key file for --ssh.")] = None,
    jump: Annotated[Optional[str], typer.Option(help="Reach the --ssh host through this [user@]host[:port].")] = None,
    known_hosts: Annotated[Optional[Path], typer.Option(help="known_hosts file (default ~/.ssh/known_hosts).")] = None,
    accept_unknown_host_key: Annotated[bool, typer.Option(
        "--accept-unknown-host-key", help="Trust an SSH host key not in known_hosts (logged).")] = False,
    port: Annotated[Optional[int], typer.Option(help="Override the profile's port.")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="Override the profile's bind address.")] = None,
    name: Annotated[Optional[str], typer.Option(help="Override the profile's name.")] = None,
    lock_wait_s: Annotated[float, typer.Option(
        help="start/kill: how long to wait for a machine a benchmark run holds before giving up.")] = 30.0,
    handle_file: Annotated[Optional[Path], typer.Option(
        help="Where start writes the server handle (JSON) and wait/kill read it.")] = None,
    kill_port_holder: Annotated[bool, typer.Option("--kill-port-holder",
                                                   help="start: kill whatever holds the port first.")] = False,
    timeout: Annotated[Optional[float], typer.Option(help="wait: seconds; default the profile's startup_timeout_s.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="wait: do not print the server's log lines.")] = False,
) -> None:
    """Run one server lifecycle stage (start, wait or kill) with the same code the Prefect tasks use."""
    setup_logging()
    try:
        prof = load_profile(profile, port=port, host=host, name=name)
        overrides: dict[str, Any] = {}
        if ssh:
            overrides.update(kind="ssh", ssh=_endpoint(ssh, ssh_key, known_hosts, accept_unknown_host_key))
        if jump:
            overrides["jump"] = _endpoint(jump, ssh_key, known_hosts, accept_unknown_host_key)
        cfg = host_config(host_file, overrides)
        saved = lifecycle.ServerHandle.model_validate_json(handle_file.read_text()) \
            if handle_file and handle_file.exists() and action is not Action.start else None
        guard = host_guard(ctx)
        with open_host(cfg) as h:
            result: Any
            if action is Action.start:
                with guard(h, lock_wait_s):
                    result = lifecycle.start_server(h, prof, kill_port_holder=kill_port_holder)
                if handle_file:
                    handle_file.write_text(result.model_dump_json(indent=2))
            elif action is Action.kill:
                with guard(h, lock_wait_s):
                    result = lifecycle.kill_server(h, prof, saved)
            else:
                handle = saved or lifecycle.find_handle(h, prof)
                if handle is None:
                    raise ConfigError(f"no server started by specsweep runs for port {prof.port} on {h.label}: "
                                      "start one with 'specsweep server start' or pass --handle-file")
                sink = None if quiet else (lambda line: typer.echo(f"[server] {line}", err=True))
                path = open_path(h, prof.host, prof.port)

                async def wait() -> Any:
                    async with ServerAPI(path.url, prof.api_key) as api:
                        return await wait_for_health(h, prof, handle, api, path=path, timeout_s=timeout,
                                                     on_log_line=sink)

                try:
                    result = asyncio.run(wait())
                finally:
                    path.close()
    except SpecsweepError as exc:
        fail(exc)
    typer.echo(result.model_dump_json(indent=2))


@app.command("preset")
def preset(
    name: Annotated[str, typer.Argument(help=f"One of: {', '.join(engines.preset_names())}.")],
    model_path: Annotated[Optional[str], typer.Option(help="Target model path or hub id.")] = None,
    draft_model_path: Annotated[Optional[str], typer.Option(help="Draft model path (speculative presets).")] = None,
    python: Annotated[Optional[str], typer.Option(help="Interpreter that runs the engine on the host.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write the profile here instead of printing it.")] = None,
) -> None:
    """Print (or write) a ready-made server profile as JSON, to edit or to pass to --profile."""
    try:
        prof = engines.preset(name, model_path=model_path, draft_model_path=draft_model_path, python=python)
    except SpecsweepError as exc:
        fail(exc)
    text = json.dumps(prof.model_dump(mode="json", exclude_none=True), indent=2)
    if out:
        out.write_text(text + "\n")
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text)
