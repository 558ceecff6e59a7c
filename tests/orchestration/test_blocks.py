"""The ssh-host block: a saved host whose key never travels as a flow parameter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestration.blocks import SSHHostBlock
from specsweep.hosts import open_host
from tests.helpers.sshd import SSHServer


def make_block(sshd: SSHServer, key: Path, **kw: object) -> SSHHostBlock:
    return SSHHostBlock(hostname=sshd.address, port=sshd.port, user=sshd.user, private_key=key.read_text(),  # type: ignore[arg-type]
                        known_hosts=sshd.known_hosts_line(), **kw)


def test_block_builds_a_working_host(sshd: SSHServer, ssh_keys: tuple[Path, str]) -> None:
    cfg = make_block(sshd, ssh_keys[0]).host_config()
    assert cfg.kind == "ssh" and cfg.ssh is not None and cfg.ssh.known_hosts is not None
    assert oct(os.stat(cfg.ssh.known_hosts).st_mode & 0o777) == "0o600"
    with open_host(cfg) as host:
        assert host.run(["echo", "ok"]).stdout == "ok\n"
    assert ssh_keys[0].read_text() not in repr(make_block(sshd, ssh_keys[0]))


def test_a_planted_known_hosts_file_is_not_trusted(sshd: SSHServer, ssh_keys: tuple[Path, str], tmp_path: Path) -> None:
    """Another user of this machine cannot choose the host keys a block's run trusts: the known_hosts file
    is created exclusively in a private directory, not at a path anyone can predict and plant first."""
    import hashlib
    import tempfile

    block = make_block(sshd, ssh_keys[0])
    text = sshd.known_hosts_line()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    planted = Path(tempfile.gettempdir()) / f"specsweep-known-hosts-{os.getuid()}-{digest}"
    attacker = tmp_path / "attacker_known_hosts"
    attacker.write_text(f"{sshd.address} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKAttackerKeyAttackerKeyAttackerKey00\n")
    planted.unlink(missing_ok=True)
    planted.symlink_to(attacker)
    try:
        cfg = block.host_config()
        assert cfg.ssh is not None and cfg.ssh.known_hosts is not None
        used = Path(cfg.ssh.known_hosts)
        assert used.read_text().strip() == text.strip() and not used.is_symlink()
        assert oct(used.stat().st_mode & 0o777) == "0o600" and oct(used.parent.stat().st_mode & 0o777) == "0o700"
        assert "Attacker" in attacker.read_text()  # and nothing was written through the link
        with open_host(cfg) as host:
            assert host.run(["echo", "ok"]).stdout == "ok\n"
    finally:
        planted.unlink(missing_ok=True)


@pytest.mark.usefixtures("prefect_harness")
async def test_a_host_key_trusted_once_is_not_written_back_into_the_block(sshd: SSHServer, ssh_keys: tuple[Path, str],
                                                                         tmp_path: Path) -> None:
    """accept_unknown_host_key trusts the key for that run only (where the policy allows it at all): the block is
    left as it was (a run's trust is no administrator's), so the next run without the setting refuses the host."""
    from flows.server_lifecycle import server_lifecycle
    from tests.conftest import toy_profile

    block = make_block(sshd, ssh_keys[0], accept_unknown_host_key=True)
    block.known_hosts = None
    await block.asave("trust-once", overwrite=True)
    profile = toy_profile(tmp_path).as_parameters()
    state = await server_lifecycle(profile=profile, host={"block": "trust-once"}, return_state=True)  # type: ignore[arg-type]
    assert state.is_completed(), state.message
    kept = await SSHHostBlock.aload("trust-once")
    assert kept.known_hosts is None
    kept.accept_unknown_host_key = False
    await kept.asave("trust-once", overwrite=True)
    again = await server_lifecycle(profile=profile, host={"block": "trust-once"}, return_state=True)  # type: ignore[arg-type]
    assert again.is_failed() and "host key" in (again.message or ""), again.message
