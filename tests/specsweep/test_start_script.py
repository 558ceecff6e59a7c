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
    log = tmp_path / "logs" / "s.log"
    argv = ["sh", "-c", _START_SCRIPT, "sh", str(log), "", "sleep", "300"]
    result = host.run(argv, input=env[: len(env) - 12])
    assert result.exit_code == 95 and "did not arrive whole" in result.stderr
    time.sleep(0.2)
    assert pids_with_env("SPECSWEEP_SERVER_PORT", marker) == []
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


async def test_default_log_is_private_under_home(host: LocalHost, make_toy: MakeToy) -> None:
    profile = make_toy(log_path=None, name="private-log")
    handle = start_server(host, profile)
    try:
        expected = Path.home() / ".specsweep" / "logs" / f"private-log-{profile.port}.log"
        assert handle.log_path == str(expected)
        assert stat.S_IMODE(expected.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(expected.stat().st_mode) == 0o600
        await wait_ready(host, profile, handle)
    finally:
        kill_server(host, profile, handle)


@pytest.mark.parametrize("case", ["symlink", "writable-by-others", "another-users", "log-is-a-symlink"])
def test_a_log_directory_that_is_not_private_is_refused(host: LocalHost, make_toy: MakeToy, tmp_path: Path,
                                                        case: str) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    logs = tmp_path / "logs"
    if case == "symlink":
        logs.symlink_to(target)
    elif case == "writable-by-others":
        logs.mkdir()
        logs.chmod(0o777)
    elif case == "another-users":
        info = ensure_user()
        logs.mkdir(mode=0o700)
        os.chown(logs, info.pw_uid, info.pw_gid)
    else:
        logs.mkdir(mode=0o700)
        (logs / "server.log").symlink_to(target / "planted")
    profile = make_toy(log_path=str(logs / "server.log"))
    with pytest.raises(ServerStartError) as err:
        start_server(host, profile)
    assert "is not private" in str(err.value) and "log_path" in str(err.value)
    assert not (target / "planted").exists()
    assert not host.port_listening(profile.port)
