"""Hosts that servers run on: this machine or one reached over SSH.

``open_host(config)`` is the one way a host is opened (lazily: an SSH host connects on its
first command); a flow or command opens its host once and passes it on.
"""

from __future__ import annotations

import logging

from specsweep import policy
from specsweep.hosts.base import CommandResult, Host, ProcessInfo
from specsweep.hosts.config import HostConfig, SSHEndpoint, SSHLogin
from specsweep.hosts.local import LocalHost
from specsweep.hosts.ssh import SSHHost


def open_host(config: HostConfig, logger: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None) -> Host:
    """The host a (resolved) config describes; the host carries that config. Only a host the worker's policy
    allows (``specsweep.policy``) is reached, its jump host too."""
    rules = policy.load()
    if config.kind == "local" or config.ssh is None:
        rules.check_host("local")
        return LocalHost(config)
    rules.check_host(config.ssh.hostname, "host")
    if config.jump is not None:
        rules.check_host(config.jump.hostname, "host.jump")
    return SSHHost(config.ssh, jump=config.jump, logger=logger, config=config)


__all__ = [
    "CommandResult",
    "Host",
    "HostConfig",
    "LocalHost",
    "ProcessInfo",
    "SSHEndpoint",
    "SSHLogin",
    "SSHHost",
    "open_host",
]
