"""The ssh-host block: a saved host whose key never travels as a flow parameter."""

from __future__ import annotations

import os
from pathlib import Path

from specsweep.hosts import open_host
from tasks.blocks import SSHHostBlock
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
