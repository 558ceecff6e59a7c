"""One lock per machine, however it is spelled, taken by the command line too; the hooks find their own start
records however many variables the Prefect server holds."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import VariableCreate
from prefect.concurrency.asyncio import concurrency
from prefect.settings import PREFECT_API_URL

from orchestration.host import _limit, lock_name
from specsweep.hosts import HostConfig, LocalHost, SSHEndpoint, open_host
from tasks.started import StartRecord, record_start, recorded_starts
from tests.conftest import pids_with_marker, toy_profile
from tests.helpers.sshd import SSHServer

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_two_spellings_of_one_machine_are_one_lock(sshd: SSHServer, ssh_keys: tuple[Path, str], tmp_path: Path) -> None:
    """127.0.0.1 and localhost reach the same sshd: one machine, one lock (the host key decides, not the name);
    this machine itself, reached without SSH, is another (its machine id)."""
    kind, key = sshd.host_key_pub.split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n[localhost]:{sshd.port} {kind} {key}\n")

    def reach(name: str) -> HostConfig:
        return HostConfig(kind="ssh", ssh=SSHEndpoint(hostname=name, port=sshd.port, user=sshd.user, key_path=ssh_keys[0],
                                                      known_hosts=known, use_agent=False))

    with open_host(reach("127.0.0.1")) as a, open_host(reach("localhost")) as b:
        assert a.label != b.label
        assert lock_name(a.identity()) == lock_name(b.identity())
        assert lock_name(a.identity()) != lock_name(LocalHost().identity())
        assert a.identity().startswith("ssh host key ") and "SHA256:" in a.identity()


async def test_the_command_line_does_not_start_a_server_on_a_machine_a_run_holds(tmp_path: Path) -> None:
    profile = toy_profile(tmp_path)
    path = tmp_path / "profile.json"
    path.write_text(profile.model_dump_json())
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    name = lock_name(LocalHost().identity())
    await _limit(name)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "specsweep.cli", "server", *args, "--profile", str(path)],
                              capture_output=True, text=True, timeout=120, env=env)

    async with concurrency(name, occupy=1, strict=True, lease_duration=60):  # as a benchmark run holds it
        held = await asyncio.to_thread(cli, "start", "--lock-wait-s", "2")
    assert held.returncode != 0 and "is held by a benchmark run" in held.stderr, held.stderr
    assert "--lock-wait-s" in held.stderr and pids_with_marker(profile.port) == []
    # Free again: the command takes the lock for as long as it works, and gives it back.
    started = await asyncio.to_thread(cli, "start", "--lock-wait-s", "10")
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["port"] == profile.port
    killed = await asyncio.to_thread(cli, "kill", "--lock-wait-s", "10")
    assert killed.returncode == 0, killed.stderr
    assert pids_with_marker(profile.port) == []
    async with get_client() as client:
        assert (await client.read_global_concurrency_limit_by_name(name)).active_slots == 0


async def test_the_hooks_find_their_starts_among_any_number_of_variables() -> None:
    """Past the API's 200 variables a page (sorted by name), a run's own start records are still found."""
    filler = [f"a-filler-{i:03d}" for i in range(250)]
    run = str(uuid.uuid4())
    records = [StartRecord(flow_run=run, host="local", profile="toy", port=20000 + i, token=f"{i:024x}")
               for i in range(205)]
    async with get_client() as client:
        for n in filler:
            await client.create_variable(VariableCreate(name=n, value=1))
    try:
        for record in records:
            await record_start(record)
        found = await asyncio.to_thread(recorded_starts, run)
        assert sorted(r.token for r in found) == sorted(r.token for r in records)
        assert await asyncio.to_thread(recorded_starts, str(uuid.uuid4())) == []
    finally:
        async with get_client() as client:
            for n in [*filler, *(f"specsweep-start-{run}-{r.token}" for r in records)]:
                await client.delete_variable_by_name(n)
