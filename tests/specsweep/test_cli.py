"""The command line runs each stage alone, with the same code as the tasks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import pids_with_marker, toy_profile


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "specsweep.cli", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_help_lists_the_stages() -> None:
    out = cli("--help").stdout
    assert "server" in out and "preset" in out
    out = cli("server", "--help").stdout
    assert all(word in out for word in ("start", "wait", "kill"))


def test_start_wait_kill_from_the_command_line(tmp_path: Path) -> None:
    profile = toy_profile(tmp_path, "--warmup", "0.5", "--api-key", "sk-cli-secret-1234")
    path = tmp_path / "profile.json"
    data = json.loads(profile.model_dump_json())
    port = data.pop("port")
    path.write_text(json.dumps(data))
    handle_file = tmp_path / "handle.json"

    start = cli("server", "start", "--profile", str(path), "--port", str(port), "--handle-file", str(handle_file))
    handle = json.loads(start.stdout)
    assert handle["port"] == port and handle["pid"] > 0
    assert "sk-cli-secret-1234" not in start.stdout + start.stderr

    wait = cli("server", "wait", "--profile", str(path), "--port", str(port))  # finds the server without the handle
    assert json.loads(wait.stdout)["ready"] is True
    assert "[server] toy server pid" in wait.stderr and "sk-cli-secret-1234" not in wait.stderr

    kill = cli("server", "kill", "--profile", str(path), "--port", str(port), "--handle-file", str(handle_file))
    assert [k["pid"] for k in json.loads(kill.stdout)["killed"]] == [handle["pid"]]
    assert pids_with_marker(port) == []


def test_bad_profile_is_refused_with_the_field_name(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"name": "x", "argv": ["srv"], "port": 0, "colour": "red"}))
    proc = cli("server", "start", "--profile", str(path), check=False)
    assert proc.returncode == 2
    assert "port: Input should be greater than or equal to 1 (got 0)" in proc.stderr
    assert "colour: unknown field" in proc.stderr


def test_bad_ssh_spec_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"name": "x", "argv": ["srv"]}))
    proc = cli("server", "kill", "--profile", str(path), "--ssh", "root@gpu:twenty-two", check=False)
    assert proc.returncode == 2 and "must be a number" in proc.stderr


def test_preset_writes_a_profile_the_server_commands_read(tmp_path: Path) -> None:
    out = tmp_path / "eagle.json"
    cli("preset", "sglang-eagle3", "--model-path", "/m/kimi", "--draft-model-path", "/m/eagle", "--out", str(out))
    data = json.loads(out.read_text())
    assert "EAGLE3" in data["argv"] and data["engine"] == "sglang"
    proc = cli("preset", "sglang-eagle3", "--model-path", "/m/kimi", check=False)
    assert proc.returncode == 2 and "draft_model_path is required" in proc.stderr
