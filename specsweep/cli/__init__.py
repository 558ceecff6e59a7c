"""The ``specsweep`` command's core commands: each stage alone with the same code the Prefect tasks use,
a benchmark of a running server, and the results store read back. The flows add theirs (the main
job, the grid) in ``flows/cli.py``, which is the ``specsweep`` command itself."""

from __future__ import annotations

import os

from specsweep.cli import bench, results, route, server, targets
from specsweep.cli.app import app

__all__ = ["app", "bench", "main", "results", "route", "server", "targets"]


def main() -> None:
    # A temporary local Prefect server has no network to report usage to: do not try.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    app()
