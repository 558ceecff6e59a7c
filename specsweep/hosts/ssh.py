"""A host reached over SSH (paramiko), optionally through a jump host.

The connection opens on first use and is reused; a dropped transport is reconnected
once before a command is sent (never in the middle of one, so a command never runs twice).
Host keys are checked against known_hosts; unknown keys are refused unless the endpoint
says ``accept_unknown_host_key``, and a changed key is always refused.
"""

from __future__ import annotations

import io
import logging
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import paramiko

from specsweep.errors import CommandNotSentError, CommandOutcomeUnknown, HostError, HostKeyError
from specsweep.hosts.base import CommandResult, Host
from specsweep.hosts.config import HostConfig, SSHEndpoint

_log = logging.getLogger(__name__)


#: Tries of an SSH handshake that fails after its TCP connection opened (SSHHost._connect).
HANDSHAKE_TRIES = 3


class _Dropped(Exception):
    """The connection went away under a running command."""


class _HandshakeFailed(HostError):
    """The TCP connection opened but the SSH handshake did not end (no banner, dropped, timed out)."""


def _fingerprint(key: paramiko.PKey) -> str:
    return key.fingerprint  # "SHA256:..." as ssh-keygen prints it


def _known_name(endpoint: SSHEndpoint) -> str:
    return endpoint.hostname if endpoint.port == 22 else f"[{endpoint.hostname}]:{endpoint.port}"


class _UnknownKeyPolicy(paramiko.MissingHostKeyPolicy):
    """An unknown host key: refused, or (accept_unknown_host_key) trusted once and pinned, so every
    later connection of this run to that endpoint must offer the same key."""

    def __init__(self, endpoint: SSHEndpoint, logger: logging.Logger | logging.LoggerAdapter,
                 pinned: dict[str, paramiko.PKey]) -> None:
        self.endpoint = endpoint
        self.logger = logger
        self.pinned = pinned

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        where = _known_name(self.endpoint)
        if self.endpoint.accept_unknown_host_key:
            self.logger.warning(
                "trusting the unknown SSH host key of %s (%s %s) because accept_unknown_host_key is set; it is pinned "
                "for the rest of this run",
                where, key.get_name(), _fingerprint(key),
            )
            client.get_host_keys().add(hostname, key.get_name(), key)
            self.pinned[where] = key
            return
        raise HostKeyError(
            f"the SSH host key of {where} ({key.get_name()} {_fingerprint(key)}) is not in "
            f"{self.endpoint.known_hosts or '~/.ssh/known_hosts'}. Check the fingerprint with the host's "
            f"administrator, then add it (ssh-keyscan -p {self.endpoint.port} {self.endpoint.hostname} >> known_hosts) "
            "or set accept_unknown_host_key to trust it once."
        )


def load_private_key(text: str, passphrase: str | None) -> paramiko.PKey:
    """Parse an OpenSSH or PEM private key of any supported type."""
    errors = []
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(text), password=passphrase)
        except paramiko.PasswordRequiredException as exc:
            raise HostError("the SSH private key is encrypted: give its passphrase") from exc
        except (paramiko.SSHException, ValueError) as exc:
            errors.append(f"{cls.__name__}: {type(exc).__name__}")
    raise HostError("the SSH private key could not be read as Ed25519, ECDSA or RSA: " + "; ".join(errors))


class SSHHost(Host):
    def __init__(
        self,
        endpoint: SSHEndpoint,
        *,
        jump: SSHEndpoint | None = None,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        config: HostConfig | None = None,
    ) -> None:
        self.config = config or HostConfig(kind="ssh", ssh=endpoint, jump=jump)
        self.endpoint = endpoint
        self.jump = jump
        self.logger = logger or _log
        user = f"{endpoint.user}@" if endpoint.user else ""
        self.label = f"{user}{endpoint.hostname}:{endpoint.port}"
        self._client: paramiko.SSHClient | None = None
        self._jump_client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self.connects = 0
        # Host keys trusted by accept_unknown_host_key, by known_hosts name (the jump host's and the
        # target's apart): a later connection offering another key is refused as a changed one.
        self._pinned: dict[str, paramiko.PKey] = {}

    # -- connection -----------------------------------------------------------------------

    def _open_client(self, endpoint: SSHEndpoint, sock: paramiko.Channel | None) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        known = endpoint.known_hosts or Path("~/.ssh/known_hosts").expanduser()
        if Path(known).exists():
            client.load_host_keys(str(known))
        name = _known_name(endpoint)
        if name in self._pinned:
            pinned = self._pinned[name]
            client.get_host_keys().add(name, pinned.get_name(), pinned)
        client.set_missing_host_key_policy(_UnknownKeyPolicy(endpoint, self.logger, self._pinned))
        pkey = None
        passphrase = endpoint.passphrase.get_secret_value() if endpoint.passphrase else None
        if endpoint.private_key is not None:
            pkey = load_private_key(endpoint.private_key.get_secret_value(), passphrase)
        elif endpoint.key_path is not None:
            path = Path(endpoint.key_path).expanduser()
            if not path.is_file():
                raise HostError(f"SSH key file {path} does not exist: fix ssh.key_path")
            try:
                # The stubs say str; paramiko hands it to cryptography, which takes bytes only.
                pkey = paramiko.PKey.from_path(path, password=passphrase.encode() if passphrase else None)  # type: ignore[arg-type]
            except paramiko.PasswordRequiredException as exc:
                raise HostError(f"SSH key {path} is encrypted: give its passphrase") from exc
        where = f"{endpoint.user + '@' if endpoint.user else ''}{endpoint.hostname}:{endpoint.port}"
        try:
            client.connect(
                endpoint.hostname,
                port=endpoint.port,
                username=endpoint.user,
                pkey=pkey,
                allow_agent=endpoint.use_agent,
                look_for_keys=pkey is None,
                timeout=endpoint.connect_timeout_s,
                banner_timeout=endpoint.connect_timeout_s,
                auth_timeout=endpoint.connect_timeout_s,
                channel_timeout=endpoint.connect_timeout_s,
                sock=sock,
            )
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                f"the SSH host key of {_known_name(endpoint)} CHANGED: known_hosts has "
                f"{_fingerprint(exc.expected_key)}, the server offered {exc.key.get_name()} {_fingerprint(exc.key)}. "
                "This can be an attack. If the host was reinstalled, remove the old entry with "
                f"ssh-keygen -R '{_known_name(endpoint)}' and add the new one."
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            if "Authentication timeout" in str(exc):  # the server never answered the login: a stall, not a refusal
                raise _HandshakeFailed(f"cannot log in to SSH server {where}: no answer to the login in "
                                       f"{endpoint.connect_timeout_s:g} s") from None
            raise HostError(
                f"SSH authentication failed for {where}: {exc}. Check the user name and the key "
                "(key_path, private_key or the agent)."
            ) from None
        except socket.gaierror as exc:
            client.close()
            raise HostError(f"cannot resolve SSH host {endpoint.hostname!r}: {exc}. Check ssh.hostname.") from None
        except paramiko.ssh_exception.IncompatiblePeer as exc:  # no key exchange or cipher in common: trying again cannot help
            client.close()
            raise HostError(f"cannot connect to SSH server {where}: {type(exc).__name__}: {exc}") from None
        except (paramiko.SSHException, EOFError, ConnectionResetError) as exc:
            client.close()
            if "No authentication methods available" in str(exc):
                raise HostError(f"SSH login to {where} has no key to offer: give ssh.key_path or ssh.private_key, "
                                "or load the key into the agent") from None
            # The TCP connection opened, the handshake did not end: a busy sshd (MaxStartups drops connections
            # beyond its limit) or a loaded machine. Worth another try (_connect).
            raise _HandshakeFailed(f"cannot connect to SSH server {where}: {type(exc).__name__}: {exc}") from None
        except OSError as exc:
            client.close()
            raise HostError(f"cannot connect to SSH server {where}: {type(exc).__name__}: {exc}") from None
        transport = client.get_transport()
        if transport is not None and endpoint.keepalive_s:
            transport.set_keepalive(endpoint.keepalive_s)
        return client

    def _connect(self) -> paramiko.Transport:
        """Connect (through the jump host, if any). A handshake that fails after the TCP connection opened (dropped,
        no banner, a login left unanswered) is tried again, HANDSHAKE_TRIES times in all, a second and then two
        apart: never a refused key, a changed host key, no algorithm in common, a name that does not resolve or a
        host that does not answer (each says so at once). The connection's lock is held meanwhile."""
        for attempt in range(1, HANDSHAKE_TRIES + 1):
            try:
                return self._connect_once()
            except _HandshakeFailed as exc:
                if attempt == HANDSHAKE_TRIES:
                    self._drop()  # the jump host's connection too
                    raise HostError(f"{exc} (tried {HANDSHAKE_TRIES} times)") from None
                self.logger.warning("%s; trying again in %d s", exc, attempt)
                time.sleep(attempt)
        raise AssertionError("unreachable")

    def _connect_once(self) -> paramiko.Transport:
        self._drop()
        sock = None
        if self.jump is not None:
            self._jump_client = self._open_client(self.jump, None)
            jt = self._jump_client.get_transport()
            assert jt is not None
            try:
                sock = jt.open_channel(
                    "direct-tcpip",
                    (self.endpoint.hostname, self.endpoint.port),
                    ("127.0.0.1", 0),
                    timeout=self.endpoint.connect_timeout_s,
                )
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._drop()
                raise HostError(
                    f"the jump host {self.jump.hostname}:{self.jump.port} could not open a tunnel to "
                    f"{self.endpoint.hostname}:{self.endpoint.port}: {exc}. Check that the target address is "
                    "reachable from the jump host and that it allows TCP forwarding."
                ) from None
        self._client = self._open_client(self.endpoint, sock)
        self.connects += 1
        transport = self._client.get_transport()
        assert transport is not None
        return transport

    def _transport(self, *, reconnect: bool = False) -> paramiko.Transport:
        with self._lock:
            transport = self._client.get_transport() if self._client else None
            if transport is not None and transport.is_active() and not reconnect:
                return transport
            if transport is not None or reconnect:
                self.logger.warning("SSH connection to %s dropped; reconnecting once", self.label)
            return self._connect()

    def transport(self, *, reconnect: bool = False) -> paramiko.Transport:
        """The live SSH transport (connecting, or reconnecting once, as needed): tunnels open channels on it."""
        return self._transport(reconnect=reconnect)

    def verified_host_keys(self) -> list[str]:
        """known_hosts lines of the host keys this connection verified (the target's and the jump host's),
        so that other SSH clients of this run trust exactly those."""
        self._transport()
        lines = []
        for client, ep in ((self._client, self.endpoint), (self._jump_client, self.jump)):
            transport = client.get_transport() if client else None
            if transport is None or ep is None:
                continue
            key = transport.get_remote_server_key()
            lines.append(f"{_known_name(ep)} {key.get_name()} {key.get_base64()}")
        return lines

    def identity(self) -> str:
        """The SSH server's host key (its fingerprint), as this connection verified it: one machine whatever
        name or address reached it."""
        key = self._transport().get_remote_server_key()
        return f"ssh host key {key.get_name()} {_fingerprint(key)}"

    def accepted_host_keys(self) -> list[str]:
        """known_hosts lines of the keys this run trusted by accept_unknown_host_key (target and jump
        host apart), to record where later runs check against them."""
        return [f"{name} {key.get_name()} {key.get_base64()}" for name, key in self._pinned.items()]

    def _drop(self) -> None:
        for client in (self._client, self._jump_client):
            if client is not None:
                client.close()
        self._client = self._jump_client = None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def secrets(self) -> list[str]:
        return [s.get_secret_value() for ep in (self.endpoint, self.jump) if ep is not None
                for s in (ep.private_key, ep.passphrase) if s is not None]

    # -- commands -------------------------------------------------------------------------

    def _open_session(self) -> paramiko.Channel:
        """A session channel; nothing has been sent on it yet, so any failure here is "not sent"."""
        try:
            try:
                return self._transport().open_session(timeout=self.endpoint.connect_timeout_s)
            except (paramiko.SSHException, OSError, EOFError):
                # The transport died between commands: one reconnect, then give up.
                return self._transport(reconnect=True).open_session(timeout=self.endpoint.connect_timeout_s)
        except (HostKeyError, CommandNotSentError):
            raise
        except HostError as exc:  # connecting failed (refused, authentication, ...): as it says
            raise CommandNotSentError(str(exc)) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise CommandNotSentError(f"SSH connection to {self.label} is down and did not come back: {exc}") from None

    def run(
        self, argv: Sequence[str], *, timeout: float | None = 60.0, check: bool = False, retry: bool = True,
        input: bytes | None = None,
    ) -> CommandResult:
        argv = tuple(str(a) for a in argv)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not retry:
            once = self._run_at_most_once(argv, deadline, timeout, input)
            return self._raise_for(once) if check else once
        try:
            result = self._run_once(argv, deadline, timeout, input=input)
        except _Dropped as exc:
            self.logger.warning("SSH connection to %s dropped while running %s (%s); running it again",
                                self.label, argv[0], exc)
            try:
                result = self._run_once(argv, deadline, timeout, reconnect=True, input=input)
            except _Dropped as again:
                raise HostError(f"SSH connection to {self.label} dropped twice while running {argv[0]}: {again}") from None
        return self._raise_for(result) if check else result

    def _run_at_most_once(self, argv: tuple[str, ...], deadline: float | None, timeout: float | None,
                          input: bytes | None) -> CommandResult:
        """A command that must not run twice: which of "not sent" and "may have run" a failure is."""
        try:
            return self._run_once(argv, deadline, timeout, input=input)
        except (CommandNotSentError, HostKeyError):
            raise
        except _Dropped as exc:
            raise CommandOutcomeUnknown(f"SSH connection to {self.label} dropped after {argv[0]} was sent ({exc}): "
                                        "it may have run, so it was not sent again") from None
        except HostError as exc:
            raise CommandOutcomeUnknown(f"{exc}; it may have run, so it was not sent again") from None

    def _run_once(
        self, argv: tuple[str, ...], deadline: float | None, timeout: float | None, *, reconnect: bool = False,
        input: bytes | None = None,
    ) -> CommandResult:
        start = time.perf_counter()
        if reconnect:
            try:
                self._transport(reconnect=True)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise CommandNotSentError(f"SSH connection to {self.label} is down and did not come back: {exc}") \
                    from None
        chan = self._open_session()
        out, err = bytearray(), bytearray()
        try:
            chan.exec_command(shlex.join(argv))
            if input:
                chan.sendall(input)
            chan.shutdown_write()
            chan.settimeout(0.05)

            def check_time() -> None:
                if deadline is not None and time.monotonic() > deadline:
                    raise HostError(f"{argv[0]} did not finish within {timeout} s on {self.label}")
                transport = chan.get_transport()
                if transport is None or not transport.is_active():
                    raise _Dropped("the transport closed")

            while True:
                try:
                    data = chan.recv(65536)
                    if not data:
                        break
                    out += data
                except TimeoutError:
                    check_time()
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
            while not chan.status_event.wait(0.05):
                check_time()
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            code = chan.recv_exit_status()
            transport = chan.get_transport()
            if code == -1 and (transport is None or not transport.is_active()):
                raise _Dropped("the connection closed before the exit status came back")
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _Dropped(f"{type(exc).__name__}: {exc}") from None
        finally:
            chan.close()
        return CommandResult(argv, code, bytes(out), bytes(err), time.perf_counter() - start)
