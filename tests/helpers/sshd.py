"""A real OpenSSH server on loopback, started by the tests with throwaway keys."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.processes import stop_process

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


#: Ports handed out below the kernel's ephemeral range (32768-60999), so that no client connection made meanwhile
#: takes one before its server binds it; split into disjoint slices, one per pytest-xdist worker, so that two tests
#: running at once never get the same port (one test's simulator once answered another's health check and its
#: requests waited on a server that was not its own until the timeout).
PORTS = (20000, 32000)
SLICES = 8
#: Ports this process handed out, not handed out again while fresher ones remain (a server may still be stopping).
_given: list[int] = []


def _slice() -> tuple[int, int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) % SLICES if worker[2:].isdigit() else 0
    width = (PORTS[1] - PORTS[0]) // SLICES
    return PORTS[0] + index * width, PORTS[0] + (index + 1) * width


def free_port(host: str = "127.0.0.1", span: int = 1) -> int:
    """A port (and the span-1 after it) free to listen on, from this test process's own slice of ports, never
    one it handed out among its last few hundred."""
    low, high = _slice()
    for _ in range(1000):
        first = random.randrange(low, high - span)
        if any(first <= given < first + span for given in _given):
            continue
        socks = [socket.socket() for _ in range(span)]
        try:
            for offset, s in enumerate(socks):
                s.bind((host, first + offset))
            _given.extend(range(first, first + span))
            del _given[:-300]
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {span} free port(s) in a row on {host}")


def keygen(path: Path, kind: str = "ed25519") -> str:
    """Write a key pair without a passphrase; return the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "specsweep-test", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip() if path.suffix else Path(f"{path}.pub").read_text().strip()


@dataclass
class SSHServer:
    address: str
    port: int
    dir: Path
    host_key_pub: str
    user: str
    proc: subprocess.Popen[bytes]

    @property
    def log(self) -> str:
        p = self.dir / "sshd.log"
        return p.read_text() if p.exists() else ""

    def known_hosts_line(self) -> str:
        kind, key = self.host_key_pub.split()[:2]
        return f"[{self.address}]:{self.port} {kind} {key}"

    def stop(self) -> None:
        stop_process(self.proc, 5)


def start_sshd(workdir: Path, authorized_keys: list[str], *, address: str = "127.0.0.1",
               allow_forwarding: bool = True, log_level: str = "VERBOSE", netns: str | None = None,
               port: int | None = None, extra_config: str = "", set_env: dict[str, str] | None = None,
               own_processes: bool = False) -> SSHServer:
    """``netns``: run sshd inside that network namespace (``address`` then is the namespace's own).
    ``set_env``: more environment for its sessions (sshd takes only its first SetEnv line: all go on it).
    ``own_processes``: sshd and what it starts see only their own processes (a PID namespace with its own /proc), as
    on a machine of their own: several test hosts whose servers use one port do not find each other's."""
    if not os.path.exists(SSHD):
        raise RuntimeError("sshd is not installed: the test command installs openssh-server (scripts/bootstrap.sh)")
    workdir.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
    host_key = workdir / "host_key"
    host_pub = keygen(host_key)
    (workdir / "authorized_keys").write_text("\n".join(authorized_keys) + "\n")
    port = port or free_port(address)
    config = workdir / "sshd_config"
    config.write_text(
        f"""Port {port}
ListenAddress {address}
HostKey {host_key}
PidFile {workdir}/sshd.pid
AuthorizedKeysFile {workdir}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding {'yes' if allow_forwarding else 'no'}
AllowAgentForwarding no
X11Forwarding no
PrintMotd no
MaxSessions 100
MaxStartups 100
LogLevel {log_level}
# Commands run through the login shell; where it runs `pyenv rehash` (this machine's image does), a
# command killed while its shell starts (the link-cut tests kill some) leaves pyenv's lock behind, and
# every later login waits for it (60 s by default; even 1 s made each command 2 s and starved the
# tests that read every 0.2 s). A negative timeout makes rehash give up before it takes the lock.
SetEnv {" ".join(f"{k}={v}" for k, v in {"PYENV_REHASH_TIMEOUT": "-1", **(set_env or {})}.items())}
{extra_config}"""
    )
    wrap = ["ip", "netns", "exec", netns] if netns else []
    if own_processes:
        wrap += ["unshare", "--pid", "--kill-child", "--mount-proc"]
    proc = subprocess.Popen([*wrap, SSHD, "-D", "-f", str(config), "-E", str(workdir / "sshd.log")])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None:
                log = workdir / "sshd.log"
                raise RuntimeError(f"sshd exited: {log.read_text() if log.exists() else ''}") from None
            time.sleep(0.05)
    import pwd

    return SSHServer(address, port, workdir, host_pub, pwd.getpwuid(os.getuid()).pw_name, proc)
