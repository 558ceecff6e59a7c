"""The ``specsweep`` command's core application object (each module of this package adds its commands), and
what a registration of more commands hands the core's commands (``Installed``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import typer

from specsweep.hosts import Host

SETTINGS: dict[str, Any] = dict(
    help="Does speculative decoding pay on my servers, and at what load should it be off?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help (click's): two columns that wrap to the terminal, readable in 80 columns.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)

app = typer.Typer(**SETTINGS)

#: How ``server start|kill`` holds the machine against benchmark runs while it works: ``(host, wait_s)`` -> a
#: context manager. The core holds nothing; a registration (the flows', with Prefect's host lock) gives one.
HostGuard = Callable[[Host, float], AbstractContextManager[None]]

#: A registration of more commands (the entry point group ``specsweep.commands``): it adds its commands to the
#: app it is given, and returns the host guard the server commands should hold, or None.
Registration = Callable[[typer.Typer], "HostGuard | None"]


@dataclass(frozen=True)
class Installed:
    """What the registrations handed the core's commands (typer's context object, ``ctx.obj``)."""

    host_guard: HostGuard | None = None
