"""The ``specsweep`` command is assembled from the core's commands and the registrations of the entry point group
``specsweep.commands``, each of which may hand the server commands a host guard: passed in, never assigned."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import typer

from specsweep.cli import GROUP, installed, main
from specsweep.cli.app import HostGuard
from specsweep.hosts import Host
from tests.conftest import REPO
from tests.helpers.cli import invoke
from tests.helpers.sshd import free_port


def recording(held: list[tuple[str, float]]) -> HostGuard:
    @contextmanager
    def guard(host: Host, wait_s: float) -> Iterator[None]:
        held.append((host.label, wait_s))
        yield

    return guard


def test_main_runs_a_registrations_commands_and_hands_the_server_commands_its_guard(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    held: list[tuple[str, float]] = []

    def register(app: typer.Typer) -> HostGuard:
        app.command("hello")(lambda: typer.echo("hello from a registration"))
        return recording(held)

    with pytest.raises(SystemExit) as done:
        main(registrations=[register], args=["hello"])
    assert done.value.code == 0 and "hello from a registration" in capsys.readouterr().out

    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"name": "nothing-here", "argv": ["srv"]}))
    with pytest.raises(SystemExit) as done:
        main(registrations=[register], args=["server", "kill", "--profile", str(profile), "--port", str(free_port()),
                                             "--lock-wait-s", "7"])
    assert done.value.code == 0, capsys.readouterr().err
    assert held == [("local", 7.0)]  # the kill held the machine with the registration's guard
    assert json.loads(capsys.readouterr().out)["killed"] == []


def test_without_a_guard_the_server_commands_say_the_machine_is_not_locked(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"name": "nothing-here", "argv": ["srv"]}))
    done = invoke("server", "kill", "--profile", str(profile), "--port", str(free_port()), registrations=[])
    assert done.returncode == 0, done.stderr
    assert "local is not locked against benchmark runs" in caplog.text
    help_text = invoke("--help", registrations=[]).stdout
    assert not re.search(r"^  compare-local  ", help_text, re.MULTILINE) and "pip install -e ." in help_text


def test_two_guards_are_refused() -> None:
    held: list[tuple[str, float]] = []
    with pytest.raises(Exception, match="may give one at most"):
        main(registrations=[lambda app: recording(held), lambda app: recording(held)], args=["--help"])


def test_pyproject_declares_the_flows_registration_the_command_reads() -> None:
    from deployments.commands import register

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["specsweep"] == "specsweep.cli:main"
    declared = project["entry-points"][GROUP]
    assert EntryPoint("flows", declared["flows"], GROUP).load() is register
    # Installed from this checkout (pip install -e .), the environment declares it too.
    assert register in installed(), "the installed metadata lacks the flows' registration: pip install -e ."


def test_python_m_specsweep_cli_is_the_command_and_the_core_loads_no_prefect() -> None:
    layer = ('prefect.', 'flows', 'tasks', 'orchestration', 'deployments')
    probe = ("import sys; import specsweep.cli; "
             f"print(sorted(m for m in sys.modules if m == 'prefect' or m.startswith({layer!r})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]"
    help_text = subprocess.run([sys.executable, "-m", "specsweep.cli", "--help"], capture_output=True, text=True,
                               timeout=60, check=True).stdout
    assert all(name in help_text for name in ("server", "bench", "compare-local", "compare-speculation", "tune"))


def test_a_package_whose_registration_cannot_load_leaves_the_core_commands_running(tmp_path: Path) -> None:
    """Another installed package declares a registration that fails to import: the command says so and runs."""
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{GROUP}]\nbroken = no_such_module_here:register\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "specsweep.cli", "--help"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 0 and "bench" in done.stdout, done.stderr
    assert "the commands of no_such_module_here:register" in done.stderr and "ModuleNotFoundError" in done.stderr
