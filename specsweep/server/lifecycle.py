"""Start and kill servers on a host, touching nothing that specsweep did not start.

``kill_server`` is the only way specsweep stops a server, and it takes only processes that
belong to the login (SSH) user and carry specsweep's marker in their environment:

* a server this run started (``handle`` or ``token``): the processes carrying its start's
  token (``SPECSWEEP_START``, inherited by every descendant, even those that leave its
  session), its launcher's process group, and their descendants;
* leftovers of earlier runs (no handle): processes carrying the marker for this port
  (``SPECSWEEP_SERVER_PORT``); the profile's ``cleanup_patterns``, when given, narrow them to
  those whose command line matches one, and never add any.

A process that merely holds the port, or matches a name, is never killed: ``start_server``
refuses a busy port naming its holder, and ``kill_port_holder`` takes a holder only when it is
the SSH user's. A kill sends SIGTERM, waits a grace period, SIGKILLs survivors, then checks that
nothing is left, the port is free and, where nvidia-smi exists, that the GPUs the server used
(its ``CUDA_VISIBLE_DEVICES``) released their memory.

``start_server`` sends its start once: a start whose answer was lost may have started a server,
so before sending it again the processes carrying its token are killed and the port checked.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
import signal
import threading
import time

from pydantic import BaseModel, Field

from specsweep import bounded_regex, policy
from specsweep.errors import (
    CommandNotSentError,
    CommandOutcomeUnknown,
    HostError,
    KillError,
    PortBusyError,
    ServerCrashedError,
    ServerStartError,
    SpecsweepError,
    StartUnverifiedError,
)
from specsweep.hosts.base import Host, ProcessInfo
from specsweep.hosts.local import LocalHost
from specsweep.profiles import MARKER_ENV, START_ENV, ServerProfile
from specsweep.redact import Redactor, mask_argv
from specsweep.server import gpus

Logger = logging.Logger | logging.LoggerAdapter
_log = logging.getLogger(__name__)

#: Lines of the server log quoted when it fails.
LOG_TAIL_LINES = 30


def new_token() -> str:
    """A start's token: unguessable, so that nothing else carries it by chance."""
    return secrets.token_hex(12)


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
    token: str = Field("", description="This start's token (SPECSWEEP_START in the server's environment).")
    cuda_visible_devices: str | None = Field(
        None, description="CUDA_VISIBLE_DEVICES in the server's environment (None: every GPU).")


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
    removed_tmp_dirs: list[str] = Field(default_factory=list, description="Private temporary folders "
                                        "(private_tmp_env) of the killed server, and of earlier starts, removed.")

    def summary(self) -> str:
        removed = f"; removed {len(self.removed_tmp_dirs)} temporary folder(s)" if self.removed_tmp_dirs else ""
        if not self.killed:
            held = "" if self.port_free else "; the port is held by another program"
            return f"nothing was running for port {self.port} on {self.host} ({self.duration_s:.2f} s){held}{removed}"
        forced = sum(1 for k in self.killed if k.signal == "SIGKILL")
        extra = f", {forced} needed SIGKILL" if forced else ""
        return (f"killed {len(self.killed)} process(es) on {self.host} in {self.duration_s:.2f} s{extra}; "
                f"port {self.port} free{removed}")


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


def find_server_processes(host: Host, profile: ServerProfile, handle: ServerHandle | None = None, *,
                          token: str | None = None) -> dict[int, str]:
    """The live processes a kill takes, with the reason each was picked: the server of ``handle``
    (or of the start ``token``), else specsweep's leftovers for the profile's port. Only the login
    user's processes, only those specsweep marked (module docstring)."""
    procs = {p.pid: p for p in host.processes() if p.alive}
    me = host.login_uid()
    protected = _protected_pids(host, procs)
    mine = {pid for pid, p in procs.items() if p.uid == me and pid not in protected}
    found: dict[int, str] = {}

    def take(pid: int, reason: str) -> None:
        if pid in mine and pid not in found:
            found[pid] = reason

    token = handle.token if handle is not None and handle.token else token
    if token:
        carriers = set(host.pids_with_env(START_ENV, token))
        for pid in sorted(carriers):
            take(pid, f"started by this run (start {token[:8]})")
        # The server's process group: its members may not carry the token (an engine's worker that retitles
        # itself, which overwrites its environment). The group is this start's while its leader carries the
        # token, or once the leader is gone: the kernel hands a group's id to no one else while it has members.
        if handle is not None and (handle.pid in carriers or handle.pid not in procs):
            for p in procs.values():
                if p.pgid == handle.pgid:
                    take(p.pid, f"in the server's process group {handle.pgid}")
    elif handle is not None:
        # A handle from before start tokens: its process group, while its leader still carries the marker.
        if handle.pid in host.pids_with_env(MARKER_ENV, str(handle.port)):
            for p in procs.values():
                if p.pgid == handle.pgid:
                    take(p.pid, f"in the server's process group {handle.pgid}")
    else:
        marked = set(host.pids_with_env(MARKER_ENV, str(profile.port))) & mine
        patterns = [re.compile(p) for p in profile.cleanup_patterns]
        for pid in sorted(marked):
            if not patterns:
                take(pid, f"left over: started by specsweep for port {profile.port}")
            elif any(bounded_regex.search(rx, procs[pid].args) for rx in patterns if pid in procs):
                take(pid, f"left over: started by specsweep for port {profile.port}, matches cleanup_patterns")
    # Descendants that still hang off the tree (the login user's only).
    _add_descendants(found, procs, mine, "child of a server process")
    return found


def _add_descendants(found: dict[int, str], procs: dict[int, ProcessInfo], allowed: set[int], reason: str) -> None:
    """Add the descendants of the processes in ``found`` that are among ``allowed``."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found and child in allowed:
                found[child] = f"{reason} ({procs[child].ppid})"
                stack.append(child)


def _alive(host: Host, pids: set[int]) -> set[int]:
    return {p.pid for p in host.processes() if p.pid in pids and p.alive}


def describe_process(p: ProcessInfo | None, pid: int, redact: Redactor) -> str:
    if p is None:
        return f"pid {pid}"
    return f"pid {pid} (user {p.user}): {_mask_cmdline(p.args, redact)[:500]}"


def describe_port_holders(host: Host, port: int, redact: Redactor | None = None) -> str:
    owners = host.port_owners(port)
    if not owners:
        return "a process this user cannot see (another user's)"
    procs = {p.pid: p for p in host.processes()}
    return "; ".join(describe_process(procs.get(pid), pid, redact or Redactor()) for pid in owners)


def kill_server(
    host: Host,
    profile: ServerProfile,
    handle: ServerHandle | None = None,
    *,
    token: str | None = None,
    logger: Logger | None = None,
) -> KillReport:
    """Stop the server of ``handle`` (or of the start ``token``), else specsweep's leftovers for the
    profile's port, and verify they are gone. Nothing running is fine; a port held by a process
    specsweep did not start is reported (``port_free`` False), never touched."""
    log = logger or _log
    redact = profile.redactor()
    start = time.monotonic()
    procs = {p.pid: p for p in host.processes()}
    found = find_server_processes(host, profile, handle, token=token)
    return _kill(host, profile, found, procs, handle, token=token, log=log, redact=redact, start=start)


def _kill(host: Host, profile: ServerProfile, found: dict[int, str], procs: dict[int, ProcessInfo],
          handle: ServerHandle | None, *, token: str | None, log: Logger, redact: Redactor,
          start: float) -> KillReport:
    """The kill in its steps: name what goes, signal it (SIGTERM, the grace, SIGKILL), then check that the
    port and the GPUs were let go of, and remove the start's private folder."""
    visible = handle.cuda_visible_devices if handle is not None else None
    if found and handle is None:
        visible = host.environ_value(min(found), "CUDA_VISIBLE_DEVICES")
    killed = _to_kill(found, procs, redact, log)
    if found:
        _signal_until_gone(host, profile, found, procs, killed, log)
        _kill_late_children(host, profile, handle, token, log)
    port_free = _port_let_go(host, profile, found, redact, log)
    _gpu_memory_let_go(host, profile, found)
    gpu = gpus.memory_used(host, visible) if found else None
    removed = _remove_tmp_dirs(host, profile, (handle.token if handle is not None else "") or token or "", log)
    report = KillReport(
        host=host.label,
        port=profile.port,
        killed=sorted(killed.values(), key=lambda k: k.pid),
        duration_s=time.monotonic() - start,
        port_free=port_free,
        gpu_memory_used_mib=gpu,
        removed_tmp_dirs=removed,
    )
    log.info("%s", report.summary())
    return report


def _to_kill(found: dict[int, str], procs: dict[int, ProcessInfo], redact: Redactor,
             log: Logger) -> dict[int, KilledProcess]:
    """What this kill takes, each with why (its marker or token) and its command line, masked."""
    killed: dict[int, KilledProcess] = {}
    for pid, reason in found.items():
        p = procs.get(pid)
        killed[pid] = KilledProcess(pid=pid, pgid=p.pgid if p else pid, reason=reason,
                                    command=_mask_cmdline(p.args if p else "", redact), signal="SIGTERM")
        log.info("stopping pid %d (%s): %s", pid, reason, killed[pid].command[:200])
    return killed


def _signal_until_gone(host: Host, profile: ServerProfile, found: dict[int, str], procs: dict[int, ProcessInfo],
                       killed: dict[int, KilledProcess], log: Logger) -> None:
    """SIGTERM, up to the profile's grace, then SIGKILL (recorded per process); a process that outlives SIGKILL
    is a KillError. Whole process groups are signalled only where this kill takes every member."""
    protected = _protected_pids(host, procs)
    own_groups = {procs[p].pgid for p in protected if p in procs}
    groups = {k.pgid for k in killed.values() if k.pgid not in own_groups and k.pgid > 1
              and all(p.pid in found for p in procs.values() if p.pgid == k.pgid and p.alive)}

    def send(sig: int, pids: set[int]) -> None:
        for g in sorted(groups):
            host.signal_group(g, sig)
        host.signal_pids(sorted(pids), sig)

    def wait_gone(pids: set[int], seconds: float) -> set[int]:
        deadline = time.monotonic() + seconds
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _alive(host, pids)
        return pids

    remaining = set(found)
    send(signal.SIGTERM, remaining)
    remaining = wait_gone(remaining, profile.kill_grace_s)
    if remaining:
        log.warning("%d process(es) ignored SIGTERM for %.0f s: sending SIGKILL to %s",
                    len(remaining), profile.kill_grace_s, sorted(remaining))
        for pid in remaining:
            killed[pid].signal = "SIGKILL"
        send(signal.SIGKILL, remaining)
        remaining = wait_gone(remaining, 10)
    if remaining:
        raise KillError(f"processes {sorted(remaining)} on {host.label} survived SIGKILL (stuck in the kernel?). "
                        "Check them with ps; a reboot may be needed.")


def _kill_late_children(host: Host, profile: ServerProfile, handle: ServerHandle | None, token: str | None,
                        log: Logger) -> None:
    """Anything of this server that appeared meanwhile (a child forked during shutdown) goes too."""
    late = find_server_processes(host, profile, handle, token=token)
    if late:
        for pid, reason in late.items():
            log.warning("a late process %d (%s) appeared during the kill: SIGKILL", pid, reason)
        host.signal_pids(sorted(late), signal.SIGKILL)


def _port_let_go(host: Host, profile: ServerProfile, found: dict[int, str], redact: Redactor, log: Logger) -> bool:
    """Whether the port is free: ours may take a moment to let go of it (a KillError if it never does); anyone
    else's is left alone, with a warning that names it."""
    if not host.port_listening(profile.port):
        return True
    port_free = bool(found) and host.wait_until(lambda: not host.port_listening(profile.port), timeout=10)
    if not port_free:
        holders = set(host.port_owners(profile.port))
        if holders & set(found):
            raise KillError(f"port {profile.port} on {host.label} is still held by {sorted(holders & set(found))} "
                            "after the kill. Stop them by hand or choose another port.")
        log.warning("port %d on %s is held by a process specsweep did not start, left alone: %s",
                    profile.port, host.label, describe_port_holders(host, profile.port, redact))
    return port_free


def _gpu_memory_let_go(host: Host, profile: ServerProfile, found: dict[int, str]) -> None:
    """The killed processes must have let go of their GPU memory within the profile's time (a KillError
    otherwise); what others hold on the same GPUs (another user's job on a shared host) is theirs."""
    held = gpus.memory_held_by(host, set(found)) if found else None
    if held is None:
        return
    deadline = time.monotonic() + profile.gpu_memory_timeout_s
    while sum(held.values()) >= profile.gpu_memory_free_mib and time.monotonic() < deadline:
        time.sleep(1.0)
        held = gpus.memory_held_by(host, set(found)) or {}
    if sum(held.values()) >= profile.gpu_memory_free_mib:
        raise KillError(
            f"the killed server's processes {sorted(held)} on {host.label} still hold "
            f"{sum(held.values())} MiB of GPU memory after {profile.gpu_memory_timeout_s:.0f} s (limit "
            f"{profile.gpu_memory_free_mib} MiB): look at them with nvidia-smi.")


def _remove_tmp_dirs(host: Host, profile: ServerProfile, token: str, log: Logger) -> list[str]:
    """Once its processes are gone, a start's private temporary folder goes too (``private_tmp_env``), with any that
    an earlier start left (a server that died unkilled, a worker that died). A folder that a live process's start
    still uses stays. Not removing one is worth a warning, not a failed kill."""
    if not profile.private_tmp_env:
        return []
    try:
        removed, trouble = host.remove_stale_tmp_dirs(token)
    except HostError as exc:
        removed, trouble = [], str(exc)
    if trouble:
        log.warning("temporary folders in ~/.specsweep/tmp on %s: %s", host.label, trouble)
    return removed


def _take_port(host: Host, profile: ServerProfile, log: Logger, redact: Redactor) -> None:
    """kill_port_holder: stop what holds the port, if it is the SSH user's (and its descendants)."""
    owners = host.port_owners(profile.port)
    procs = {p.pid: p for p in host.processes() if p.alive}
    me = host.login_uid()
    foreign = [pid for pid in owners if pid not in procs or procs[pid].uid != me]
    if not owners or foreign:
        who = describe_port_holders(host, profile.port, redact)
        raise PortBusyError(
            f"port {profile.port} on {host.label} is held by {who}, not a process of the SSH user "
            f"{host.login_user()}: kill_port_holder only takes the SSH user's own processes. Ask its owner to "
            "stop it, or choose another port."
        )
    protected = _protected_pids(host, procs)
    found: dict[int, str] = {pid: f"holds port {profile.port} (kill_port_holder)" for pid in owners
                             if pid not in protected}
    mine = {pid for pid, p in procs.items() if p.uid == me and pid not in protected}
    _add_descendants(found, procs, mine, "child of the port's holder")
    log.warning("port %d is held by %s: killing it first (kill_port_holder is set)",
                profile.port, describe_port_holders(host, profile.port, redact))
    _kill(host, profile, found, procs, None, token=None, log=log, redact=redact, start=time.monotonic())


def _not_cancelled(cancelled: threading.Event | None, profile: ServerProfile, what: str) -> None:
    if cancelled is not None and cancelled.is_set():
        raise ServerStartError(f"the start of {profile.name} was given up (its task timed out or was cancelled): "
                               f"{what} was not sent")


def start_server(
    host: Host,
    profile: ServerProfile,
    *,
    kill_port_holder: bool = False,
    token: str | None = None,
    logger: Logger | None = None,
    cancelled: threading.Event | None = None,
) -> ServerHandle:
    """Launch the server detached, in its own session, logging to the profile's log file; its
    environment carries ``token`` (a new one when not given), by which a kill finds it. Once
    ``cancelled`` is set (the caller gave up waiting), nothing more is sent to the host.

    The start is sent once. Not sent (the link was down): sent again. Sent, answer lost: whatever
    it started is killed and the port checked before it is sent again; if that cannot be done,
    ``StartUnverifiedError`` (never retried: a server may be running)."""
    log = logger or _log
    redact = profile.redactor()
    token = token or new_token()
    # However the start was asked for (a flow, the CLI), the worker's own policy decides what it may launch.
    policy.load().check_launch(profile.argv, profile.env_names(), profile.cwd, "profile")
    if host.port_listening(profile.port):
        if not kill_port_holder:
            raise PortBusyError(
                f"port {profile.port} on {host.label} is already in use by "
                f"{describe_port_holders(host, profile.port, redact)}, which specsweep did not start (or another "
                "run's server holds it). Stop that process (kill PID, as its user), choose another port, or set "
                "kill_port_holder to have specsweep kill it first (only processes of the SSH user)."
            )
        _not_cancelled(cancelled, profile, "the kill of the port's holder")
        _take_port(host, profile, log, redact)
    if profile.key_on_command_line:
        log.warning("%s takes its API key as an argument ({api_key} in argv): every user of %s can read it with "
                    "ps. Use api_key_env where the engine reads the key from its environment.", profile.name,
                    host.label)
    command = profile.masked_command()
    _not_cancelled(cancelled, profile, "the start")
    log.info("starting %s on %s: %s", profile.name, host.label, command)
    started_at = time.time()
    for attempt in (1, 2):
        _not_cancelled(cancelled, profile, "the start")
        try:
            started = host.start_detached(
                profile.launch_argv(), log_path=profile.log_file(token, attempt), env=profile.launch_env(token),
                cwd=profile.cwd, tmp_dir=profile.tmp_dir(token), tmp_env=profile.private_tmp_env,
            )
            break
        except CommandNotSentError as exc:
            if attempt == 2:
                raise
            log.warning("the start of %s was not sent (%s): sending it again", profile.name, exc)
        except CommandOutcomeUnknown as exc:
            log.warning("the start of %s may have run, its answer was lost (%s): removing whatever it started "
                        "before trying again", profile.name, exc)
            try:
                report = kill_server(host, profile, token=token, logger=log)
            except SpecsweepError as again:
                raise StartUnverifiedError(
                    f"the start of {profile.name} on {host.label} may have started a server, and it could not be "
                    f"checked ({again}). Not trying again: the next run's leftover kill, or `specsweep server kill` "
                    "with this profile, removes it."
                ) from None
            if not report.port_free:
                raise PortBusyError(f"port {profile.port} on {host.label} was taken by "
                                    f"{describe_port_holders(host, profile.port, redact)} during the start") from None
            if attempt == 2:
                raise ServerStartError(f"the start of {profile.name} on {host.label} lost its answer twice ({exc}); "
                                       "what it started was removed") from None
    else:  # pragma: no cover - the loop always breaks or raises
        raise ServerStartError("unreachable")
    handle = ServerHandle(
        name=profile.name,
        host=host.label,
        pid=started.pid,
        pgid=started.pid,
        port=profile.port,
        log_path=started.log_path,
        command=command,
        started_at=started_at,
        token=token,
        cuda_visible_devices=started.cuda_visible_devices,
    )
    log.info("server %s started: pid %d, log %s", profile.name, started.pid, handle.log_path)
    if profile.private_tmp_env and not started.tmp_dir:
        log.warning("%s got no temporary folder of its own on %s (for %s): its path in the login's ~/.specsweep/tmp "
                    "would be too long for the Unix sockets an engine makes there, so what it leaves goes where it "
                    "would without specsweep.", profile.name, host.label, ", ".join(profile.private_tmp_env))
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
    """Rebuild the handle of a server specsweep started for this profile's port, if one runs (the
    login user's)."""
    me = host.login_uid()
    pids = set(host.pids_with_env(MARKER_ENV, str(profile.port)))
    procs = [p for p in host.processes() if p.pid in pids and p.alive and p.uid == me]
    leaders = [p for p in procs if p.pid == p.pgid] or procs
    if not leaders:
        return None
    leader = min(leaders, key=lambda p: p.pid)
    elapsed = host.run(["ps", "-o", "etimes=", "-p", str(leader.pid)], timeout=30).stdout.strip()
    started_at = time.time() - (int(elapsed) if elapsed.isdigit() else 0)
    token = host.environ_value(leader.pid, START_ENV) or ""
    first, again = (profile.log_file(token, n)[2:] for n in (1, 2))
    log_path = host.run(["sh", "-c", 'if [ -e "$HOME/$2" ]; then printf %s "$HOME/$2"; else printf %s "$HOME/$1"; fi',
                         "sh", first, again], timeout=30).stdout
    return ServerHandle(
        name=profile.name,
        host=host.label,
        pid=leader.pid,
        pgid=leader.pgid,
        port=profile.port,
        log_path=log_path,
        command=_mask_cmdline(leader.args, profile.redactor()),
        started_at=started_at,
        token=token,
        cuda_visible_devices=host.environ_value(leader.pid, "CUDA_VISIBLE_DEVICES"),
    )
