"""The ``specsweep`` command (``specsweep.cli:main``; ``python -m specsweep.cli`` is the same): the core's
commands (each stage alone with the same code the Prefect tasks use, a benchmark of a running server, the
results store read back) and those that installed packages register.

A package adds commands through the entry point group ``specsweep.commands`` (this checkout's
pyproject.toml registers ``deployments.commands:register``: the main job, the comparisons, the grid, run as
Prefect flows, and Prefect's host lock for ``server start|kill``). Each registration is called with the
command's app, adds its commands, and returns a host guard or None; the guard reaches the server
commands through typer's context (``Installed``). The core imports no Prefect: what a registration
brings loads only when the command runs. An editable install reads the group from the installed
metadata: after changing it, install the checkout again (``pip install -e .``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib.metadata import entry_points

import typer

from specsweep.cli import bench, results, route, server, targets
from specsweep.cli.app import SETTINGS, HostGuard, Installed, Registration, app
from specsweep.errors import ConfigError

__all__ = ["GROUP", "Installed", "Registration", "app", "assemble", "bench", "installed", "main", "results", "route",
           "server", "targets"]

#: The entry point group of command registrations.
GROUP = "specsweep.commands"


def installed() -> list[Registration]:
    """The registrations the installed packages declare (entry point group ``specsweep.commands``). One that
    cannot be loaded is left out, saying why: the core's commands still run."""
    found = []
    for ep in sorted(entry_points(group=GROUP), key=lambda ep: ep.name):
        try:
            found.append(ep.load())
        except Exception as exc:  # noqa: BLE001 - a broken package must not take the core's commands with it
            typer.echo(f"specsweep: the commands of {ep.value} ({GROUP} entry point {ep.name!r}) are missing: "
                       f"{type(exc).__name__}: {exc}", err=True)
    return found


def assemble(registrations: Iterable[Registration]) -> tuple[typer.Typer, Installed]:
    """A new app with the core's commands and each registration's, and what the registrations hand the core's
    commands. The core's app is left as it is, so that each call starts from the core alone."""
    command = typer.Typer(**SETTINGS)
    command.registered_commands = list(app.registered_commands)
    guards: list[HostGuard] = []
    for register in registrations:
        if (guard := register(command)) is not None:
            guards.append(guard)
    if len(guards) > 1:
        raise ConfigError(f"{len(guards)} installed packages each give a host lock for `specsweep server`: the "
                          f"entry points of {GROUP} may give one at most")
    if not guards:
        command.info.epilog = ("No package registered more commands (compare-local, compare-speculation, tune come "
                               "with this checkout's flows: install it with `pip install -e .`).")
    return command, Installed(host_guard=guards[0] if guards else None)


def main(registrations: Sequence[Registration] | None = None, args: Sequence[str] | None = None) -> None:
    """Run the command: the core's commands and the registrations' (default: the installed ones)."""
    command, obj = assemble(installed() if registrations is None else registrations)
    command(args=None if args is None else list(args), obj=obj)
