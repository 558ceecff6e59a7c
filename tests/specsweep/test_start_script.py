"""How a server is launched: its environment never on a command line, its log private, and a start
whose input was cut short starts nothing."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from specsweep.errors import ServerStartError
from specsweep.hosts import LocalHost
from specsweep.hosts.base import _START_SCRIPT, env_script
from specsweep.server.lifecycle import kill_server, start_server
from tests.conftest import MakeToy, pids_with_env, wait_ready
from tests.helpers.other_user import ensure_user


@pytest.fixture
def host() -> LocalHost:
    return LocalHost()


def ps_everything() -> str:
    """What any user of the machine sees: every process's full command line."""
    return subprocess.run(["ps", "-ww", "-eo", "args="], capture_output=True, text=True, check=True).stdout


async def test_api_key_and_secret_env_are_not_on_any_command_line(host: LocalHost, make_toy: MakeToy,
                                                                  tmp_path: Path) -> None:
    key, token = "sk-engine-key-5f4e3d2c1b", "hf_private_token_0a9b8c7d"
    profile = make_toy("--print-env", "MY_API_KEY", env={"HF_TOKEN": token}, api_key_env="MY_API_KEY",
                       api_key=key)
    handle = start_server(host, profile)
    try:
        await wait_ready(host, profile, handle)
        seen = ps_everything()
        assert key not in seen and token not in seen
        assert f"MY_API_KEY={key}" in Path(handle.log_path).read_text()  # the server got it, from its environment
        environ = Path(f"/proc/{handle.pid}/environ").read_bytes().split(b"\0")
        assert f"HF_TOKEN={token}".encode() in environ
        assert stat.S_IMODE(os.stat(f"/proc/{handle.pid}/environ").st_mode) == 0o400  # only its owner reads it
    finally:
        kill_server(host, profile, handle)


def test_a_start_whose_environment_was_cut_short_starts_nothing(host: LocalHost, tmp_path: Path) -> None:
    marker = "ssw-cut-short-7781"
    env = env_script({"SOME_SETTING": "x" * 100, "SPECSWEEP_SERVER_PORT": marker})
    argv = ["sh", "-c", _START_SCRIPT, "sh", f"~/.specsweep/logs/cut-short-{os.getpid()}.log", "", "sleep", "300"]
    result = host.run(argv, input=env[: len(env) - 12])
    assert result.exit_code == 95 and "did not arrive whole" in result.stderr
    time.sleep(0.2)
    assert pids_with_env("SPECSWEEP_SERVER_PORT", marker) == []
    argv[4] = f"~/.specsweep/logs/cut-short-{os.getpid()}-whole.log"  # a log is always a new file
    whole = host.run(argv, input=env)
    try:
        assert whole.ok, whole.stderr
        # The server's environment shows in /proc once `env` has exec'd it: wait for that moment.
        deadline = time.monotonic() + 5
        while not (pids := pids_with_env("SPECSWEEP_SERVER_PORT", marker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(pids) == 1
    finally:
        time.sleep(0.2)
        for pid in pids_with_env("SPECSWEEP_SERVER_PORT", marker):  # never left behind for the next run
            os.kill(pid, 9)


async def test_each_start_logs_to_a_new_private_file_under_home(host: LocalHost, make_toy: MakeToy) -> None:
    profile = make_toy(name="private-log")
    handles = []
    try:
        for _ in range(2):
            handle = start_server(host, profile)
            handles.append(handle)
            log = Path(handle.log_path)
            assert log.parent == Path.home() / ".specsweep" / "logs"
            assert log.name.startswith(f"private-log-{profile.port}-") and handle.token[:12] in log.name
            assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700 and stat.S_IMODE(log.stat().st_mode) == 0o600
            await wait_ready(host, profile, handle)
            kill_server(host, profile, handle)
        assert handles[0].log_path != handles[1].log_path and Path(handles[0].log_path).read_text()  # kept
    finally:
        for handle in handles:
            kill_server(host, profile, handle)


def test_a_log_path_parameter_is_refused_naming_where_logs_go(make_toy: MakeToy) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="log_path is not taken: each start logs to a fresh file"):
        make_toy(log_path="~/.bashrc")


@pytest.mark.parametrize("case", ["logs-symlink", "specsweep-symlink", "writable-by-others", "another-users",
                                  "planted-at-its-name"])
def test_a_log_folder_that_is_not_private_or_a_planted_log_is_refused(
        host: LocalHost, make_toy: MakeToy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(home))  # the start script's login home
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    bashrc = target / ".bashrc"
    bashrc.write_text("# the user's own\n")
    ours, logs = home / ".specsweep", home / ".specsweep" / "logs"
    profile = make_toy()
    token = "a1b2c3d4e5f6a7b8"
    if case == "specsweep-symlink":
        ours.symlink_to(target)
    else:
        ours.mkdir(mode=0o700)
        if case == "logs-symlink":
            logs.symlink_to(target)
        elif case == "writable-by-others":
            logs.mkdir()
            logs.chmod(0o777)
        elif case == "another-users":
            info = ensure_user()
            logs.mkdir(mode=0o700)
            os.chown(logs, info.pw_uid, info.pw_gid)
        else:  # a link planted where this start's log will be: it is never followed, nor truncated
            logs.mkdir(mode=0o700)
            (logs / Path(profile.log_file(token)).name).symlink_to(bashrc)
    with pytest.raises(ServerStartError) as err:
        start_server(host, profile, token=token)
    assert "is not private" in str(err.value) and "~/.specsweep/logs" in str(err.value)
    assert bashrc.read_text() == "# the user's own\n" and sorted(p.name for p in target.iterdir()) == [".bashrc"]
    assert not host.port_listening(profile.port)
