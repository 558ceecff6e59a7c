"""Start and kill servers on a host, thoroughly.

``kill_server`` is the only way specsweep stops a server. It finds every process that
belongs to it: the launcher's process group, every process that inherited the marker
variable (children that moved to other sessions included), whatever listens on the port,
and processes matching the profile's cleanup patterns (SGLang schedulers escape the
launcher's tree). It sends SIGTERM, waits a grace period, SIGKILLs survivors, then checks
that nothing is left, the port is free and, where nvidia-smi exists, GPU memory fell.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import time
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from specsweep.errors import HostError, KillError, PortBusyError, ServerCrashedError
from specsweep.hosts.base import Host, ProcessInfo
from specsweep.hosts.local import LocalHost
from specsweep.profiles import MARKER_ENV, ServerProfile
from specsweep.redact import Redactor, mask_argv

Logger = logging.Logger | logging.LoggerAdapter
_log = logging.getLogger(__name__)

#: Lines of the server log quoted when it fails.
LOG_TAIL_LINES = 30


class ServerHandle(BaseModel):
    """A started server: JSON-serialisable, so it can cross task and process boundaries."""

    name: str = Field(description="Profile name.")
    host: str = Field(description="Host label, e.g. local or user@gpu-01:22.")
    pid: int = Field(description="Launcher pid; also its process group and session id.")
    pgid: int
    port: int
    log_path: str
    command: str = Field(description="Launch command with secrets masked.")
    started_at: float = Field(description="Wall-clock start time (seconds since the epoch).")

    @property
    def started_at_iso(self) -> str:
        return datetime.fromtimestamp(self.started_at, UTC).isoformat()


class KilledProcess(BaseModel):
    pid: int
    pgid: int
    reason: str = Field(description="Why it was taken as part of the server.")
    command: str = Field(description="Its command line, secrets masked.")
    signal: str = Field(description="The last signal it needed: SIGTERM or SIGKILL.")


class KillReport(BaseModel):
    host: str
    port: int
    killed: list[KilledProcess] = Field(default_factory=list)
    duration_s: float
    port_free: bool
    gpu_memory_used_mib: list[int] | None = Field(None, description="Per GPU after the kill; None without nvidia-smi.")

    def summary(self) -> str:
        if not self.killed:
            held = "" if self.port_free else "; the port is held by another program"
            return f"nothing was running for port {self.port} on {self.host} ({self.duration_s:.2f} s){held}"
        forced = sum(1 for k in self.killed if k.signal == "SIGKILL")
        extra = f", {forced} needed SIGKILL" if forced else ""
        return f"killed {len(self.killed)} process(es) on {self.host} in {self.duration_s:.2f} s{extra}; port {self.port} free"


def _mask_cmdline(args: str, redact: Redactor) -> str:
    try:
        return redact(shlex.join(mask_argv(shlex.split(args))))
    except ValueError:
        return redact(args)


def _protected_pids(host: Host, procs: dict[int, ProcessInfo]) -> set[int]:
    """Processes a kill must never touch: pid 1 and, locally, this process and its ancestors."""
    protected = {0, 1}
    if isinstance(host, LocalHost):
        pid = os.getpid()
        while pid and pid not in protected:
            protected.add(pid)
            pid = procs[pid].ppid if pid in procs else 0
    return protected


def find_server_processes(host: Host, profile: ServerProfile, handle: ServerHandle | None = None) -> dict[int, str]:
    """Every live process that belongs to the server, with the reason it was picked."""
    procs = {p.pid: p for p in host.processes() if p.alive}
    protected = _protected_pids(host, procs)
    found: dict[int, str] = {}

    def take(pid: int, reason: str) -> None:
        if pid in procs and pid not in protected and pid not in found:
            found[pid] = reason

    if handle is not None:
        for p in procs.values():
            if p.pgid == handle.pgid:
                take(p.pid, f"in the server's process group {handle.pgid}")
    for pid in host.pids_with_env(MARKER_ENV, str(profile.port)):
        take(pid, f"started by specsweep for port {profile.port}")
    for pid in host.port_owners(profile.port):
        take(pid, f"listening on port {profile.port}")
    for pattern in profile.cleanup_patterns:
        rx = re.compile(pattern)
        for p in procs.values():
            if rx.search(p.args) and not p.args.startswith("ps -eo"):
                take(p.pid, f"matches cleanup pattern {pattern!r}")
    # Descendants that still hang off the tree.
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found and child not in protected:
                found[child] = f"child of a server process ({procs[child].ppid})"
                stack.append(child)
    return found


def _alive(host: Host, pids: set[int]) -> set[int]:
    return {p.pid for p in host.processes() if p.pid in pids and p.alive}


def _gpu_memory(host: Host, env: dict[str, str]) -> list[int] | None:
    if host.which("nvidia-smi") is None:
        return None
    argv = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
    result = host.run(argv, timeout=60)
    if not result.ok:
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    wanted = {v.strip() for v in visible.split(",")} if visible else None
    used = []
    for line in result.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit() and (wanted is None or parts[0] in wanted):
            used.append(int(parts[1]))
    return used


def kill_server(
    host: Host,
    profile: ServerProfile,
    handle: ServerHandle | None = None,
    *,
    logger: Logger | None = None,
) -> KillReport:
    """Stop everything that belongs to the server and verify it is gone. Nothing running is fine."""
    log = logger or _log
    redact = profile.redactor()
    start = time.monotonic()
    procs = {p.pid: p for p in host.processes()}
    found = find_server_processes(host, profile, handle)
    killed: dict[int, KilledProcess] = {}
    for pid, reason in found.items():
        p = procs.get(pid)
        killed[pid] = KilledProcess(
            pid=pid,
            pgid=p.pgid if p else pid,
            reason=reason,
            command=_mask_cmdline(p.args if p else "", redact),
            signal="SIGTERM",
        )
        log.info("stopping pid %d (%s): %s", pid, reason, killed[pid].command[:200])

    if found:
        protected = _protected_pids(host, procs)
        own_groups = {procs[p].pgid for p in protected if p in procs}
        groups = {k.pgid for k in killed.values() if k.pgid not in own_groups and k.pgid > 1}

        def send(sig: int, pids: set[int]) -> None:
            for g in sorted(groups):
                host.signal_group(g, sig)
            host.signal_pids(sorted(pids), sig)

        remaining = set(found)
        send(signal.SIGTERM, remaining)
        deadline = time.monotonic() + profile.kill_grace_s
        while remaining and time.monotonic() < deadline:
            time.sleep(0.05)
            remaining = _alive(host, remaining)
        if remaining:
            log.warning(
                "%d process(es) ignored SIGTERM for %.0f s: sending SIGKILL to %s",
                len(remaining), profile.kill_grace_s, sorted(remaining),
            )
            for pid in remaining:
                killed[pid].signal = "SIGKILL"
            send(signal.SIGKILL, remaining)
            deadline = time.monotonic() + 10
            while remaining and time.monotonic() < deadline:
                time.sleep(0.05)
                remaining = _alive(host, remaining)
        if remaining:
            raise KillError(
                f"processes {sorted(remaining)} on {host.label} survived SIGKILL (stuck in the kernel?). "
                "Check them with ps; a reboot may be needed."
            )
        # Anything that appeared meanwhile (a child forked during shutdown) goes too.
        late = find_server_processes(host, profile, handle)
        if late:
            for pid, reason in late.items():
                log.warning("a late process %d (%s) appeared during the kill: SIGKILL", pid, reason)
            host.signal_pids(sorted(late), signal.SIGKILL)

    if not found and host.port_listening(profile.port):
        # Nothing was found to kill, yet the port is taken: by a process this kill must spare
        # (its own process tree) or cannot see (another user's). start_server refuses the port,
        # naming the holder.
        log.warning("port %d on %s is held by a process that is not this server's: %s",
                    profile.port, host.label, describe_port_holders(host, profile.port, redact))
        port_free, foreign = False, True
    else:
        port_free, foreign = host.wait_until(lambda: not host.port_listening(profile.port), timeout=10), False
    if not port_free and not foreign:
        owners = host.port_owners(profile.port)
        raise KillError(
            f"port {profile.port} on {host.label} is still in use after the kill "
            f"(pids {owners or 'unknown: not visible to this user'}). "
            "Stop that process by hand or choose another port."
        )

    gpu = _gpu_memory(host, profile.env)
    if gpu is not None:
        deadline = time.monotonic() + profile.gpu_memory_timeout_s
        while any(m >= profile.gpu_memory_free_mib for m in gpu) and time.monotonic() < deadline:
            time.sleep(1.0)
            gpu = _gpu_memory(host, profile.env) or []
        if any(m >= profile.gpu_memory_free_mib for m in gpu):
            raise KillError(
                f"GPU memory on {host.label} is still in use after the kill ({gpu} MiB, limit "
                f"{profile.gpu_memory_free_mib} MiB after {profile.gpu_memory_timeout_s:.0f} s). "
                "Look for leftover processes with nvidia-smi and add their names to cleanup_patterns."
            )

    report = KillReport(
        host=host.label,
        port=profile.port,
        killed=sorted(killed.values(), key=lambda k: k.pid),
        duration_s=time.monotonic() - start,
        port_free=port_free,
        gpu_memory_used_mib=gpu,
    )
    log.info("%s", report.summary())
    return report


def describe_port_holders(host: Host, port: int, redact: Redactor | None = None) -> str:
    owners = host.port_owners(port)
    if not owners:
        return "a process this user cannot see"
    procs = {p.pid: p for p in host.processes()}
    redact = redact or Redactor()
    return "; ".join(
        f"pid {pid} ({_mask_cmdline(procs[pid].args, redact)[:200]})" if pid in procs else f"pid {pid}"
        for pid in owners
    )


def start_server(
    host: Host,
    profile: ServerProfile,
    *,
    kill_port_holder: bool = False,
    logger: Logger | None = None,
) -> ServerHandle:
    """Launch the server detached, in its own session, logging to the profile's log file."""
    log = logger or _log
    redact = profile.redactor()
    if host.port_listening(profile.port):
        holders = describe_port_holders(host, profile.port, redact)
        if not kill_port_holder:
            raise PortBusyError(
                f"port {profile.port} on {host.label} is already in use by {holders}. "
                "Stop it (specsweep server kill), choose another port, or set kill_port_holder to kill it first."
            )
        log.warning("port %d is held by %s: killing it first (kill_port_holder is set)", profile.port, holders)
        kill_server(host, profile, logger=log)
    command = profile.masked_command()
    log.info("starting %s on %s: %s", profile.name, host.label, command)
    started_at = time.time()
    pid = host.start_detached(
        profile.launch_argv(), log_path=profile.resolved_log_path, env=profile.launch_env(), cwd=profile.cwd
    )
    handle = ServerHandle(
        name=profile.name,
        host=host.label,
        pid=pid,
        pgid=pid,
        port=profile.port,
        log_path=profile.resolved_log_path,
        command=command,
        started_at=started_at,
    )
    log.info("server %s started: pid %d, log %s", profile.name, pid, handle.log_path)
    return handle


def raise_if_exited(host: Host, profile: ServerProfile, handle: ServerHandle, when: str) -> None:
    """The crash check between levels: if the server process is gone, raise ServerCrashedError with
    its log's last lines (rather than measuring nothing level after level). A host that cannot be
    asked just now is not a crash."""
    try:
        if host.pid_alive(handle.pid):
            return
        tail = profile.redactor()(host.tail(handle.log_path, LOG_TAIL_LINES).rstrip()) or "(the log is empty)"
    except HostError:
        return
    raise ServerCrashedError(f"server {profile.name} (pid {handle.pid}) on {host.label} exited {when}. "
                             f"The levels measured before are kept. Last lines of {handle.log_path}:\n{tail}")


def find_handle(host: Host, profile: ServerProfile) -> ServerHandle | None:
    """Rebuild the handle of a server specsweep started for this profile's port, if one runs."""
    pids = set(host.pids_with_env(MARKER_ENV, str(profile.port)))
    procs = [p for p in host.processes() if p.pid in pids and p.alive]
    leaders = [p for p in procs if p.pid == p.pgid] or procs
    if not leaders:
        return None
    leader = min(leaders, key=lambda p: p.pid)
    elapsed = host.run(["ps", "-o", "etimes=", "-p", str(leader.pid)], timeout=30).stdout.strip()
    started_at = time.time() - (int(elapsed) if elapsed.isdigit() else 0)
    return ServerHandle(
        name=profile.name,
        host=host.label,
        pid=leader.pid,
        pgid=leader.pgid,
        port=profile.port,
        log_path=profile.resolved_log_path,
        command=_mask_cmdline(leader.args, profile.redactor()),
        started_at=started_at,
    )
