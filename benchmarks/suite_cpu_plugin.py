"""pytest plugin of benchmarks/suite_cpu.py: each worker moves itself into its test file's cgroup as the file's
first test starts (its later child processes are counted there), and notes each test's wall time."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

_current: list[str] = []
_started: dict[str, float] = {}
_controller: list[bool] = [False]


def pytest_configure(config: object) -> None:
    # xdist's controller hears of every test its workers run: only the process that runs a test counts it.
    _controller[0] = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")  # type: ignore[attr-defined]


def _enter(file: str) -> None:
    root = os.environ.get("SPECSWEEP_SUITE_CGROUP")
    if not root or (_current and _current[0] == file):
        return
    group = Path(root) / file.replace("/", "__")
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    _current[:] = [file]


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    if _controller[0]:
        return
    _enter(nodeid.split("::")[0])
    _started[nodeid] = time.monotonic()


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    folder = os.environ.get("SPECSWEEP_SUITE_TIMINGS")
    if _controller[0] or not folder or nodeid not in _started:
        return
    record = {"id": nodeid, "file": nodeid.split("::")[0], "wall_s": time.monotonic() - _started.pop(nodeid)}
    name = os.environ.get("PYTEST_XDIST_WORKER", "solo")
    with open(Path(folder) / f"{name}-{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
