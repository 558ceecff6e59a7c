"""How a server is launched: its environment never on a command line, its log private, and a start
whose input was cut short starts nothing."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from specsweep.errors import ServerStartError
from specsweep.hosts import LocalHost
from specsweep.hosts.scripts import START_SCRIPT, env_script
from specsweep.server.lifecycle import kill_server, start_server
from tests.conftest import MakeToy, pids_with_env, wait_ready
from tests.helpers.other_user import ensure_user
from tests.helpers.sshd import free_port


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
    argv = ["sh", "-c", START_SCRIPT, "sh", f"~/.specsweep/logs/cut-short-{os.getpid()}.log", "", "", "",
            "sleep", "300"]
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


def tmp_files(log_path: str) -> list[Path]:
    """The socket and the file the toy server left in its temporary folder (--leave-tmp-files)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in Path(log_path).read_text().splitlines():
            if line.startswith("tmp files: "):
                return [Path(p) for p in line.removeprefix("tmp files: ").split()]
        time.sleep(0.05)
    raise AssertionError(f"the toy server never said where it left its files: {Path(log_path).read_text()}")


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    path.chmod(0o700)  # whatever the umask
    return path


async def test_a_start_leaves_its_temporary_files_in_a_folder_of_its_own_which_the_kill_removes(
        host: LocalHost, make_toy: MakeToy, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    # The start script's login home: short, as homes are (a socket's path has at most 107 bytes).
    home = Path(tempfile.mkdtemp(prefix="home-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
    monkeypatch.setenv("HOME", str(home))
    profile = make_toy("--leave-tmp-files", name="private-tmp", private_tmp_env=["TMPDIR"])
    folders = private_dir(private_dir(home / ".specsweep") / "tmp")

    def folder(name: str, age_s: float = 0) -> Path:
        path = private_dir(folders / name)
        (path / "something").write_text("x")
        if age_s:
            os.utime(path, (time.time() - age_s, time.time() - age_s))
        return path

    # An earlier start whose server died unkilled, 10 minutes ago: removed. One made a moment ago by a start that
    # may not have begun its server yet, and one whose start still has a live process: kept.
    crashed = folder(f"{free_port()}-{'c' * 12}", age_s=600)
    starting = folder(f"{free_port()}-{'e' * 12}")
    live_token = "d" * 24
    live = folder(f"{free_port()}-{live_token[:12]}", age_s=600)
    sleeper = subprocess.Popen(["sleep", "60"], env={**os.environ, "SPECSWEEP_START": live_token})
    # Nothing that is not such a folder is touched: a link named like one (and what it points to), another name.
    elsewhere = private_dir(home / "elsewhere")
    (elsewhere / "keep").write_text("x")
    (folders / f"{free_port()}-{'f' * 12}").symlink_to(elsewhere)
    other = folder("not-a-start", age_s=600)
    info = ensure_user()
    theirs = folder(f"{free_port()}-{'a' * 12}")
    os.chown(theirs, info.pw_uid, info.pw_gid)
    os.utime(theirs, (time.time() - 600, time.time() - 600))
    handle = start_server(host, profile)
    try:
        await wait_ready(host, profile, handle)
        own = Path(profile.tmp_dir(handle.token).replace("~", str(home), 1))  # type: ignore[union-attr]
        assert own.parent == folders and own.name == f"{profile.port}-{handle.token[:12]}"
        assert stat.S_IMODE(own.stat().st_mode) == 0o700
        left = tmp_files(handle.log_path)
        assert [p.parent for p in left] == [own, own] and all(p.exists() for p in left)
        assert stat.S_ISSOCK(left[0].stat().st_mode)
        report = kill_server(host, profile, handle)
        assert sorted(report.removed_tmp_dirs) == sorted([str(own), str(crashed)])
        assert "removed 2 temporary folder(s)" in report.summary()
        assert not own.exists() and not crashed.exists()
        assert starting.is_dir() and live.is_dir() and other.is_dir() and theirs.is_dir()
        assert (elsewhere / "keep").exists() and len(list(folders.iterdir())) == 5
    finally:
        sleeper.kill()
        sleeper.wait()
        kill_server(host, profile, handle)


def test_a_variable_both_in_env_and_pointed_at_the_private_folder_is_refused(make_toy: MakeToy) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="TMPDIR is also set in env"):
        make_toy(private_tmp_env=["TMPDIR"], env={"TMPDIR": "/scratch"})
    with pytest.raises(ValidationError, match="not valid"):
        make_toy(private_tmp_env=["NOT-A-NAME"])


async def test_a_home_too_long_for_socket_paths_starts_the_server_with_the_usual_tmpdir(
        host: LocalHost, make_toy: MakeToy, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture) -> None:
    usual = Path(tempfile.mkdtemp(prefix="tmp-", dir="/tmp"))  # the login's own TMPDIR: short, as /tmp is
    request.addfinalizer(lambda: shutil.rmtree(usual, ignore_errors=True))
    home = private_dir(usual / ("h" * 60))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(usual))
    profile = make_toy("--leave-tmp-files", name="long-home", private_tmp_env=["TMPDIR"])
    with caplog.at_level("WARNING"):
        handle = start_server(host, profile)
    try:
        await wait_ready(host, profile, handle)  # a socket in ~/.specsweep/tmp/... could not have been bound
        assert [p.parent for p in tmp_files(handle.log_path)] == [usual, usual]
        assert any("no temporary folder of its own" in m for m in caplog.messages)
        assert not (home / ".specsweep" / "tmp").exists()
    finally:
        kill_server(host, profile, handle)
