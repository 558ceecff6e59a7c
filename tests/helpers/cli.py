"""The command line's own app, run in the test's process: for refusals, which never start anything. A
subprocess per case spent about 12 s of a loaded suite importing the command; the tests that start servers
(tests/specsweep/test_cli.py) run ``python -m flows.cli`` as users do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def invoke(*args: str) -> Ran:
    """``specsweep ARGS`` in this process: its exit code and what it wrote to stdout and stderr."""
    from typer.testing import CliRunner

    from flows.cli import app

    done = CliRunner().invoke(app, list(args))
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        raise done.exception  # a crash, not a refusal: show its traceback
    return Ran(done.exit_code, done.stdout, done.stderr)
