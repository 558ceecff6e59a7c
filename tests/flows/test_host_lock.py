"""One lock per machine, however it is spelled, taken by the command line too; the hooks find their own start
records however many variables the Prefect server holds; a hold whose holder is gone with its lease is freed,
a live holder's never."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import VariableCreate
from prefect.concurrency.asyncio import concurrency
from prefect.settings import PREFECT_API_URL

from specsweep.hosts import HostConfig, LocalHost, SSHEndpoint, open_host
from tasks import host
from tasks.host import _limit, cli_lock, host_lock, lock_name
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
        return subprocess.run([sys.executable, "-m", "flows.cli", "server", *args, "--profile", str(path)],
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


@flow(name="take-the-host")
async def take_the_host(release: float = 0.0) -> float:
    """Wait for this machine's lock as a benchmark run does; how long it waited."""
    t0 = time.monotonic()
    async with host_lock(LocalHost()):
        waited = time.monotonic() - t0
        await asyncio.sleep(release)
    return waited


async def test_a_hold_no_live_lease_accounts_for_is_freed_for_the_next_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a Ctrl-C of the main job leaves: its temporary Prefect server went down with it, so the slot is still
    counted in the database, its recorded lease is known to no server, and nothing would ever free it. The next
    run sees that no recorded holder is alive and takes the host."""
    monkeypatch.setattr(host, "RECLAIM_EVERY_S", 1.0)
    name = lock_name(LocalHost().identity())
    await _limit(name)
    gone = f"specsweep-lease-{uuid.uuid4()}"
    async with get_client() as client:
        await client.increment_concurrency_slots(names=[name], slots=1, mode="concurrency")
        await client.create_variable(VariableCreate(name=gone, value={"lease": str(uuid.uuid4()), "lock": name}))
    waited = await asyncio.wait_for(take_the_host(), 60)  # without the check it waits forever
    # Two looks RECLAIM_CONFIRM_S apart, then Prefect's own next try for the slot.
    assert waited < 20, waited
    async with get_client() as client:
        assert await client.read_variable_by_name(gone) is None
        assert (await client.read_global_concurrency_limit_by_name(name)).active_slots == 0


async def test_a_live_holder_keeps_the_host_however_long_the_next_run_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run holding the host and the command line holding it: the next run waits them out, through many looks."""
    monkeypatch.setattr(host, "RECLAIM_EVERY_S", 1.0)
    name = lock_name(LocalHost().identity())
    await _limit(name)

    async def held() -> bool:
        async with get_client() as client:
            return (await client.read_global_concurrency_limit_by_name(name)).active_slots == 1

    holding = asyncio.create_task(take_the_host(release=12.0))
    while not await held():
        await asyncio.sleep(0.1)
    assert await take_the_host() >= 8  # about the 12 s the first run held it, less its own start
    await holding

    def command_line(seconds: float) -> None:  # `specsweep server start|kill` hold it while they work
        with cli_lock(LocalHost(), wait_s=10):
            time.sleep(seconds)

    cli = asyncio.create_task(asyncio.to_thread(command_line, 10.0))
    while not await held():
        await asyncio.sleep(0.1)
    assert await take_the_host() >= 7
    await cli
