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


def test_runs_report_and_compare_from_the_store(tmp_path: Path) -> None:
    from specsweep.records import BlockRow, RunRow
    from specsweep.results.store import ResultsStore

    root = tmp_path / "res"
    store = ResultsStore(root)
    fp = {"gpu": "none (CPU)", "gpu_count": 0, "driver": None, "engine_version": "sglang x", "model": "m"}
    blocks = {"base1": {1: [100 + i % 3 for i in range(12)], 8: [300 + i % 5 for i in range(12)]},
              "spec1": {1: [150 + i % 3 for i in range(12)], 8: [200 + i % 4 for i in range(12)]}}
    for run_id, name in (("base1", "baseline"), ("spec1", "eagle3")):
        store.write_run(run_id, RunRow.model_validate(
            {"config_name": name, "engine": "sglang", "host": "local", "started_at": run_id, "status": "completed",
             "design": "alternate-restart", "sweep_json": json.dumps({"num_requests": 16}),
             "command": "python -m sglang.launch_server --speculative-algorithm EAGLE3 --speculative-draft-model-path d "
                        "--speculative-num-steps 3", **fp}))
        for i, (c, tps) in enumerate(blocks[run_id].items()):
            for rep, t in enumerate(tps):
                row = BlockRow(config_name=name, mode="concurrency", concurrency=c, level_index=i, repeat=rep,
                               output_tokens_per_s=t, completed=16, requests=16, duration_s=1.0)
                store.write_level(run_id, row.level.key, row, [])
    out = cli("runs", "--results", str(root)).stdout
    assert "base1" in out and "spec1" in out and "completed" in out
    out = cli("compare", "base1", "spec1", "--results", str(root)).stdout
    # The decision first, in one sentence (issue 43); the per-level table and status below it.
    assert out.lstrip().startswith("Off from 8. Worst case: it gives up nothing at any level measured.")
    assert "Status: decided" in out
    assert "--speculative-adaptive --speculative-adaptive-config sglang-adaptive-config.json" in out  # SGLang's form
    assert (root / "reports" / "base1--spec1" / "speedup.png").exists()
    assert json.loads((root / "reports" / "base1--spec1" / "sglang-adaptive-config.json").read_text()) == {
        "1": {"candidate_steps": [3]}, "2": {"candidate_steps": [0]}}  # off just above the last level it pays
    out = cli("report", "base1", "--results", str(root)).stdout
    assert "C=1" in out and "C=8" in out
    store.write_run("spec2", RunRow.model_validate({"config_name": "eagle3", "engine": "sglang", "host": "local",
                                                    "started_at": "x", "status": "completed",
                                                    **dict(fp, engine_version="sglang y")}))
    store.write_level("spec2", "L000", BlockRow(config_name="eagle3", mode="concurrency", concurrency=1, level_index=0,
                                                output_tokens_per_s=1.0), [])
    refused = cli("compare", "base1", "spec2", "--results", str(root), check=False)
    assert refused.returncode == 2 and "engine_version: 'sglang x' vs 'sglang y'" in refused.stderr
