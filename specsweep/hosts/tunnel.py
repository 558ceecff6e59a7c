"""How the client's HTTP reaches a server on an SSH host: a local port forward by the OpenSSH client.

A server on a GPU host listens on that host's 127.0.0.1 (the engines' usual default) and the host
is often reachable only through a bastion, so operators poll it with ``ssh host curl
localhost:30000/health``. The tunnel does the same for every request: a local port on this machine
(127.0.0.1 only), ``ssh -L`` to the server's address on the host, through the jump host by
ProxyCommand when there is one. It is fed the run's key and exactly the host keys this run has
verified, restarted on the same local port if it dies (a dropped link, so the URL the client uses
never changes), dies with this process (PR_SET_PDEATHSIG), and carries a marker variable the
cleanup hooks look for. A key with a passphrase is given to a private ssh-agent of the tunnel's
own (its socket in the tunnel's 0700 folder, the passphrase on ssh-add's standard input by an
askpass helper), never written out in clear.

One implementation: the OpenSSH client forwards about twice the tokens per second of a Python
(paramiko) forward at a fraction of its CPU (``benchmarks/tunnel.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Literal

from specsweep import policy
from specsweep.errors import HostError, TunnelError
from specsweep.hosts.base import Host
from specsweep.hosts.config import SSHEndpoint
from specsweep.hosts.ssh import SSHHost

#: Set in the environment of every ssh process a tunnel starts: the cleanup hooks of a run that
#: crashed find (and stop) the run's tunnels by it.
TUNNEL_MARKER_ENV = "SPECSWEEP_TUNNEL"

Probe = Literal["open", "refused"]


def free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def forward_target(bind: str) -> str:
    """Where on the host the tunnel delivers: the server's bind address, or loopback for a wildcard."""
    return "127.0.0.1" if bind in ("", "0.0.0.0", "::", "[::]") else bind


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


#: Prints the passphrase ssh-add asks for, from ssh-add's own environment (readable by this user only).
_ASKPASS = '#!/bin/sh\nprintf \'%s\\n\' "$SPECSWEEP_ASKPASS"\n'


def _ssh_escape(text: str) -> str:
    """A value for an ssh_config option that expands %-tokens (ProxyCommand, IdentityFile, IdentityAgent,
    UserKnownHostsFile): a literal % doubled."""
    return text.replace("%", "%%")


class Tunnel:
    """``ssh -L 127.0.0.1:LOCAL:REMOTE_HOST:REMOTE_PORT``: a local port on this machine that reaches
    ``remote_host:remote_port`` as seen from the SSH host, supervised and restarted on the same port."""

    RESTART_DELAY_S = (0.1, 0.3, 0.5, 1.0)

    def __init__(self, host: SSHHost, remote_host: str, remote_port: int, *, marker: str = "") -> None:
        self.host, self.remote_host, self.remote_port = host, remote_host, remote_port
        self.local_port = 0
        self.marker = marker or f"{os.getpid()}-{id(self)}"
        self._dir = Path(tempfile.mkdtemp(prefix="specsweep-tunnel-"))  # 0700: keys and host keys live here
        self._proc: subprocess.Popen[bytes] | None = None
        self._agent: subprocess.Popen[bytes] | None = None
        self._argv: list[str] | None = None
        self._stderr: deque[str] = deque(maxlen=50)
        self._lock = threading.Lock()
        self._closed = False
        self._supervisor: threading.Thread | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    @property
    def where(self) -> str:
        return f"{self.remote_host}:{self.remote_port} on {self.host.label}"

    def __enter__(self) -> Tunnel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the command ------------------------------------------------------------------------------

    def _key_args(self, ep: SSHEndpoint, name: str) -> list[str]:
        if ep.passphrase is not None and (ep.private_key is not None or ep.key_path is not None):
            return ["-o", f"IdentityAgent={_ssh_escape(str(self._agent_with(ep, name)))}", "-o", "IdentityFile=none"]
        if ep.private_key is not None:
            path = self._dir / f"{name}.key"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                text = ep.private_key.get_secret_value()
                f.write(text if text.endswith("\n") else text + "\n")
            return ["-o", f"IdentityFile={_ssh_escape(str(path))}", "-o", "IdentitiesOnly=yes"]
        if ep.key_path is not None:
            # As an option, not -i: ssh checks an -i path before it expands its %-tokens, and drops one that holds %.
            return ["-o", f"IdentityFile={_ssh_escape(str(Path(ep.key_path).expanduser()))}", "-o", "IdentitiesOnly=yes"]
        return [] if ep.use_agent else ["-o", "IdentitiesOnly=yes"]

    def _agent_with(self, ep: SSHEndpoint, name: str) -> Path:
        """The tunnel's own ssh-agent (started on first use; its socket in the private folder), holding
        ``ep``'s key, which has a passphrase: ssh-add reads the key on its standard input (or from its
        file) and the passphrase from an askpass helper that takes it from ssh-add's environment, so it
        is on no command line and in no file."""
        sock = self._dir / "agent.sock"
        if self._agent is None:
            self._agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           preexec_fn=_die_with_parent, start_new_session=True)
            deadline = time.monotonic() + 5
            while not sock.exists():
                if self._agent.poll() is not None or time.monotonic() > deadline:
                    raise TunnelError(f"the SSH tunnel to {self.where} cannot open: ssh-agent did not start")
                time.sleep(0.01)
        askpass = self._dir / "askpass"
        if not askpass.exists():
            fd = os.open(askpass, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
            with os.fdopen(fd, "w") as f:
                f.write(_ASKPASS)
        assert ep.passphrase is not None
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SSH_AUTH_SOCK": str(sock), "SSH_ASKPASS": str(askpass),
               "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0", "SPECSWEEP_ASKPASS": ep.passphrase.get_secret_value()}
        if ep.private_key is not None:
            text = ep.private_key.get_secret_value()
            argv, key = ["ssh-add", "-q", "-"], (text if text.endswith("\n") else text + "\n").encode()
        else:
            argv, key = ["ssh-add", "-q", str(Path(str(ep.key_path)).expanduser())], b""
        done = subprocess.run(argv, input=key, env=env, capture_output=True, timeout=30, start_new_session=True)
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
            raise TunnelError(f"the SSH tunnel to {self.where} cannot open: the {name} key and its passphrase were "
                              f"refused by ssh-add ({said}): check the passphrase")
        return sock

    def _common(self, ep: SSHEndpoint, name: str, known_hosts: Path) -> list[str]:
        args = ["-p", str(ep.port), "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(ep.connect_timeout_s))}",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={_ssh_escape(str(known_hosts))}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                "-o", "LogLevel=INFO", "-F", "/dev/null", *self._key_args(ep, name)]
        if ep.user:
            args += ["-l", ep.user]
        return args

    def argv(self) -> list[str]:
        """The ssh command for the current local port (its login part is made once: key files, agent)."""
        if self._argv is None:
            self._argv = self._login_argv()
        # A terminal session, not -N: OpenSSH turns Nagle's algorithm off (TCP_NODELAY) on both ends only
        # for interactive sessions. Without it, each streamed event waits for the previous one's
        # delayed ACK: +37 ms on TTFT at one stream (benchmarks/tunnel.py). The session runs `sleep`,
        # which dies with the terminal when the tunnel closes.
        return ["ssh", "-tt", "-o", "ExitOnForwardFailure=yes",
                "-L", f"127.0.0.1:{self.local_port}:{self.remote_host}:{self.remote_port}", *self._argv]

    def _login_argv(self) -> list[str]:
        known = self._dir / "known_hosts"
        if not known.exists():
            fd = os.open(known, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("\n".join(self.host.verified_host_keys()) + "\n")
        ep = self.host.endpoint
        argv = self._common(ep, "target", known)
        if self.host.jump is not None:
            jump = self.host.jump
            proxy = ["ssh", "-W", "%h:%p", *(_ssh_escape(a) for a in self._common(jump, "jump", known)), "--",
                     _ssh_escape(jump.hostname)]
            argv += ["-o", "ProxyCommand=" + shlex.join(proxy)]
        return [*argv, "--", ep.hostname, "exec sleep 2147483647"]

    # the process ------------------------------------------------------------------------------

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, TUNNEL_MARKER_ENV: self.marker}
        proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=env, preexec_fn=_die_with_parent, start_new_session=True)
        threading.Thread(target=self._read_stderr, args=(proc,), daemon=True).start()
        return proc

    def _read_stderr(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", errors="replace").strip()
            if line:
                self._stderr.append(line)

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.local_port), timeout=0.2):
                return True
        except OSError:
            return False

    def _start(self, deadline: float) -> None:
        """Start ssh and wait until its local port accepts connections; TunnelError if it exits first."""
        self._proc = self._spawn()
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                time.sleep(0.05)  # let the stderr reader take the last lines
                raise TunnelError(self._explain(f"ssh exited with code {self._proc.returncode}"))
            if self._listening():
                return
            time.sleep(0.02)
        self._kill(self._proc)
        raise TunnelError(self._explain("the forward did not come up in time"))

    def _explain(self, what: str) -> str:
        said = "; ".join(list(self._stderr)[-3:]) or "no message"
        cause = said
        if "Permission denied" in said:
            cause = f"{said} — the SSH key was refused: check the user and key"
        elif "Host key verification failed" in said:
            cause = f"{said} — the host key is not the one this run verified"
        return f"the SSH tunnel to {self.where} cannot open: {what} ({cause})"

    def open(self) -> None:
        """Establish the forward; raise TunnelError when it cannot (ssh itself within its connect timeout; a start
        that hangs past it, within twice the connect timeouts and 5 s)."""
        # ssh is started (and restarted) by the supervisor thread only: a child started with
        # PR_SET_PDEATHSIG dies with the thread that started it, so that thread must live as long
        # as the tunnel.
        self._opened = threading.Event()
        self._open_error: TunnelError | None = None
        self._supervisor = threading.Thread(target=self._supervise, daemon=True, name="tunnel-supervisor")
        self._supervisor.start()
        self._opened.wait()
        if self._open_error is not None:
            self._closed = True
            raise self._open_error

    def _start_deadline_s(self) -> float:
        """How long one start of ssh may take until its forward listens. ssh gives up itself on a host it cannot
        reach (ConnectTimeout), and at once on a refused key or forward (ExitOnForwardFailure): this deadline only
        ends a start that hangs past all that. Twice the connect timeouts and 5 s: on a busy machine the start of
        ssh, the key exchange and the login took over 5 s (the suite, 3 s connect timeout), and one SSH command
        beside it 9.5 s."""
        connect = self.host.endpoint.connect_timeout_s + (self.host.jump.connect_timeout_s if self.host.jump else 0.0)
        return 2 * connect + 5.0

    def _first_start(self) -> bool:
        timeout = self._start_deadline_s()
        try:
            for attempt in range(3):
                self.local_port = free_local_port()
                try:
                    self._start(time.monotonic() + timeout)
                    return True
                except TunnelError:
                    # Another program took the free port between our check and ssh's bind: try another.
                    if attempt == 2 or not any("Address already in use" in s for s in self._stderr):
                        raise
            return False
        except TunnelError as exc:
            self._open_error = exc
            return False
        except Exception as exc:  # noqa: BLE001 - whatever stops the start must reach open(), not end this thread
            self._open_error = TunnelError(f"the SSH tunnel to {self.where} cannot open: {exc}")
            return False
        finally:
            self._opened.set()

    def _supervise(self) -> None:
        """Start ssh, then restart it on the same local port whenever it dies (a dropped link), until closed."""
        if not self._first_start():
            return
        failures = 0
        while not self._closed:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                time.sleep(0.1)
                continue
            time.sleep(self.RESTART_DELAY_S[min(failures, len(self.RESTART_DELAY_S) - 1)])
            with self._lock:
                if self._closed:
                    return
                try:
                    self._start(time.monotonic() + self._start_deadline_s())
                    self.restarts += 1
                    failures = 0
                except TunnelError:
                    failures += 1

    def probe(self) -> Probe:
        """One connection through the forward: "open" (something listens), "refused" (nothing does);
        TunnelError when the SSH side refuses (forwarding prohibited) or the tunnel is down."""
        before = len(self._stderr)
        try:
            with socket.create_connection(("127.0.0.1", self.local_port), timeout=2.0) as s:
                s.settimeout(1.0)
                try:
                    closed = s.recv(1) == b""  # ssh closes at once when the host's side refuses
                except TimeoutError:
                    return "open"  # connected, and the server waits for a request
                except OSError:
                    closed = True
        except OSError as exc:
            raise TunnelError(self._explain(f"the local end of the tunnel is gone ({exc})")) from None
        if not closed:
            return "open"
        time.sleep(0.05)
        said = " ".join(list(self._stderr)[before:])
        if "administratively prohibited" in said:
            raise TunnelError(f"the SSH server of {self.host.label} refuses TCP forwarding (administratively "
                              f"prohibited): allow it (AllowTcpForwarding in its sshd_config), or set the host's "
                              f"traffic to direct with an http_address the client can reach")
        return "refused"

    def problem(self) -> str | None:
        """Why the tunnel is down just now, or None while it is up."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return self._explain("the ssh process is not running") + "; restarting it"
        return None

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(3)

    def close(self) -> None:
        """Stop forwarding; nothing of the tunnel is left afterwards. Idempotent."""
        self._closed = True
        with self._lock:
            for proc in (self._proc, self._agent):
                if proc is not None:
                    self._kill(proc)
        if self._supervisor is not None:
            self._supervisor.join(5)
        shutil.rmtree(self._dir, ignore_errors=True)


def open_tunnel(host: SSHHost, bind: str, port: int, *, marker: str = "", expect_listening: bool = False) -> Tunnel:
    """An open tunnel to ``port`` of the host (where a server bound to ``bind`` listens). Checks that
    the SSH side forwards at all; with ``expect_listening``, that something listens there too. Only to an
    address the worker's policy names (``targets``: the host's loopback by default), checked before ssh starts."""
    policy.load().check_target(forward_target(bind), "profile.host")
    if shutil.which("ssh") is None:
        raise TunnelError(f"the SSH tunnel to port {port} on {host.label} needs the OpenSSH client (ssh), which is "
                          "not installed here: install it (Debian: openssh-client), or set the host's traffic to "
                          "direct with an http_address the client can reach")
    try:
        host.transport()  # the SSH login itself (host key, key, jump host): its errors name what failed
    except HostError as exc:
        raise TunnelError(f"the SSH tunnel to port {port} on {host.label} cannot open: {exc}") from None
    tunnel = Tunnel(host, forward_target(bind), port, marker=marker)
    try:
        tunnel.open()
        if tunnel.probe() == "refused" and expect_listening:
            raise TunnelError(f"nothing listens on {tunnel.where}: start the server first (or check its port and "
                              "bind address)")
    except BaseException:
        tunnel.close()
        raise
    return tunnel


# -- the client's path to a server -----------------------------------------------------------------


class ServerPath:
    """How the client reaches one server: its base URL, and the tunnel behind it, if any."""

    def __init__(self, url: str, tunnel: Tunnel | None = None, how: str = "direct") -> None:
        self.url, self.tunnel, self.how = url, tunnel, how

    def problem(self) -> str | None:
        """Why the path is down just now (a tunnel whose SSH side dropped), or None."""
        return self.tunnel.problem() if self.tunnel is not None else None

    def close(self) -> None:
        if self.tunnel is not None:
            self.tunnel.close()


def open_path(host: Host, bind: str, port: int, *, marker: str = "", expect_listening: bool = False) -> ServerPath:
    """The client's way to a server on ``port`` of ``host`` (bound to ``bind``): a tunnel for an SSH
    host (unless its traffic is direct), the address itself otherwise."""
    config = host.config
    if config.traffic_mode == "direct" or not isinstance(host, SSHHost):
        return ServerPath(config.http_url(port))
    tunnel = open_tunnel(host, bind, port, marker=marker, expect_listening=expect_listening)
    return ServerPath(tunnel.url, tunnel, f"OpenSSH tunnel to {tunnel.where}")


def stop_marked_tunnels(marker: str) -> list[int]:
    """Stop this machine's tunnel processes that carry ``marker`` (the cleanup after a crashed run)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"{TUNNEL_MARKER_ENV}={marker}".encode() in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    return pids
