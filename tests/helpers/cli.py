"""The command line's own app, run in the test's process: for refusals, which never start anything. A
subprocess per case spent about 12 s of a loaded suite importing the command; the tests that start servers
(tests/specsweep/test_cli.py) run ``python -m specsweep.cli`` as users do. The app is assembled as
``specsweep.cli.main`` does, from the core's commands and the flows' registration, named here rather than
read from the installed entry points: this checkout's commands, whatever the environment has installed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from specsweep.cli.app import Registration

#: The loggers whose level the command sets (specsweep.cli.options.setup_logging).
LOGGERS = ("httpx", "paramiko")


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def invoke(*args: str, registrations: Sequence[Registration] | None = None) -> Ran:
    """``specsweep ARGS`` in this process: its exit code and what it wrote to stdout and stderr. ``registrations``:
    the commands' registrations (default the flows')."""
    from typer.testing import CliRunner

    from deployments.commands import register
    from specsweep.cli import assemble

    app, installed = assemble([register] if registrations is None else registrations)

    # The command sets up logging as a process of its own would: put the test process's back as it was.
    root = logging.getLogger()
    handlers, levels = list(root.handlers), {name: logging.getLogger(name).level for name in ("", *LOGGERS)}
    try:
        done = CliRunner().invoke(app, list(args), obj=installed)
    finally:
        root.handlers[:] = handlers
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        raise done.exception  # a crash, not a refusal: show its traceback
    return Ran(done.exit_code, done.stdout, done.stderr)
