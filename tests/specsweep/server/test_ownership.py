"""On a shared host, a kill takes only what specsweep started, as the user it runs as.

Another user (a real second Unix user) runs a process named like SGLang's scheduler that
listens on a nearby port, and one that even copies specsweep's marker; this user runs a
process of their own on the server's port. None of them may be killed, and a start on a held
port names the holder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from specsweep.engines.sglang import baseline as sglang_baseline
from specsweep.errors import PortBusyError
from specsweep.hosts import HostConfig, LocalHost, open_host
from specsweep.server.lifecycle import kill_server, start_server
from tests.conftest import MakeToy, pids_alive, wait_ready
from tests.helpers.other_user import OTHER_USER, ensure_user, listener_argv, process_as
from tests.helpers.sshd import free_port


@pytest.fixture(scope="module")
def other_user() -> str:
    ensure_user()
    return OTHER_USER


@pytest.fixture
def host() -> LocalHost:
    return LocalHost()


def test_another_users_sglang_named_process_survives_a_kill(host: LocalHost, other_user: str) -> None:
    """The report: another user's `sglang::` process on 39111 was killed by `server kill` for 39999."""
    theirs, ours = free_port(), free_port()
    profile = sglang_baseline("/models/x", port=ours)
    spoof = {"SPECSWEEP_SERVER_PORT": str(ours)}  # even copying specsweep's marker does not make it ours
    with process_as(other_user, listener_argv(theirs, "sglang::scheduler_TP0"), listen_port=theirs) as named, \
            process_as(other_user, ["sleep", "600"], env=spoof) as marked:
        report = kill_server(host, profile)
        assert report.killed == []
        assert named.poll() is None and marked.poll() is None


def test_another_users_port_holder_is_named_and_never_killed(host: LocalHost, make_toy: MakeToy,
                                                             other_user: str) -> None:
    port = free_port()
    profile = make_toy(port=port)
    with process_as(other_user, listener_argv(port, "their-training-job"), listen_port=port) as holder:
        report = kill_server(host, profile)
        assert report.killed == [] and not report.port_free
        with pytest.raises(PortBusyError) as err:
            start_server(host, profile)
        message = str(err.value)
        assert f"pid {holder.pid}" in message and f"user {other_user}" in message
        assert "their-training-job" in message and "kill_port_holder" in message
        # Asking to take the port does not extend to other users' processes.
        with pytest.raises(PortBusyError, match="only takes the SSH user's own processes"):
            start_server(host, profile, kill_port_holder=True)
        assert holder.poll() is None


async def test_own_port_holder_is_taken_only_when_asked(host: LocalHost, make_toy: MakeToy) -> None:
    port = free_port()
    code = f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", code, "my-notebook"], start_new_session=True)
    try:
        profile = make_toy(port=port)
        for _ in range(100):
            if host.port_listening(port):
                break
            time.sleep(0.05)
        assert kill_server(host, profile).killed == []  # not specsweep's: the leftover kill leaves it
        with pytest.raises(PortBusyError) as err:
            start_server(host, profile)
        assert f"pid {holder.pid}" in str(err.value) and "my-notebook" in str(err.value)
        assert holder.poll() is None
        handle = start_server(host, profile, kill_port_holder=True)
        try:
            await wait_ready(host, profile, handle)
            assert holder.wait(5) is not None
        finally:
            kill_server(host, profile, handle)
    finally:
        holder.kill()


async def test_a_handle_kills_only_its_own_start(host: LocalHost, make_toy: MakeToy) -> None:
    """Two servers of specsweep on two ports: the final kill of one leaves the other running."""
    a, b = make_toy(name="a"), make_toy(name="b")
    ha, hb = start_server(host, a), start_server(host, b)
    try:
        await wait_ready(host, a, ha)
        await wait_ready(host, b, hb)
        report = kill_server(host, a, ha)
        assert {k.pid for k in report.killed} == {ha.pid}
        assert pids_alive([hb.pid]) == [hb.pid]
    finally:
        kill_server(host, b, hb)


def test_processes_carry_their_owner(host: LocalHost, other_user: str) -> None:
    with process_as(other_user, ["sleep", "600"]) as proc:
        procs = {p.pid: p for p in host.processes()}
        assert procs[proc.pid].user == other_user and procs[proc.pid].uid != os.getuid()
        assert procs[os.getpid()].uid == os.getuid() == host.login_uid()


async def test_over_ssh_as_root_only_specsweeps_processes_go_and_ps_shows_no_secret(
        ssh_host_config: HostConfig, make_toy: MakeToy, other_user: str) -> None:
    """The SSH user is root, as on most GPU hosts: it could kill anything, and must not."""
    key = "sk-remote-engine-key-77aa66bb"
    profile = make_toy(api_key_env="TOY_API_KEY", api_key=key, env={"HF_TOKEN": "hf_remote_token_1234abcd"})
    theirs = free_port()
    spoof = {"SPECSWEEP_SERVER_PORT": str(profile.port)}
    with open_host(ssh_host_config) as host, \
            process_as(other_user, listener_argv(theirs, "sglang::scheduler_TP0"), listen_port=theirs) as named, \
            process_as(other_user, ["sleep", "600"], env=spoof) as marked:
        assert host.login_uid() == 0
        handle = start_server(host, profile)
        try:
            await wait_ready(host, profile, handle)
            seen = host.run(["ps", "-ww", "-eo", "args="]).stdout
            assert key not in seen and "hf_remote_token_1234abcd" not in seen
            leftovers = kill_server(host, profile)  # the leftover kill: specsweep's marked processes only
            assert {k.pid for k in leftovers.killed} == {handle.pid}
            assert named.poll() is None and marked.poll() is None
        finally:
            kill_server(host, profile, handle)
