"""A results file is never seen half written, on a filesystem that is not an object store either:
a real OpenSSH server's SFTP (fsspec's own SFTP client) on this machine's loopback, watched while a
large file replaces a small one."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import fsspec
import pytest

from specsweep.results.location import ResultsLocation
from tests.helpers.sshd import start_sshd


@pytest.fixture
def sftp_url(tmp_path: Path, ssh_keys: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> str:
    sshd = start_sshd(tmp_path / "sshd", [ssh_keys[1]], extra_config="Subsystem sftp internal-sftp\n")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(ssh_keys[0], home / ".ssh" / "id_ed25519")  # where fsspec's SFTP client (paramiko) looks
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    yield f"sftp://{sshd.user}@{sshd.address}:{sshd.port}{tmp_path}/r"
    sshd.stop()


def test_an_sftp_write_replaces_the_file_whole(sftp_url: str, tmp_path: Path) -> None:
    loc = ResultsLocation(url=sftp_url).open()
    assert not loc.whole_objects
    loc.write_bytes("levels/x.parquet", b"old")
    big = os.urandom(8 * 1024 * 1024)  # SFTP writes it 32 KiB at a time: hundreds of moments to be seen in
    target = tmp_path / "r" / "levels" / "x.parquet"
    seen: set[int] = set()
    writer = threading.Thread(target=loc.write_bytes, args=("levels/x.parquet", big))
    writer.start()
    while writer.is_alive():
        try:
            seen.add(target.stat().st_size)
        except FileNotFoundError:
            seen.add(-1)
        time.sleep(0.001)
    writer.join()
    assert target.read_bytes() == big
    # Only the old file or the new one was ever there (never a part of the new one).
    assert seen <= {3, len(big), -1} and len(seen - {-1}) >= 1, sorted(seen)[:10]
    assert [p.name for p in target.parent.iterdir()] == ["x.parquet"]  # no temporary file left
    assert loc.read_bytes("levels/x.parquet") == big


def test_a_memory_store_leaves_no_temporary_file() -> None:
    loc = ResultsLocation(url="memory://bench/atomic").open()
    loc.write_bytes("a.parquet", b"one")
    loc.write_bytes("a.parquet", b"two")
    assert loc.read_bytes("a.parquet") == b"two"
    assert [p.rsplit("/", 1)[1] for p in fsspec.filesystem("memory").ls("/bench/atomic", detail=False)] == ["a.parquet"]


def test_a_write_does_not_follow_a_link_placed_in_a_shared_results_folder(tmp_path: Path) -> None:
    """Another user of a shared results folder links a run's folder to the worker user's own files: the write is
    refused, and nothing is made or written there."""
    from specsweep.errors import StoreError

    root, theirs = tmp_path / "results", tmp_path / "victim"
    root.mkdir()
    theirs.mkdir()
    (root / "runs").symlink_to(theirs)
    location = ResultsLocation(url=str(root)).open()
    for relative in ("runs/r1/levels.parquet", "runs/levels.parquet"):
        with pytest.raises(StoreError, match="symbolic link out of the results location"):
            location.write_bytes(relative, b"x")
    assert list(theirs.iterdir()) == []
    (root / "ok.bin").symlink_to(theirs / "target")  # a link at the file's own name is replaced, not followed
    location.write_bytes("ok.bin", b"x")
    assert not (theirs / "target").exists() and (root / "ok.bin").read_bytes() == b"x"


def test_a_file_url_is_checked_as_the_path_it_opens() -> None:
    from specsweep import policy
    from specsweep.errors import ConfigError

    rules = policy.Policy(results=["/srv/results"])
    with pytest.raises(ConfigError, match="names a host"):
        rules.check_results("file://srv/results")  # checked as ./srv/results, opened as /results
    rules.check_results("file:///srv/results/x")
    with pytest.raises(ConfigError, match="is not a results root"):
        rules.check_results("file:///results")
