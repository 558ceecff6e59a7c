"""Errors raised to the user.

    SpecsweepError
    ├── ConfigError              a parameter or profile is invalid (before any host is touched)
    ├── HostError                a host could not be reached or a command on it failed
    │   ├── HostKeyError         an SSH host key is unknown or changed
    │   ├── TunnelError          the SSH tunnel to the server's port cannot open or is down
    │   ├── CommandNotSentError  a command that must run once was not sent (safe to send again)
    │   ├── CommandOutcomeUnknown  a command that must run once may have run (its answer was lost)
    │   └── CommandError         a command exited non-zero where success was required
    ├── StoreError               results could not be written or read
    └── ServerError              the server under test misbehaved
        ├── PortBusyError        the server's port is held by another process
        ├── ServerStartError     the launch itself failed (no pid, bad log path, ...)
        │   └── StartUnverifiedError  a start may have run and what it started could not be removed
        ├── ServerCrashedError   the server process died while starting
        ├── ServerUnreachableError  the server listens on its host, but the client cannot reach it
        ├── NoAnswer             a call to the server's API got no (usable) answer in time
        ├── HealthTimeoutError   the server did not become ready in time
        └── KillError            processes or the port survived a kill, or GPU memory stayed high

Every message says what happened, the cause where known, and what to do next.
"""

from __future__ import annotations


class SpecsweepError(Exception):
    """Base class of every error specsweep raises on purpose."""


class ConfigError(SpecsweepError, ValueError):
    """A parameter, profile or file is invalid."""


class HostError(SpecsweepError):
    """A host could not be reached, or a command on it failed."""


class HostKeyError(HostError):
    """An SSH host key is unknown or does not match known_hosts."""


class TunnelError(HostError):
    """The SSH tunnel that carries the client's HTTP to the server cannot open, or is down."""


class CommandNotSentError(HostError):
    """A command that must run at most once was never sent to the host: sending it again is safe."""


class CommandOutcomeUnknown(HostError):
    """A command that must run at most once was sent, but its answer was lost (the link dropped, or it
    timed out): it may have run. Never send it again blindly."""


class CommandError(HostError):
    """A command on a host exited non-zero where success was required."""

    def __init__(self, message: str, *, exit_code: int | None = None, stderr: str = "") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.stderr = stderr


class ServerError(SpecsweepError):
    """The server under test misbehaved."""


class PortBusyError(ServerError):
    """The server's port is already held by another process."""


class ServerStartError(ServerError):
    """The server could not be launched."""


class StartUnverifiedError(ServerStartError):
    """A start may have run, and whatever it started could not be found and removed: not retried."""


class ServerCrashedError(ServerError):
    """The server process exited while it was starting."""


class ServerUnreachableError(ServerError):
    """The host says the server's port listens, but the client's requests cannot reach it."""


class NoAnswer(ServerError):
    """A call to the server's API outside the timed load got no usable answer: refused, closed, timed
    out (the whole call, not one read), or an answer larger than the client reads."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        #: Nothing answered at all (connection refused or closed at once): the server is not up yet,
        #: or not where the client looks; not a slow answer.
        self.refused = refused


class HealthTimeoutError(ServerError):
    """The server did not become ready within its startup timeout."""


class KillError(ServerError):
    """A kill left processes, a held port or used GPU memory behind."""


class StoreError(SpecsweepError):
    """Results could not be written or read."""


class MeasurementError(SpecsweepError):
    """What was measured cannot answer the question (every block set aside as disturbed)."""


class DriftError(SpecsweepError):
    """The answer moved from the last comparison of the same kind beyond what their intervals allow (the
    nightly run fails on it, so that its notifications fire)."""
