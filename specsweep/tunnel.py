"""How the client's HTTP reaches a server on an SSH host: a local port forward over SSH.

A server on a GPU host listens on that host's 127.0.0.1 (SGLang's default) and the host is
often reachable only through a bastion, so operators poll it with ``ssh host curl
localhost:30000/health``. The tunnel does the same for every request: a local port on
this machine (127.0.0.1 only) forwarded over SSH, through the jump host when there is one,
to the server's address on the host. Two implementations, with the same behaviour:

- ``OpenSSHTunnel``: the OpenSSH client (``ssh -N -L …``, jump host by ProxyCommand), fed the
  same key and exactly the host keys this run has verified; restarted on the same local
  port if it dies (a dropped link), so the URL the client uses never changes. Dies with
  this process (PR_SET_PDEATHSIG) and carries a marker variable the cleanup hooks look for.
- ``ParamikoTunnel``: a local listener whose connections are channels (``direct-tcpip``) on the
  host's own paramiko connection, pumped by one thread. Needs no ``ssh`` binary, and takes
  keys with a passphrase.

``open_tunnel`` picks one (``HostConfig.tunnel_client``; ``auto``: OpenSSH where the ``ssh``
client is installed and the key has no passphrase). benchmarks/tunnel.py measures both.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from pathlib import Path
from typing import Literal

import paramiko

from specsweep.bench.remote import HostLoadGenerator
from specsweep.errors import HostError, TunnelError
from specsweep.hosts.base import Host
from specsweep.hosts.config import HostConfig, SSHEndpoint
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


class Tunnel(ABC):
    """A local port on this machine that reaches ``remote_host:remote_port`` as seen from the SSH host."""

    def __init__(self, host: SSHHost, remote_host: str, remote_port: int) -> None:
        self.host, self.remote_host, self.remote_port = host, remote_host, remote_port
        self.local_port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    @property
    def where(self) -> str:
        return f"{self.remote_host}:{self.remote_port} on {self.host.label}"

    @abstractmethod
    def open(self) -> None:
        """Establish the forward; raise TunnelError (within the SSH connect timeout) when it cannot."""

    @abstractmethod
    def probe(self) -> Probe:
        """One connection through the forward: "open" (something listens), "refused" (nothing does);
        TunnelError when the SSH side refuses (forwarding prohibited) or the tunnel is down."""

    @abstractmethod
    def problem(self) -> str | None:
        """Why the tunnel is down just now, or None while it is up."""

    @abstractmethod
    def close(self) -> None:
        """Stop forwarding; nothing of the tunnel is left afterwards. Idempotent."""

    def __enter__(self) -> Tunnel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- OpenSSH ----------------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class OpenSSHTunnel(Tunnel):
    """``ssh -N -L 127.0.0.1:LOCAL:REMOTE_HOST:REMOTE_PORT``, supervised and restarted on the same port."""

    RESTART_DELAY_S = (0.1, 0.3, 0.5, 1.0)

    def __init__(self, host: SSHHost, remote_host: str, remote_port: int, *, marker: str = "") -> None:
        super().__init__(host, remote_host, remote_port)
        self.marker = marker or f"{os.getpid()}-{id(self)}"
        self._dir = Path(tempfile.mkdtemp(prefix="specsweep-tunnel-"))  # 0700: keys and host keys live here
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: deque[str] = deque(maxlen=50)
        self._lock = threading.Lock()
        self._closed = False
        self._supervisor: threading.Thread | None = None
        self.restarts = 0

    # the command ------------------------------------------------------------------------------

    def _key_args(self, ep: SSHEndpoint, name: str) -> list[str]:
        if ep.private_key is not None:
            path = self._dir / f"{name}.key"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                text = ep.private_key.get_secret_value()
                f.write(text if text.endswith("\n") else text + "\n")
            return ["-i", str(path), "-o", "IdentitiesOnly=yes"]
        if ep.key_path is not None:
            return ["-i", str(Path(ep.key_path).expanduser()), "-o", "IdentitiesOnly=yes"]
        return [] if ep.use_agent else ["-o", "IdentitiesOnly=yes"]

    def _common(self, ep: SSHEndpoint, name: str, known_hosts: Path) -> list[str]:
        args = ["-p", str(ep.port), "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(ep.connect_timeout_s))}",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                "-o", "LogLevel=INFO", "-F", "/dev/null", *self._key_args(ep, name)]
        if ep.user:
            args += ["-l", ep.user]
        return args

    def argv(self) -> list[str]:
        known = self._dir / "known_hosts"
        if not known.exists():
            fd = os.open(known, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("\n".join(self.host.verified_host_keys()) + "\n")
        ep = self.host.endpoint
        # A terminal session, not -N: OpenSSH turns Nagle's algorithm off (TCP_NODELAY) on both ends only
        # for interactive sessions. Without it, each streamed event waits for the previous one's
        # delayed ACK: +37 ms on TTFT at one stream (benchmarks/tunnel.py). The session runs `sleep`,
        # which dies with the terminal when the tunnel closes.
        argv = ["ssh", "-tt", "-o", "ExitOnForwardFailure=yes",
                "-L", f"127.0.0.1:{self.local_port}:{self.remote_host}:{self.remote_port}", *self._common(ep, "target", known)]
        if self.host.jump is not None:
            jump = self.host.jump
            proxy = ["ssh", "-W", "%h:%p", *self._common(jump, "jump", known), jump.hostname]
            argv += ["-o", "ProxyCommand=" + shlex.join(proxy)]
        return [*argv, ep.hostname, "exec sleep 2147483647"]

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

    def _first_start(self) -> bool:
        ep = self.host.endpoint
        timeout = ep.connect_timeout_s + (self.host.jump.connect_timeout_s if self.host.jump else 0.0) + 2.0
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
                    self._start(time.monotonic() + self.host.endpoint.connect_timeout_s + 1.0)
                    self.restarts += 1
                    failures = 0
                except TunnelError:
                    failures += 1

    def probe(self) -> Probe:
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
        self._closed = True
        with self._lock:
            if self._proc is not None:
                self._kill(self._proc)
        if self._supervisor is not None:
            self._supervisor.join(5)
        shutil.rmtree(self._dir, ignore_errors=True)


# -- paramiko ---------------------------------------------------------------------------------------


class ParamikoTunnel(Tunnel):
    """A local listener; each connection a ``direct-tcpip`` channel on the host's paramiko transport."""

    def __init__(self, host: SSHHost, remote_host: str, remote_port: int) -> None:
        super().__init__(host, remote_host, remote_port)
        self._listener: socket.socket | None = None
        self._pairs: dict[int, tuple[socket.socket, paramiko.Channel]] = {}
        self._pairs_lock = threading.Lock()
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._last_error: str | None = None
        self._session: paramiko.Channel | None = None
        self._wake_r, self._wake_w = os.pipe()

    def _channel(self, client: tuple[str, int]) -> paramiko.Channel:
        """A channel to the remote address: on the live transport, or over a new connection if it dropped."""
        timeout = self.host.endpoint.connect_timeout_s
        try:
            transport = self.host.transport()
            return transport.open_channel("direct-tcpip", (self.remote_host, self.remote_port), client, timeout=timeout)
        except paramiko.ChannelException as exc:
            if exc.code == 1:  # OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
                raise TunnelError(f"the SSH server of {self.host.label} refuses TCP forwarding (administratively "
                                  "prohibited): allow it (AllowTcpForwarding in its sshd_config), or set the host's "
                                  "traffic to direct with an http_address the client can reach") from None
            raise ConnectionRefusedError(f"{self.where}: {exc.text}") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._last_error = f"{type(exc).__name__}: {exc}"
            transport = self.host.transport(reconnect=True)
            return transport.open_channel("direct-tcpip", (self.remote_host, self.remote_port), client, timeout=timeout)

    def _nodelay(self) -> None:
        """No Nagle on either end of the SSH connection: here on our socket, and on the host's side by
        holding a terminal session open (sshd turns it off for interactive sessions, as OpenSSH does)."""
        transport = self.host.transport()
        sock = getattr(transport, "sock", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            session = transport.open_session(timeout=self.host.endpoint.connect_timeout_s)
            session.get_pty()
            session.exec_command("exec sleep 2147483647")
            self._session = session
        except (paramiko.SSHException, OSError, EOFError):
            self._session = None

    def open(self) -> None:
        try:
            self.host.transport()  # the SSH part: key, host key, jump host (raises HostError, named)
            self._nodelay()
        except TunnelError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise TunnelError(f"the SSH tunnel to {self.where} cannot open: {exc}") from None
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        self._listener = listener
        self.local_port = int(listener.getsockname()[1])
        for target in (self._accept, self._pump):
            t = threading.Thread(target=target, daemon=True, name=f"tunnel-{self.local_port}-{target.__name__}")
            t.start()
            self._threads.append(t)

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed:
            try:
                conn, addr = self._listener.accept()
            except OSError:
                return
            try:
                chan = self._channel(addr)
            except (TunnelError, ConnectionRefusedError, paramiko.SSHException, OSError, EOFError) as exc:
                self._last_error = str(exc)
                with contextlib.suppress(OSError):
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._pairs_lock:
                self._pairs[conn.fileno()] = (conn, chan)
            os.write(self._wake_w, b"x")

    def _pump(self) -> None:
        """One thread moves the bytes of every connection, both ways."""
        while not self._closed:
            with self._pairs_lock:
                pairs = list(self._pairs.values())
            readable: list[int | socket.socket | paramiko.Channel] = [self._wake_r]
            for conn, chan in pairs:
                readable += [conn, chan]
            try:
                ready, _, _ = select.select(readable, [], [], 0.5)  # a Channel has a fileno()
            except (OSError, ValueError):
                self._drop_closed()
                continue
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            for conn, chan in pairs:
                try:
                    if conn in ready:
                        data = conn.recv(65536)
                        if not data:
                            raise EOFError
                        chan.sendall(data)
                    if chan in ready:
                        data = chan.recv(65536)
                        if not data:
                            raise EOFError
                        conn.sendall(data)
                except (OSError, EOFError, paramiko.SSHException):
                    self._drop(conn, chan)

    def _drop(self, conn: socket.socket, chan: paramiko.Channel) -> None:
        with self._pairs_lock:
            for fd, (c, _) in list(self._pairs.items()):
                if c is conn:
                    del self._pairs[fd]
        with contextlib.suppress(Exception):
            chan.close()
        with contextlib.suppress(OSError):
            conn.close()

    def _drop_closed(self) -> None:
        with self._pairs_lock:
            pairs = list(self._pairs.values())
        for conn, chan in pairs:
            if conn.fileno() < 0 or chan.closed:
                self._drop(conn, chan)

    def probe(self) -> Probe:
        try:
            chan = self._channel(("127.0.0.1", 0))
        except ConnectionRefusedError:
            return "refused"
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TunnelError(f"the SSH tunnel to {self.where} is down: {exc}") from None
        chan.close()
        return "open"

    def problem(self) -> str | None:
        transport = self.host.current_transport()
        if transport is None or not transport.is_active():
            return f"the SSH connection to {self.host.label} is down ({self._last_error or 'closed'}); it reconnects on use"
        return None

    def close(self) -> None:
        self._closed = True
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        for t in self._threads:
            t.join(2)
        with self._pairs_lock:
            pairs = list(self._pairs.values())
            self._pairs.clear()
        for conn, chan in pairs:
            with contextlib.suppress(Exception):
                chan.close()
            with contextlib.suppress(OSError):
                conn.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._session is not None:
            with contextlib.suppress(Exception):
                self._session.close()


TunnelClient = Literal["auto", "openssh", "paramiko"]


def open_tunnel(host: SSHHost, bind: str, port: int, *, client: TunnelClient = "auto", marker: str = "",
                expect_listening: bool = False) -> Tunnel:
    """An open tunnel to ``port`` of the host (where a server bound to ``bind`` listens). Checks that
    the SSH side forwards at all; with ``expect_listening``, that something listens there too."""
    passphrase = any(ep is not None and ep.passphrase is not None for ep in (host.endpoint, host.jump))
    try:
        host.transport()  # the SSH login itself (host key, key, jump host): its errors name what failed
    except HostError as exc:
        raise TunnelError(f"the SSH tunnel to port {port} on {host.label} cannot open: {exc}") from None
    if client == "auto":
        client = "openssh" if shutil.which("ssh") and not passphrase else "paramiko"
    tunnel: Tunnel = (OpenSSHTunnel(host, forward_target(bind), port, marker=marker) if client == "openssh"
                      else ParamikoTunnel(host, forward_target(bind), port))
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
    """How the client reaches one server: its base URL, the tunnel behind it, if any, and the load
    generator on the host when the levels run there."""

    def __init__(self, url: str, tunnel: Tunnel | None = None, how: str = "direct",
                 on_host: HostLoadGenerator | None = None) -> None:
        self.url, self.tunnel, self.how, self.on_host = url, tunnel, how, on_host

    def problem(self) -> str | None:
        """Why the path is down just now (a tunnel whose SSH side dropped), or None."""
        return self.tunnel.problem() if self.tunnel is not None else None

    def close(self) -> None:
        if self.tunnel is not None:
            self.tunnel.close()


def open_path(host: Host, config: HostConfig, bind: str, port: int, *, marker: str = "",
              expect_listening: bool = False) -> ServerPath:
    """The client's way to a server on ``port`` of ``host`` (bound to ``bind``): a tunnel for an SSH
    host (unless its traffic is direct), the address itself otherwise. With ``load_generator: host``
    the levels run on the host against the server's own address (checked here, before any level);
    everything else still takes the path."""
    on_host = None
    if config.load_generator == "host" and isinstance(host, SSHHost):
        local = "127.0.0.1" if bind in ("0.0.0.0", "::", "localhost", "") else bind
        on_host = HostLoadGenerator(host, config.host_python, f"http://{local}:{port}")
        on_host.check()
    if config.traffic_mode == "direct" or not isinstance(host, SSHHost):
        return ServerPath(config.http_url(port), on_host=on_host)
    tunnel = open_tunnel(host, bind, port, client=config.tunnel_client, marker=marker,
                         expect_listening=expect_listening)
    how = f"{type(tunnel).__name__} to {tunnel.where}" + (
        f"; levels run on the host by {config.host_python}" if on_host else "")
    return ServerPath(tunnel.url, tunnel, how, on_host)


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
