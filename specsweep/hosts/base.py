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
from dataclasses import dataclass
from types import TracebackType

from specsweep.errors import CommandError, ServerStartError
from specsweep.hosts.config import HostConfig
from specsweep.hosts.scripts import (
    ENVIRON_SCRIPT,
    ENVIRON_VALUE_SCRIPT,
    FILE_NAME,
    READ_FROM_SCRIPT,
    REMOVE_STALE_TMP_SCRIPT,
    SS_PID,
    START_COMMAND_TIMEOUT_S,
    START_SCRIPT,
    WRITE_PRIVATE_SCRIPT,
    check_env_names,
    env_script,
)
from specsweep.profiles import is_env_name

#: How much of one log line ``Host.tail`` gives (a line of a file a server printed, quoted in an error).
TAIL_LINE_CHARS = 400


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
    uid: int
    user: str
    state: str
    args: str

    @property
    def alive(self) -> bool:
        return not self.state.startswith(("Z", "X"))


@dataclass(frozen=True)
class Started:
    """What a detached start reports: the pid (also its process group and session) and the log's path."""

    pid: int
    log_path: str
    cuda_visible_devices: str | None = None
    #: Its private temporary folder (None: none asked for, or a socket's path in it would be too long).
    tmp_dir: str | None = None



class Host(ABC):
    """A machine that servers run on. Use as a context manager; ``close`` is idempotent."""

    #: A short name for logs and handles, such as ``local`` or ``user@gpu-01:22``.
    label: str
    #: The resolved config the host was opened from (traffic, load generator, ...).
    config: HostConfig
    _login_uid: int | None = None
    _login_user: str | None = None

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

    @abstractmethod
    def identity(self) -> str:
        """The machine itself, however it is spelled (``gpu-01`` or ``gpu-01.lab.example``, an address):
        what one lock per machine is keyed on."""

    def secrets(self) -> list[str]:
        """Values that must never reach a log line (SSH keys and passphrases)."""
        return []

    def accepted_host_keys(self) -> list[str]:
        """known_hosts lines of host keys trusted this run because accept_unknown_host_key was set."""
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
        tmp_dir: str | None = None,
        tmp_env: Sequence[str] = (),
    ) -> Started:
        """Start ``argv`` in a new session, detached from this connection: its pid, log path and the
        CUDA_VISIBLE_DEVICES it was given.

        The pid is also the process group id. The log file (in a directory private to the login
        user) is truncated first; stdout and stderr go to it. The environment travels on stdin,
        never on a command line. The process survives the end of the SSH connection. ``tmp_dir``
        (``~/.specsweep/tmp/NAME``), when given, is created private and each variable of ``tmp_env`` names it.

        Sent at most once: ``CommandNotSentError`` when it was not sent (safe to send again),
        ``CommandOutcomeUnknown`` when its answer was lost (it may have started a server).
        """
        if not argv:
            raise ServerStartError("nothing to start: the launch argv is empty")
        check_env_names(tmp_env)
        script = ["sh", "-c", START_SCRIPT, "sh", log_path, cwd or "", tmp_dir or "", " ".join(tmp_env), *argv]
        result = self.run(script, timeout=START_COMMAND_TIMEOUT_S, retry=False, input=env_script(env or {}))
        if result.exit_code == 95:
            raise ServerStartError(f"the server's environment did not reach {self.label} whole "
                                   f"({result.stderr.strip()}): nothing was started")
        if result.exit_code == 96:
            raise ServerStartError(
                f"the server log {log_path!r} (or its temporary folder) on {self.label} is not private: "
                f"{result.stderr.strip()}. Logs go to ~/.specsweep/logs of the SSH user, temporary folders to "
                "~/.specsweep/tmp, folders of its own (not symbolic links, writable by nobody else): fix or remove "
                "that folder on the host."
            )
        if result.exit_code == 97:
            raise ServerStartError(
                f"cannot write the server log {log_path!r} (or create its temporary folder) on {self.label}: "
                f"{result.stderr.strip()}. Make ~/.specsweep/logs (and ~/.specsweep/tmp) writable for the SSH user."
            )
        if result.exit_code == 98:
            raise ServerStartError(
                f"cannot enter the working directory {cwd!r} on {self.label}: {result.stderr.strip()}. "
                "Check the profile's cwd."
            )
        first, _, rest = result.stdout.partition("\n")
        pid, _, path = first.strip().partition(" ")
        if not result.ok or not pid.isdigit():
            raise ServerStartError(
                f"launching the server on {self.label} failed (exit {result.exit_code}): "
                f"{result.stderr.strip() or result.stdout.strip()}"
            )
        said = dict(line.partition("=")[::2] for line in rest.split("\n") if "=" in line)
        return Started(int(pid), path or log_path, said.get("CUDA_VISIBLE_DEVICES"), said.get("PRIVATE_TMP"))

    # kill is the kill program (env finds it), not the login shell's builtin: dash's refuses "--" and
    # a negative pid, so on a host whose login shell is sh every signal would be lost.

    def signal_group(self, pgid: int, sig: int = signal.SIGTERM) -> bool:
        """Send ``sig`` to a whole process group. False when no such group exists."""
        return self.run(["env", "kill", f"-{int(sig)}", "--", f"-{int(pgid)}"], timeout=30).ok

    def signal_pids(self, pids: Sequence[int], sig: int = signal.SIGTERM) -> None:
        if pids:
            self.run(["env", "kill", f"-{int(sig)}", "--", *(str(int(p)) for p in pids)], timeout=30)

    def processes(self) -> list[ProcessInfo]:
        """Every process on the host (that the user may see), with its owner, from ``ps``."""
        out = self._checked(["ps", "-ww", "-eo", "pid=,ppid=,pgid=,sid=,uid=,user:64=,stat=,args="]).stdout
        procs = []
        for line in out.splitlines():
            parts = line.split(None, 7)
            if len(parts) < 7 or not parts[4].isdigit():
                continue
            pid, ppid, pgid, sid, uid, user, state = parts[:7]
            procs.append(ProcessInfo(int(pid), int(ppid), int(pgid), int(sid), int(uid), user, state,
                                     parts[7] if len(parts) > 7 else ""))
        return procs

    def login_uid(self) -> int:
        """The uid commands run as on this host (the SSH user's): kills only ever take its processes."""
        if self._login_uid is None:
            out = self._checked(["id", "-u"]).stdout.strip()
            if not out.isdigit():
                raise CommandError(f"id -u on {self.label} printed {out!r}, not a uid")
            self._login_uid = int(out)
        return self._login_uid

    def login_user(self) -> str:
        if self._login_user is None:
            self._login_user = self._checked(["id", "-un"]).stdout.strip() or str(self.login_uid())
        return self._login_user

    def pid_alive(self, pid: int) -> bool:
        """True while ``pid`` exists and is not a zombie."""
        result = self.run(["ps", "-o", "stat=", "-p", str(int(pid))], timeout=30)
        state = result.stdout.strip()
        return result.ok and bool(state) and not state.startswith(("Z", "X"))

    def pids_with_env(self, name: str, value: str) -> list[int]:
        """Pids whose environment holds exactly ``name=value`` (inherited by every descendant)."""
        out = self.run(["sh", "-c", ENVIRON_SCRIPT, "sh", f"{name}={value}"], timeout=30).stdout
        return sorted(int(m) for m in re.findall(r"/proc/(\d+)/environ", out))

    def environ_value(self, pid: int, name: str) -> str | None:
        """The value of ``name`` in a process's environment (None when unset or unreadable)."""
        if not is_env_name(name):
            raise ValueError(f"not an environment variable name: {name!r}")
        out = self.run(["sh", "-c", ENVIRON_VALUE_SCRIPT, "sh", str(int(pid)), name], timeout=30).stdout
        return out.rstrip("\n")[1:] if out.startswith("=") else None

    def port_owners(self, port: int) -> list[int]:
        """Pids of the processes listening on TCP ``port`` (any address)."""
        out = self.run(["ss", "-Hltnp", "sport", "=", f":{int(port)}"], timeout=30).stdout
        return sorted({int(p) for p in SS_PID.findall(out)})

    def port_listening(self, port: int) -> bool:
        out = self.run(["ss", "-Hltn", "sport", "=", f":{int(port)}"], timeout=30).stdout
        return bool(out.strip())

    def read_from(self, path: str, offset: int, limit: int = 1 << 20) -> bytes:
        """Up to ``limit`` bytes of a file from byte ``offset``; empty when it does not exist."""
        argv = ["sh", "-c", READ_FROM_SCRIPT, "sh", str(int(offset) + 1), path, str(int(limit))]
        return self.run(argv, timeout=60).stdout_bytes

    def write_private_file(self, name: str, data: bytes) -> str:
        """Write ``data`` to ``~/.specsweep/files/<name>`` on the host (mode 600, replaced atomically) and
        return its path: a file a server loads, such as an engine's per-batch speculation setting."""
        if not FILE_NAME.fullmatch(name):
            raise ValueError(f"file name {name!r}: use letters, digits, '.', '_' and '-'")
        result = self._raise_for(self.run(["sh", "-c", WRITE_PRIVATE_SCRIPT, "sh", name], timeout=60, input=data))
        return result.stdout.strip()

    def remove_stale_tmp_dirs(self, token: str = "") -> tuple[list[str], str]:
        """Remove the private temporary folders (``~/.specsweep/tmp/<port>-<token>``) of starts whose processes are
        all gone: that of the start ``token`` at once, others' once 2 minutes old. Returns the paths removed and what
        went wrong (empty when nothing did); a folder a live process's start still uses is left alone."""
        if token and not re.fullmatch(r"[0-9a-f]+", token):
            raise ValueError(f"start token {token!r} is not hexadecimal")
        result = self._raise_for(self.run(["sh", "-c", REMOVE_STALE_TMP_SCRIPT, "sh", token[:12]], timeout=60))
        return [line for line in result.stdout.split("\n") if line], result.stderr.strip()

    def tail(self, path: str, lines: int = 40) -> str:
        """The last lines of a file, or an empty string when it cannot be read. Each is cut to ``TAIL_LINE_CHARS``:
        errors quote them into the run's log, which everyone with API access reads."""
        result = self.run(["tail", "-n", str(int(lines)), "--", path], timeout=30)
        if not result.ok:
            return ""
        return "".join(ln if len(ln) <= TAIL_LINE_CHARS + 1 else f"{ln[:TAIL_LINE_CHARS]}... (cut)\n"
                       for ln in result.stdout.splitlines(keepends=True))

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
