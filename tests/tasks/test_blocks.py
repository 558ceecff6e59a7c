"""The ssh-host block: a saved host whose key never travels as a flow parameter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

from flows.benchmark_config import benchmark_config
from specsweep.hosts.config import build_host
from specsweep.presets import sglang_baseline
from tasks.blocks import SSHHostBlock
from tests.conftest import pids_with_marker
from tests.helpers.sshd import SSHServer, free_port


def make_block(sshd: SSHServer, key: Path, **kw: object) -> SSHHostBlock:
    return SSHHostBlock(hostname=sshd.address, port=sshd.port, user=sshd.user, private_key=key.read_text(),  # type: ignore[arg-type]
                        known_hosts=sshd.known_hosts_line(), **kw)


def test_block_builds_a_working_host(sshd: SSHServer, ssh_keys: tuple[Path, str]) -> None:
    cfg = make_block(sshd, ssh_keys[0]).host_config()
    assert cfg.kind == "ssh" and cfg.ssh is not None and cfg.ssh.known_hosts is not None
    assert oct(os.stat(cfg.ssh.known_hosts).st_mode & 0o777) == "0o600"
    with build_host(cfg) as host:
        assert host.run(["echo", "ok"]).stdout == "ok\n"
    assert ssh_keys[0].read_text() not in repr(make_block(sshd, ssh_keys[0]))


@pytest.mark.usefixtures("prefect_harness")
async def test_flow_takes_the_block_name_and_no_key_shows(sshd: SSHServer, ssh_keys: tuple[Path, str], tmp_path: Path) -> None:
    await make_block(sshd, ssh_keys[0]).save("loopback-gpu", overwrite=True)
    port = free_port()
    profile = sglang_baseline("/models/kimi", simulate=True, sim_profile="tiny-fast", sim_startup_s=0.3, port=port,
                              host="127.0.0.1", extra_args=["--api-key", "{api_key}"])
    profile = profile.model_copy(update={"api_key": SecretStr("sk-engine-secret-42"), "log_path": str(tmp_path / "server.log")})
    state = await benchmark_config(
        profile=profile, host_block="loopback-gpu", results_dir=str(tmp_path / "results"),
        sweep={"concurrency": [2], "num_requests": 6, "warmup_requests": 1},  # type: ignore[arg-type]
        workload={"input_len": 8, "output_len": 8}, return_state=True,  # type: ignore[arg-type]
    )
    assert state.is_completed(), state
    result = await state.result()
    assert result.levels[0]["completed"] == 6  # the API key reached the server: requests were accepted
    assert pids_with_marker(port) == []
    flow_run_id = state.state_details.flow_run_id
    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        from prefect.logging.handlers import APILogHandler

        await APILogHandler.aflush()
        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    key_line = [ln for ln in ssh_keys[0].read_text().splitlines() if len(ln) > 40][0]
    everything = str(run.parameters) + "\n".join(log.message for log in logs)
    everything += "".join(p.read_bytes().decode("latin-1") for p in (tmp_path / "results").rglob("*.parquet"))
    assert run.parameters["host_block"] == "loopback-gpu"
    assert key_line not in everything
    assert "sk-engine-secret-42" not in everything
