"""The host interface: everything specsweep does to a machine goes through one of these.

Every operation is an argv list. Where a shell cannot be avoided (redirections, a
background job), the script is a constant and parameters reach it only as positional
arguments (``sh -c SCRIPT sh ARG...``), so no value is ever parsed by a shell.
Implementations differ only in how they run one command: ``LocalHost`` with
``subprocess``, ``SSHHost`` over paramiko.
"""

from __future__ import annotations

import re
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from specsweep.errors import CommandError, ServerStartError


@dataclass(frozen=True)
class CommandResult:
    """What one command did: its argv, exit code, output and duration."""

    argv: tuple[str, ...]
    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    duration_s: float

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    args: str

    @property
    def alive(self) -> bool:
        return not self.state.startswith(("Z", "X"))


@dataclass
class _Env:
    values: dict[str, str] = field(default_factory=dict)

    def argv(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.values.items()]


# Truncates the log, enters cwd, and starts "$@" in a new session with the log as its
# output. setsid does not fork here (the background child is not a group leader), so
# $! is the server's pid, its process group id and its session id.
_START_SCRIPT = r"""log=$1; cwd=$2; shift 2
mkdir -p -- "$(dirname -- "$log")" || exit 97
: > "$log" || exit 97
if [ -n "$cwd" ]; then cd -- "$cwd" || exit 98; fi
setsid "$@" </dev/null >>"$log" 2>&1 &
echo $!"""

_READ_FROM_SCRIPT = r"""tail -c +"$1" -- "$2" 2>/dev/null | head -c "$3" """

_ENVIRON_SCRIPT = r"""grep -lsazx -e "$1" /proc/[0-9]*/environ; exit 0"""

_SS_PID = re.compile(r"pid=(\d+)")


class Host(ABC):
    """A machine that servers run on. Use as a context manager; ``close`` is idempotent."""

    #: A short name for logs and handles, such as ``local`` or ``user@gpu-01:22``.
    label: str

    @abstractmethod
    def run(
        self, argv: Sequence[str], *, timeout: float | None = 60.0, check: bool = False, retry: bool = True,
        input: bytes | None = None,
    ) -> CommandResult:
        """Run one command and wait for it. Output is drained before the exit code is read.

        ``input``: bytes for the command's standard input (secrets travel this way, never on
        its command line); without it, the input is empty.

        ``retry``: the command may run twice (it is idempotent), so a host reached over a
        network runs it again once if the connection drops under it.
        """

    def close(self) -> None:  # noqa: B027 - hosts without connections have nothing to close
        pass

    def secrets(self) -> list[str]:
        """Values that must never reach a log line (SSH keys and passphrases)."""
        return []

    def __enter__(self) -> Host:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- helpers built on run() ---------------------------------------------------------

    def _raise_for(self, result: CommandResult) -> CommandResult:
        if not result.ok:
            raise CommandError(
                f"{result.argv[0]} failed on {self.label} with exit code {result.exit_code}: "
                f"{result.stderr.strip() or result.stdout.strip()}",
                exit_code=result.exit_code,
                stderr=result.stderr,
            )
        return result

    def _checked(self, argv: Sequence[str], timeout: float | None = 60.0) -> CommandResult:
        return self._raise_for(self.run(argv, timeout=timeout))

    def start_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> int:
        """Start ``argv`` in a new session, detached from this connection, and return its pid.

        The pid is also the process group id. The log file is truncated first; stdout and
        stderr go to it. The process survives the end of the SSH connection.
        """
        if not argv:
            raise ServerStartError("nothing to start: the launch argv is empty")
        env_argv = ["env", "--", *_Env(dict(env or {})).argv()] if env else []
        script = ["sh", "-c", _START_SCRIPT, "sh", log_path, cwd or "", *env_argv, *argv]
        # Never run twice: a start whose answer was lost may have started a server already.
        result = self.run(script, timeout=60.0, retry=False)
        if result.exit_code == 97:
            raise ServerStartError(
                f"cannot write the server log {log_path!r} on {self.label}: {result.stderr.strip()}. "
                "Choose a log_path in a writable directory."
            )
        if result.exit_code == 98:
            raise ServerStartError(
                f"cannot enter the working directory {cwd!r} on {self.label}: {result.stderr.strip()}. "
                "Check the profile's cwd."
            )
        if not result.ok or not result.stdout.strip().isdigit():
            raise ServerStartError(
                f"launching the server on {self.label} failed (exit {result.exit_code}): "
                f"{result.stderr.strip() or result.stdout.strip()}"
            )
        return int(result.stdout.strip())

    def signal_group(self, pgid: int, sig: int = signal.SIGTERM) -> bool:
        """Send ``sig`` to a whole process group. False when no such group exists."""
        return self.run(["kill", f"-{int(sig)}", "--", f"-{int(pgid)}"], timeout=30).ok

    def signal_pids(self, pids: Sequence[int], sig: int = signal.SIGTERM) -> None:
        if pids:
            self.run(["kill", f"-{int(sig)}", "--", *(str(int(p)) for p in pids)], timeout=30)

    def processes(self) -> list[ProcessInfo]:
        """Every process on the host (that the user may see), from ``ps``."""
        out = self._checked(["ps", "-eo", "pid=,ppid=,pgid=,sid=,stat=,args="]).stdout
        procs = []
        for line in out.splitlines():
            parts = line.split(None, 5)
            if len(parts) < 5:
                continue
            pid, ppid, pgid, sid, state = parts[:5]
            procs.append(ProcessInfo(int(pid), int(ppid), int(pgid), int(sid), state, parts[5] if len(parts) > 5 else ""))
        return procs

    def pid_alive(self, pid: int) -> bool:
        """True while ``pid`` exists and is not a zombie."""
        result = self.run(["ps", "-o", "stat=", "-p", str(int(pid))], timeout=30)
        state = result.stdout.strip()
        return result.ok and bool(state) and not state.startswith(("Z", "X"))

    def pids_with_env(self, name: str, value: str) -> list[int]:
        """Pids whose environment holds exactly ``name=value`` (inherited by every descendant)."""
        out = self.run(["sh", "-c", _ENVIRON_SCRIPT, "sh", f"{name}={value}"], timeout=30).stdout
        return sorted(int(m) for m in re.findall(r"/proc/(\d+)/environ", out))

    def port_owners(self, port: int) -> list[int]:
        """Pids of the processes listening on TCP ``port`` (any address)."""
        out = self.run(["ss", "-Hltnp", "sport", "=", f":{int(port)}"], timeout=30).stdout
        return sorted({int(p) for p in _SS_PID.findall(out)})

    def port_listening(self, port: int) -> bool:
        out = self.run(["ss", "-Hltn", "sport", "=", f":{int(port)}"], timeout=30).stdout
        return bool(out.strip())

    def read_from(self, path: str, offset: int, limit: int = 1 << 20) -> bytes:
        """Up to ``limit`` bytes of a file from byte ``offset``; empty when it does not exist."""
        argv = ["sh", "-c", _READ_FROM_SCRIPT, "sh", str(int(offset) + 1), path, str(int(limit))]
        return self.run(argv, timeout=60).stdout_bytes

    def tail(self, path: str, lines: int = 40) -> str:
        """The last lines of a file, or an empty string when it cannot be read."""
        result = self.run(["tail", "-n", str(int(lines)), "--", path], timeout=30)
        return result.stdout if result.ok else ""

    def which(self, program: str) -> str | None:
        result = self.run(["sh", "-c", 'command -v -- "$1"', "sh", program], timeout=30)
        return result.stdout.strip() or None if result.ok else None

    def wait_until(self, predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
        """Poll ``predicate()`` until true or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)
