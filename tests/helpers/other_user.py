"""A second Unix user of the machine, whose processes specsweep must never touch.

GPU hosts are shared: other people's jobs run there, often with names like a server's and on
ports near ours. The tests create a real second user (``useradd``, as root) and start real
processes as that user.
"""

from __future__ import annotations

import pwd
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

OTHER_USER = "specsweep-other"
PYTHON = "/usr/bin/python3"  # readable by every user (the test virtualenv may not be)

# Listens on the port given as argv[1] (all addresses) and sleeps; any further arguments only name it.
_LISTENER = ("import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
             "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); print('listening', flush=True); time.sleep(3600)")


def ensure_user(name: str = OTHER_USER) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        return pwd.getpwnam(name)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def process_as(user: str, argv: list[str], *, env: dict[str, str] | None = None,
               listen_port: int | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A process of ``user`` (in its own session), killed at the end; waits until it listens on
    ``listen_port`` when one is given."""
    info = pwd.getpwnam(user)
    proc = subprocess.Popen(argv, user=info.pw_uid, group=info.pw_gid, extra_groups=[], env=env or {},
                            cwd="/", start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if listen_port is not None:
            deadline = time.monotonic() + 10
            while not _listening(listen_port):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{user}'s listener on {listen_port} did not start")
                time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def listener_argv(port: int, *name: str) -> list[str]:
    """A process listening on ``port`` whose command line carries ``name`` (e.g. sglang::scheduler)."""
    return [PYTHON, "-c", _LISTENER, str(port), *name]
