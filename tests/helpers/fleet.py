"""A fleet of test hosts on this machine: each a network namespace with its own address, its own sshd and its own
processes (a PID namespace: servers on one port on several hosts do not find each other's), and an nvidia-smi that
says which GPUs it has (this machine has none): the campaign's test and benchmark."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specsweep.hosts import HostConfig, SSHEndpoint
from specsweep.targets.sim.server import HOST_ARGS_ENV
from tests.helpers.netns import NetnsHost
from tests.helpers.sshd import SSHServer, start_sshd

SSH_PORT = 2222


@dataclass
class FleetHost:
    net: NetnsHost
    sshd: SSHServer
    config: HostConfig
    queue: str

    def sims(self) -> list[int]:
        """The simulator processes running inside this host."""
        inside = set(self.net.pids())
        out = subprocess.run(["pgrep", "-f", "specsweep.targets.sim"], capture_output=True, text=True).stdout
        return [int(p) for p in out.split() if int(p) in inside]


def fake_nvidia_smi(folder: Path, gpu: str, count: int) -> Path:
    """A bin folder whose nvidia-smi answers the fingerprint's question as a host with ``count`` of ``gpu`` does,
    and lists no GPU processes and no samples (this machine has no GPU)."""
    folder.mkdir(parents=True)
    rows = "".join(f"{gpu}, 550.54.15\\n" for _ in range(count))
    tool = folder / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\ncase "$*" in *name,driver_version*) printf "{rows}" ;; esac\nexit 0\n')
    tool.chmod(0o755)
    return folder


@contextmanager
def fleet_hosts(workdir: Path, ssh_keys: tuple[Path, str],
                plan: Sequence[tuple[str, str, int, str, str]]) -> Iterator[list[FleetHost]]:
    """One host per (name, GPU model, GPU count, work queue, the simulator's own arguments on it) of ``plan``."""
    hosts: list[FleetHost] = []
    try:
        for name, gpu, count, queue, sim_args in plan:
            net = NetnsHost.create()
            d = workdir / name
            tools = fake_nvidia_smi(d / "bin", gpu, count)
            env = {"PATH": f"{tools}:/usr/local/bin:/usr/bin:/bin", **({HOST_ARGS_ENV: sim_args} if sim_args else {})}
            sshd = start_sshd(d / "sshd", [ssh_keys[1]], address=net.addr, port=SSH_PORT, netns=net.name, set_env=env,
                              own_processes=True)
            known = d / "known_hosts"
            known.write_text(sshd.known_hosts_line() + "\n")
            config = HostConfig(kind="ssh", ssh=SSHEndpoint(hostname=net.addr, port=SSH_PORT, user=sshd.user,
                                                            key_path=ssh_keys[0], known_hosts=known, use_agent=False,
                                                            connect_timeout_s=3, keepalive_s=1))
            hosts.append(FleetHost(net, sshd, config, queue))
        yield hosts
    finally:
        for h in hosts:
            h.sshd.stop()
            h.net.destroy()
