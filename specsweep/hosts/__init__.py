"""Hosts that servers run on: this machine or one reached over SSH."""

from specsweep.hosts.base import CommandResult, Host, ProcessInfo
from specsweep.hosts.config import HostConfig, SSHEndpoint, build_host
from specsweep.hosts.local import LocalHost
from specsweep.hosts.ssh import SSHHost

__all__ = [
    "CommandResult",
    "Host",
    "HostConfig",
    "LocalHost",
    "ProcessInfo",
    "SSHEndpoint",
    "SSHHost",
    "build_host",
]
