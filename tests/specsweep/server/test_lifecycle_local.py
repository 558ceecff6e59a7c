"""Server lifecycle on this machine, with real processes that misbehave on purpose."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from specsweep.errors import HealthTimeoutError, PortBusyError, ServerCrashedError
from specsweep.hosts import LocalHost
from specsweep.server.lifecycle import find_handle, kill_server, start_server
from tests.conftest import MakeToy, pids_alive, pids_with_marker, wait_ready

#: Timing bounds and busy servers: these run when no other test does (scripts/test.sh).
pytestmark = pytest.mark.solo


@pytest.fixture
def host() -> LocalHost:
    return LocalHost()


async def test_start_wait_kill_leaves_nothing(host: LocalHost, make_toy: MakeToy) -> None:
    profile = make_toy("--listen-after", "0.3", "--warmup", "0.5")
    handle = start_server(host, profile)
    lines: list[str] = []
    report = await wait_ready(host, profile, handle, on_log_line=lines.append)
    assert report.ready and report.attempts > 1
    assert 0.7 < report.time_to_ready_s < 10
    assert any("listening on" in line for line in lines), lines  # server log forwarded while waiting
    kill = kill_server(host, profile, handle)
    assert [k.pid for k in kill.killed] == [handle.pid]
    assert kill.port_free and not host.port_listening(profile.port)
    assert pids_alive([handle.pid]) == []


async def test_startup_crash_fails_fast_with_log_tail(host: LocalHost, make_toy: MakeToy) -> None:
    profile = make_toy("--crash-after", "0.5")
    handle = start_server(host, profile)
    t0 = time.monotonic()
    with pytest.raises(ServerCrashedError) as err:
        await wait_ready(host, profile, handle)
    assert time.monotonic() - t0 < 2.0
    assert "CUDA out of memory" in str(err.value)  # the log tail is in the error
    assert f"pid {handle.pid}" in str(err.value)


async def test_never_ready_times_out_with_log_tail(host: LocalHost, make_toy: MakeToy) -> None:
    profile = make_toy("--warmup", "1000")
    handle = start_server(host, profile)
    try:
        with pytest.raises(HealthTimeoutError) as err:
            await wait_ready(host, profile, handle, timeout_s=1.5)
        message = str(err.value)
        assert "HTTP 503" in message and "listening on" in message and "startup_timeout_s" in message
    finally:
        kill_server(host, profile, handle)


async def test_unexpected_status_is_polled_again_not_ready(host: LocalHost, make_toy: MakeToy) -> None:
    profile = make_toy("--health-status", "500")
    handle = start_server(host, profile)
    try:
        with pytest.raises(HealthTimeoutError, match="HTTP 500"):
            await wait_ready(host, profile, handle, timeout_s=1.0)
    finally:
        kill_server(host, profile, handle)


async def test_readiness_probe_needs_a_generation(host: LocalHost, make_toy: MakeToy) -> None:
    profile = make_toy(readiness_probe=True)
    handle = start_server(host, profile)
    try:
        report = await wait_ready(host, profile, handle)
        assert report.probe_ok is True
    finally:
        kill_server(host, profile, handle)


def test_busy_port_names_the_holder(host: LocalHost, make_toy: MakeToy) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        profile = make_toy(port=port)
        with pytest.raises(PortBusyError) as err:
            start_server(host, profile)
        import os

        assert f"pid {os.getpid()}" in str(err.value) and str(port) in str(err.value)
    finally:
        holder.close()


async def test_busy_port_killed_first_when_asked(host: LocalHost, make_toy: MakeToy) -> None:
    stray = make_toy(name="stray")
    stray_handle = start_server(host, stray)
    await wait_ready(host, stray, stray_handle)
    profile = make_toy(port=stray.port)
    handle = start_server(host, profile, kill_port_holder=True)
    try:
        await wait_ready(host, profile, handle)
        assert pids_alive([stray_handle.pid]) == []
    finally:
        kill_server(host, profile, handle)


async def test_tree_with_grandchild_in_own_session_is_killed(host: LocalHost, make_toy: MakeToy) -> None:
    profile = make_toy("--spawn-grandchild")
    handle = start_server(host, profile)
    await wait_ready(host, profile, handle)
    deadline = time.monotonic() + 5
    while len(pids_with_marker(profile.port)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    family = pids_with_marker(profile.port)
    assert len(family) >= 3  # server, child, grandchild (sleep) in their own sessions
    sids = {int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[3]) for p in family}
    assert len(sids) >= 2
    report = kill_server(host, profile, handle)
    assert {k.pid for k in report.killed} >= set(family)
    assert pids_with_marker(profile.port) == []


async def test_sigterm_ignored_gets_sigkill(host: LocalHost, make_toy: MakeToy) -> None:
    profile = make_toy("--ignore-sigterm", kill_grace_s=0.5)
    handle = start_server(host, profile)
    await wait_ready(host, profile, handle)
    report = kill_server(host, profile, handle)
    assert [k.signal for k in report.killed] == ["SIGKILL"]
    assert pids_alive([handle.pid]) == []


def test_kill_when_nothing_runs_succeeds(host: LocalHost, make_toy: MakeToy) -> None:
    report = kill_server(host, make_toy())
    assert report.killed == [] and report.port_free


async def test_leftovers_found_without_a_handle(host: LocalHost, make_toy: MakeToy) -> None:
    """A later run (another process, no handle) finds the server by its marker and port."""
    profile = make_toy()
    handle = start_server(host, profile)
    await wait_ready(host, profile, handle)
    assert find_handle(host, profile).pid == handle.pid  # type: ignore[union-attr]
    report = kill_server(host, profile)  # no handle given
    assert handle.pid in {k.pid for k in report.killed}
    assert pids_alive([handle.pid]) == []


async def test_cleanup_patterns_narrow_never_widen(host: LocalHost, make_toy: MakeToy) -> None:
    """A pattern picks among specsweep's own escaped processes; a stranger of the same name is spared."""
    import subprocess

    profile = make_toy(cleanup_patterns=[r"^sleep 427$"])
    # A stranger: no marker, only its name matches.
    stranger = subprocess.Popen(["sleep", "427"], start_new_session=True, env={})
    # specsweep's leftovers (they carry its marker for the port): one matches the pattern, one does not.
    marker = {"SPECSWEEP_SERVER_PORT": str(profile.port)}
    escaped = subprocess.Popen(["sleep", "427"], start_new_session=True, env=marker)
    other = subprocess.Popen(["sleep", "428"], start_new_session=True, env=marker)
    try:
        report = kill_server(host, profile)
        assert {k.pid for k in report.killed} == {escaped.pid}
        assert escaped.wait(5) is not None
        assert stranger.poll() is None and other.poll() is None
        # Without patterns, every marked leftover of the port goes, still never the stranger.
        report = kill_server(host, make_toy(port=profile.port))
        assert {k.pid for k in report.killed} == {other.pid} and stranger.poll() is None
    finally:
        for p in (stranger, escaped, other):
            p.kill()


async def test_cleanup_patterns_see_the_head_of_a_long_command_line(host: LocalHost, make_toy: MakeToy) -> None:
    """A pattern is matched against the first 4096 characters of a command line only (bounded work on the
    worker): it still takes a leftover that a long argument follows, never one it names only further on."""
    import subprocess
    import sys

    marker = {"SPECSWEEP_SERVER_PORT": str(make_toy().port)}
    port = int(marker["SPECSWEEP_SERVER_PORT"])
    long_tail = "x" * 100_000 + " TAIL-ONLY"
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(427)", long_tail],
                                start_new_session=True, env=marker)
    try:
        assert kill_server(host, make_toy(port=port, cleanup_patterns=["TAIL-ONLY"])).killed == []
        assert leftover.poll() is None
        report = kill_server(host, make_toy(port=port, cleanup_patterns=[r"time\.sleep\(427\)"]))
        assert {k.pid for k in report.killed} == {leftover.pid} and leftover.wait(5) is not None
    finally:
        leftover.kill()


async def test_shell_metacharacters_arrive_literally(host: LocalHost, make_toy: MakeToy, tmp_path: Path) -> None:
    hostile = ["; touch /tmp/pwned-specsweep", "$(touch /tmp/pwned-specsweep)", "`id`", "a\nb", "it's \"quoted\"", "*"]
    out = tmp_path / "argv.json"
    profile = make_toy("--argv-file", str(out), "--", *hostile)
    handle = start_server(host, profile)
    try:
        await wait_ready(host, profile, handle)
        argv = json.loads(out.read_text())["argv"]
        assert argv[-len(hostile):] == hostile
        assert not Path("/tmp/pwned-specsweep").exists()
    finally:
        kill_server(host, profile, handle)


async def test_secrets_masked_in_handle_report_and_crash_error(host: LocalHost, make_toy: MakeToy) -> None:
    secret = "sk-live-9f8e7d6c5b4a"
    profile = make_toy("--api-key", secret, "--crash-after", "0.2", env={"HF_TOKEN": "hf_abcdefghijklmnop"})
    handle = start_server(host, profile)
    assert secret not in handle.command and "***" in handle.command
    with pytest.raises(ServerCrashedError) as err:
        await wait_ready(host, profile, handle)
    assert secret not in str(err.value)
    assert "hf_abcdefghijklmnop" not in profile.masked_env()["HF_TOKEN"]


async def test_the_wait_logs_each_new_answer_and_then_progress_not_every_attempt(
        host: LocalHost, make_toy: MakeToy, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import math

    from specsweep.server import health

    monkeypatch.setattr(health, "PROGRESS_EVERY_S", 1.0)
    profile = make_toy("--listen-after", "0.3", "--warmup", "3")  # (refused,) then HTTP 503 for 3 s, then ready
    handle = start_server(host, profile)
    try:
        with caplog.at_level("INFO"):
            report = await wait_ready(host, profile, handle)
    finally:
        kill_server(host, profile, handle)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("health attempt")]
    # Each answer when it first comes, then the same answer once a second at most, for a poll every 0.2 s or less.
    assert len(lines) <= 2 + math.ceil(report.waited_s), (report.waited_s, lines)
    assert report.attempts >= 2 * len(lines), (report.attempts, lines)
    assert sum("HTTP 503" in line for line in lines) >= 2, lines  # the wait still shows it goes on
