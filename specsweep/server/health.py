"""Wait until a server can serve.

Readiness is the HTTP status of the health path and nothing else: 200 is ready; a refused
connection, 502 or 503 means "not yet" (engines answer 503 while they load and warm up, then
200, with or without a body). Any other answer is logged and polled again; a profile may ask
for one tiny generation on top (``readiness_probe``), for engines whose health answers before
they can serve. The server process is checked on every tick, so a
crash during startup fails the wait within about half a second, with the log's last lines.
While waiting, new lines of the server log are handed to ``on_log_line``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from pydantic import BaseModel, Field

from specsweep.errors import HealthTimeoutError, HostError, NoAnswer, ServerCrashedError, ServerUnreachableError
from specsweep.hosts.base import Host
from specsweep.hosts.tunnel import ServerPath
from specsweep.profiles import ServerProfile
from specsweep.server.api import ServerAPI
from specsweep.server.lifecycle import LOG_TAIL_LINES, Logger, ServerHandle

_log = logging.getLogger(__name__)

FIRST_INTERVAL_S = 0.05
GROWTH = 1.5
PROCESS_CHECK_S = 0.5
#: A health attempt is logged when its answer differs from the last one logged, else once this often: a start of
#: minutes polled every 0.15-0.5 s would otherwise fill the run's log with the same line.
PROGRESS_EVERY_S = 10.0


class HealthReport(BaseModel):
    url: str
    ready: bool
    time_to_ready_s: float = Field(description="From the server's start to the first ready answer.")
    waited_s: float = Field(description="How long this wait took.")
    attempts: int
    probe_ok: bool | None = Field(None, description="Result of the readiness probe; None when not asked for.")


def _left(deadline: float, most: float) -> float:
    """A call's limit: at most ``most``, and never past the wait's own deadline."""
    return max(0.05, min(most, deadline - time.monotonic()))


#: What of a server's log a start forwards into the run's log (which everyone with API access reads): lines cut
#: to this many characters, and this many lines at most; the log file on the host keeps everything. A server that
#: prints a file's text (an engine may log the chat template it loads) so shows a few lines of it at most.
FORWARD_LINE_CHARS = 400
FORWARD_LINES = 200


class _LogFollower:
    """Reads lines appended to the server log since the last call (a bounded number of bounded lines)."""

    def __init__(self, host: Host, path: str, sink: Callable[[str], None] | None) -> None:
        self.host, self.path, self.sink = host, path, sink
        self.offset = 0
        self.partial = b""
        self.sent = 0

    def _send(self, text: str) -> None:
        assert self.sink is not None
        if self.sent < FORWARD_LINES:
            cut = len(text) - FORWARD_LINE_CHARS
            self.sink(text if cut <= 0 else f"{text[:FORWARD_LINE_CHARS]}... ({cut} more characters in the log file)")
        elif self.sent == FORWARD_LINES:
            self.sink(f"(no more of the server's log is forwarded after {FORWARD_LINES} lines: it is in {self.path} "
                      "on the host)")
        self.sent += 1

    def poll(self) -> None:
        if self.sink is None or self.sent > FORWARD_LINES:
            return
        data = self.host.read_from(self.path, self.offset, limit=256 * 1024)
        if not data:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()[: 4 * FORWARD_LINE_CHARS]  # a line with no end yet is kept bounded too
        for line in lines:
            text = line.decode("utf-8", errors="replace").rstrip("\r")
            if text.strip():
                self._send(text)

    def flush(self) -> None:
        if self.sink is not None and self.partial.strip():
            self._send(self.partial.decode("utf-8", errors="replace"))
        self.partial = b""


async def _quietly(fn: Callable[[], None]) -> None:
    """Forwarding log lines is a courtesy: a host that cannot be reached just now does not stop the wait."""
    try:
        await asyncio.to_thread(fn)
    except HostError:
        pass


async def _host_check(host: Host, follower: _LogFollower, handle: ServerHandle, log: Logger) -> bool | None:
    """Forward new log lines and tell whether the server process lives; None when the host
    cannot be asked just now (the health endpoint is polled on regardless)."""
    try:
        await asyncio.to_thread(follower.poll)
        return await asyncio.to_thread(host.pid_alive, handle.pid)
    except HostError as exc:
        log.warning("cannot check the server process on %s just now (%s); polling its health endpoint on",
                    host.label, exc)
        return None


class _Unreachable:
    """Says when the host reports the server's port listening while the client keeps failing to connect:
    the server is up but not where the client looks (another bind address, a firewall)."""

    CHECK_EVERY_S = 1.0
    CHECKS = 3

    def __init__(self, host: Host, port: int) -> None:
        self.host, self.port = host, port
        self.seen = 0
        self.next_at = 0.0

    def reset(self) -> None:
        self.seen = 0

    async def listening_yet_unreachable(self) -> bool:
        now = time.monotonic()
        if now < self.next_at:
            return False
        self.next_at = now + self.CHECK_EVERY_S
        try:
            listening = await asyncio.to_thread(self.host.port_listening, self.port)
        except HostError:
            return False
        self.seen = self.seen + 1 if listening else 0
        return self.seen >= self.CHECKS


async def wait_for_health(
    host: Host,
    profile: ServerProfile,
    handle: ServerHandle,
    api: ServerAPI,
    *,
    path: ServerPath | None = None,
    timeout_s: float | None = None,
    logger: Logger | None = None,
    on_log_line: Callable[[str], None] | None = None,
) -> HealthReport:
    """Poll until the server is ready; raise ServerCrashedError, ServerUnreachableError or
    HealthTimeoutError otherwise. ``path``: the client's way to the server (a tunnel is reported
    as down, apart from the server not being ready yet)."""
    wait = _HealthWait(host, profile, handle, api, path, profile.startup_timeout_s if timeout_s is None else timeout_s,
                       logger or _log, on_log_line)
    return await wait.run()


class _HealthWait:
    """One wait for health, in its steps: each tick checks the process (and forwards its log lines) and the
    tunnel every PROCESS_CHECK_S, polls the health path at a growing interval, and ends ready, crashed,
    unreachable or timed out."""

    def __init__(self, host: Host, profile: ServerProfile, handle: ServerHandle, api: ServerAPI,
                 path: ServerPath | None, timeout_s: float, log: Logger,
                 on_log_line: Callable[[str], None] | None) -> None:
        self.host, self.profile, self.handle, self.api, self.path, self.log = host, profile, handle, api, path, log
        self.timeout_s = timeout_s
        self.redact = profile.redactor()
        self.url = api.base_url + profile.health_path
        self.follower = _LogFollower(host, handle.log_path,
                                     (lambda line: on_log_line(self.redact(line))) if on_log_line else None)
        self.start = time.monotonic()
        self.deadline = self.start + timeout_s
        self.interval = FIRST_INTERVAL_S
        self.next_poll = self.next_check = self.start
        self.attempts = 0
        self.logged, self.logged_at = "", 0.0
        self.last = "no attempt yet"
        self.unreachable = _Unreachable(host, profile.port)
        self.tunnel_was_down = False

    async def run(self) -> HealthReport:
        self.log.info("waiting for %s to become ready at %s (timeout %.0f s)", self.profile.name, self.url,
                      self.timeout_s)
        while True:
            now = time.monotonic()
            if now >= self.next_check:
                await self.check_process(now)
                self.check_tunnel()
                self.next_check = now + PROCESS_CHECK_S
            if now >= self.next_poll:
                if (report := await self.attempt()) is not None:
                    return report
                self.interval = min(self.interval * GROWTH, self.profile.health_poll_max_interval_s)
                self.next_poll = time.monotonic() + self.interval
            now = time.monotonic()
            if now >= self.deadline:
                await self.flush_log()
                raise HealthTimeoutError(
                    f"server {self.profile.name} on {self.host.label} was not ready after {self.timeout_s:.0f} s "
                    f"({self.attempts} attempts; last: {self.last}). It is still running; raise startup_timeout_s if "
                    f"it is merely slow. Last lines of {self.handle.log_path}:\n{await self.log_tail()}")
            await asyncio.sleep(max(0.0, min(self.next_poll, self.next_check, self.deadline) - now))

    async def check_process(self, now: float) -> None:
        """Forward new log lines; a server process that exited fails the wait with its log's last lines."""
        if await _host_check(self.host, self.follower, self.handle, self.log) is False:
            await self.flush_log()
            raise ServerCrashedError(
                f"server {self.profile.name} (pid {self.handle.pid}) on {self.host.label} exited while starting, "
                f"{now - self.start:.1f} s into the wait. Last lines of {self.handle.log_path}:\n{await self.log_tail()}")

    def check_tunnel(self) -> None:
        """Say when the client's tunnel goes down or comes back: that is not the server."""
        down = self.path.problem() if self.path is not None else None
        if down and not self.tunnel_was_down:
            self.log.warning("the tunnel to %s is down: %s (this is not the server: it is being reopened)",
                             self.profile.name, down)
        elif self.tunnel_was_down and not down:
            self.log.info("the tunnel to %s is up again", self.profile.name)
        self.tunnel_was_down = bool(down)

    async def attempt(self) -> HealthReport | None:
        """One poll of the health path (and the readiness probe on a 200): the report when ready, else None."""
        self.attempts += 1
        status: int | None
        try:
            status = await self.api.status(self.profile.health_path, timeout_s=_left(self.deadline, self.api.timeout_s))
            self.last, refused = f"HTTP {status}", False
        except NoAnswer as exc:
            status = None
            self.last = "connection refused" if exc.refused else str(exc)
            refused = exc.refused
        elapsed = time.monotonic() - self.start
        if refused and not self.tunnel_was_down and await self.unreachable.listening_yet_unreachable():
            raise ServerUnreachableError(
                f"server {self.profile.name} listens on port {self.profile.port} on {self.host.label} (the host says "
                f"so), but the client cannot reach it at {self.api.base_url}{f' ({self.path.how})' if self.path else ''}: "
                f"{self.last}. Check the address it binds to (profile host {self.profile.host!r}: a tunnel delivers to "
                "that address on the host) and, for direct traffic, the firewall and http_address.")
        if status is not None:
            self.unreachable.reset()
        probe_ok = None
        if status == 200 and self.profile.readiness_probe:
            problem = await self.api.probe(self.profile.probe_path, timeout_s=_left(self.deadline, 60.0))
            probe_ok = problem is None
            if problem:
                self.last, status = problem, None
        if status == 200:
            return await self.ready(elapsed, probe_ok)
        self.log_attempt(status, elapsed)
        return None

    async def ready(self, elapsed: float, probe_ok: bool | None) -> HealthReport:
        await self.flush_log()
        report = HealthReport(url=self.url, ready=True, time_to_ready_s=time.time() - self.handle.started_at,
                              waited_s=elapsed, attempts=self.attempts, probe_ok=probe_ok)
        self.log.info("%s is ready after %.1f s (attempt %d, %.1f s since start)", self.profile.name, elapsed,
                      self.attempts, report.time_to_ready_s)
        return report

    def log_attempt(self, status: int | None, elapsed: float) -> None:
        """An attempt is logged when its answer changes, and the same answer once every PROGRESS_EVERY_S."""
        if self.last == self.logged and elapsed - self.logged_at < PROGRESS_EVERY_S:
            return
        self.logged, self.logged_at = self.last, elapsed
        if status in (None, 502, 503, 200):
            self.log.info("health attempt %d after %.1f s: not ready (%s)", self.attempts, elapsed, self.last)
        else:
            self.log.warning("health attempt %d after %.1f s: unexpected %s, polling on", self.attempts, elapsed,
                             self.last)

    async def flush_log(self) -> None:
        await _quietly(self.follower.poll)
        self.follower.flush()

    async def log_tail(self) -> str:
        try:
            tail = await asyncio.to_thread(self.host.tail, self.handle.log_path, LOG_TAIL_LINES)
        except HostError as exc:
            return f"(cannot read the log: {self.redact(str(exc))})"
        return self.redact(tail.rstrip()) or "(the log is empty)"
