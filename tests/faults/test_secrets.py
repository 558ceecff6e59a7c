"""Secrets and trust: nothing a run leaves behind shows the SSH key or the API key it used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prefect.blocks.system import Secret
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from flows.benchmark_config import benchmark_config
from flows.server_lifecycle import server_lifecycle
from specsweep.engines.sglang import baseline as sglang_baseline
from tests.conftest import pids_with_marker, toy_profile
from tests.helpers.logs import flow_logs, server_log
from tests.helpers.sshd import SSHServer, free_port
from tests.orchestration.test_blocks import make_block

pytestmark = pytest.mark.usefixtures("prefect_harness")

API_KEY = "sk-engine-secret-42-do-not-leak"


def cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "specsweep.cli", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


async def test_nothing_a_run_leaves_shows_the_ssh_key_or_the_api_key(
    sshd: SSHServer, ssh_keys: tuple[Path, str], tmp_path: Path
) -> None:
    # The SSH key lives in an ssh-host block, the engine's API key in a Secret block: the flow
    # run's parameters carry only their names.
    await make_block(sshd, ssh_keys[0]).save("loopback-gpu", overwrite=True)
    await Secret(value=API_KEY).save("engine-key", overwrite=True)  # type: ignore[call-arg]
    port = free_port()
    # The server is told the key twice: as its API key, and in an option it does not know,
    # which it prints into its log (forwarded into the run log line by line).
    profile = sglang_baseline("/models/kimi", simulate=True, sim_profile="tiny-fast", sim_startup_s=0.3, port=port,
                              host="127.0.0.1", extra_args=["--api-key", "{api_key}", "--admin-api-key", "{api_key}"])
    profile = profile.model_copy(update={"api_key_secret": "engine-key"})
    results = tmp_path / "results"
    state = await benchmark_config(
        profile=profile, host={"block": "loopback-gpu"}, return_state=True,  # type: ignore[arg-type]
        benchmark={"sweep": {"concurrency": [2], "num_requests": 6, "warmup_requests": 1},  # type: ignore[arg-type]
                   "workload": {"input_len": 8, "output_len": 8}, "results": str(results)},
    )
    assert state.is_completed(), state
    result = await state.result()
    assert result.levels[0].completed == 6  # the key reached the server: it accepted the requests
    assert pids_with_marker(port) == []
    assert API_KEY in server_log(profile.name, port).read_text()  # the server itself did print it

    flow_run_id = state.state_details.flow_run_id
    logs = await flow_logs(flow_run_id)
    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    run_id = result.run_id
    left_behind = {
        "parameters": str(run.parameters),
        "logs": "\n".join(logs),
        "artifacts": "\n".join(f"{a.key} {a.description} {a.data}" for a in artifacts),
        "results files": "\n".join(p.read_bytes().decode("latin-1") for p in results.rglob("*") if p.is_file()),
        "CLI": cli("runs", "--results", str(results)) + cli("report", run_id, "--results", str(results)),
    }
    # Each place really holds the run's traces, so that finding nothing means something.
    assert run.parameters["host"] == {"block": "loopback-gpu"} and "engine-key" in left_behind["parameters"]
    assert any("[server]" in m and "--admin-api-key" in m for m in logs)  # the printed key went through the log
    assert len(artifacts) >= 2 and run_id in left_behind["CLI"] and len(left_behind["results files"]) > 1000
    key_lines = [ln for ln in ssh_keys[0].read_text().splitlines() if len(ln) > 40]
    for place, text in left_behind.items():
        assert API_KEY not in text, f"the API key shows in the {place}"
        assert not any(line in text for line in key_lines), f"the SSH key shows in the {place}"


async def test_a_key_given_as_a_flow_parameter_is_refused_before_anything_runs(tmp_path: Path) -> None:
    port = free_port()
    profile = sglang_baseline("/models/kimi", simulate=True, sim_profile="tiny-fast", port=port).as_parameters()
    state = await benchmark_config(profile={**profile, "api_key": API_KEY}, return_state=True,  # type: ignore[arg-type]
                                   benchmark={"request": {"api_key": API_KEY},  # type: ignore[arg-type]
                                              "results": str(tmp_path / "results")})
    assert state.is_failed()
    assert "profile: Value error, api_key is not accepted" in state.message  # type: ignore[operator]
    assert "benchmark.request: Value error, api_key is not accepted" in state.message  # type: ignore[operator]
    assert "api_key_secret" in state.message  # type: ignore[operator]
    assert API_KEY not in state.message  # type: ignore[operator]
    assert not (tmp_path / "results").exists() and pids_with_marker(port) == []


async def test_secret_environment_reaches_the_server_and_nowhere_else(tmp_path: Path) -> None:
    token = "hf_secret_token_do_not_leak_77"
    await Secret(value=token).save("hf-token", overwrite=True)  # type: ignore[call-arg]
    port = free_port()
    # The toy server echoes the variable into its log at start, as servers that print their
    # configuration do; that line is forwarded into the run log.
    profile = toy_profile(tmp_path, "--print-env", "HF_TOKEN", port=port, env_secrets={"HF_TOKEN": "hf-token"})
    state = await server_lifecycle(profile=profile.as_parameters(), return_state=True)  # type: ignore[arg-type]
    assert state.is_completed(), state.message
    assert f"HF_TOKEN={token}" in server_log(profile.name, port).read_text()  # the server had it
    logs = await flow_logs(state.state_details.flow_run_id)
    assert any("[server] HF_TOKEN=" in m for m in logs)
    async with get_client() as client:
        run = await client.read_flow_run(state.state_details.flow_run_id)
    assert run.parameters["profile"]["env_secrets"] == {"HF_TOKEN": "hf-token"}
    assert token not in str(run.parameters) and not any(token in m for m in logs)
    assert pids_with_marker(port) == []


async def test_an_ssh_key_given_as_a_flow_parameter_is_refused_and_a_secret_block_works(
        sshd: SSHServer, ssh_keys: tuple[Path, str], known_hosts: Path, tmp_path: Path) -> None:
    key_text = ssh_keys[0].read_text()
    port = free_port()
    profile = toy_profile(tmp_path, port=port).as_parameters()
    login = {"hostname": sshd.address, "port": sshd.port, "user": sshd.user, "known_hosts": str(known_hosts),
             "use_agent": False}
    for field, value in (("private_key", key_text), ("passphrase", "correct horse battery")):
        state = await server_lifecycle(profile=profile, return_state=True,  # type: ignore[arg-type]
                                       host={"kind": "ssh", "ssh": {**login, field: value}})  # type: ignore[arg-type]
        assert state.is_failed()
        message = state.message or ""
        assert f"{field} is not accepted in a flow's host parameters" in message and "host.block" in message
        assert f"{field}_secret" in message and value not in message and key_text[40:80] not in message
    assert pids_with_marker(port) == []
    # The same login with the key in a Secret block: the run reads it; its parameters name the block only.
    await Secret(value=key_text).save("gpu-ssh-key", overwrite=True)  # type: ignore[call-arg]
    host = {"kind": "ssh", "ssh": {**login, "private_key_secret": "gpu-ssh-key"}}
    state = await server_lifecycle(profile=profile, host=host, return_state=True)  # type: ignore[arg-type]
    assert state.is_completed(), state.message
    async with get_client() as client:
        run = await client.read_flow_run(state.state_details.flow_run_id)
    assert run.parameters["host"]["ssh"]["private_key_secret"] == "gpu-ssh-key"
    key_lines = [ln for ln in key_text.splitlines() if len(ln) > 40]
    assert not any(line in str(run.parameters) for line in key_lines)
    assert pids_with_marker(port) == []
