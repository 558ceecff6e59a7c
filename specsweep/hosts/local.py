"""The machine specsweep itself runs on."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from specsweep.errors import CommandNotSentError, CommandOutcomeUnknown, HostError
from specsweep.hosts.base import CommandResult, Host
from specsweep.hosts.config import HostConfig


class LocalHost(Host):
    label = "local"

    def __init__(self, config: HostConfig | None = None) -> None:
        self.config = config or HostConfig()

    def identity(self) -> str:
        """This machine: its systemd machine id (its host name where it has none)."""
        for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
            try:
                if (mid := Path(path).read_text().strip()):
                    return f"machine-id {mid}"
            except OSError:
                continue
        return f"hostname {socket.gethostname()}"

    def run(
        self, argv: Sequence[str], *, timeout: float | None = 60.0, check: bool = False, retry: bool = True,
        input: bytes | None = None,
    ) -> CommandResult:
        argv = tuple(str(a) for a in argv)
        start = time.perf_counter()
        try:
            proc = subprocess.run(argv, capture_output=True, timeout=timeout, input=input,
                                  stdin=subprocess.DEVNULL if input is None else None)
        except subprocess.TimeoutExpired as exc:
            error = HostError if retry else CommandOutcomeUnknown  # it ran, and may have done its work
            raise error(f"{argv[0]} did not finish within {timeout} s on {self.label}") from exc
        except FileNotFoundError as exc:
            raise CommandNotSentError(f"{argv[0]} is not installed on {self.label}: {exc}") from exc
        result = CommandResult(argv, proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start)
        return self._raise_for(result) if check else result
