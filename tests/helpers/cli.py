"""The command line's own app, run in the test's process: for refusals, which never start anything. A
subprocess per case spent about 12 s of a loaded suite importing the command; the tests that start servers
(tests/specsweep/test_cli.py) run ``python -m flows.cli`` as users do."""

from __future__ import annotations

import logging
from dataclasses import dataclass

#: The loggers whose level the command sets (specsweep.cli.options.setup_logging).
LOGGERS = ("httpx", "paramiko")


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def invoke(*args: str) -> Ran:
    """``specsweep ARGS`` in this process: its exit code and what it wrote to stdout and stderr."""
    from typer.testing import CliRunner

    from flows.cli import app

    # The command sets up logging as a process of its own would: put the test process's back as it was.
    root = logging.getLogger()
    handlers, levels = list(root.handlers), {name: logging.getLogger(name).level for name in ("", *LOGGERS)}
    try:
        done = CliRunner().invoke(app, list(args))
    finally:
        root.handlers[:] = handlers
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        raise done.exception  # a crash, not a refusal: show its traceback
    return Ran(done.exit_code, done.stdout, done.stderr)
