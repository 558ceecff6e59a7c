"""A separate network host on this machine: a network namespace joined to ours by a veth pair.

Processes started inside it (an sshd, and whatever that sshd starts) have their own
address and reach us only over the veth link, so ``cut()`` is a real link failure: packets
stop, TCP connections hang, new connections fail.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


_made = itertools.count()


def _new_tag() -> str:
    """A name no other namespace of this machine has: this process's pid and a count of its own (a random
    suffix alone collided once in a hundred creations), checked against the namespaces that exist."""
    existing = set(_ip("netns", "list", check=False).stdout.split())
    while True:
        tag = f"{os.getpid() % 100000}{next(_made):03d}"[-8:]
        if f"ssw{tag}" not in existing:
            return tag


@dataclass
class NetnsHost:
    name: str
    host_if: str
    ns_if: str
    host_addr: str
    addr: str

    parent: str | None = None  # the namespace our end of the link is in (None: this machine's own)

    @classmethod
    def create(cls, behind: NetnsHost | None = None) -> NetnsHost:
        """A host linked to this machine, or only to ``behind`` (then this machine cannot reach it: a
        namespace does not forward packets, so ``behind`` is its only way in, as a bastion is)."""
        tag = _new_tag()
        name, host_if, ns_if = f"ssw{tag}", f"sswh{tag}", f"sswn{tag}"
        used = _ip("-o", "addr", check=False).stdout + _ip("route", check=False).stdout
        a, b = random.randrange(64, 250), random.randrange(0, 250)
        while f" 10.{a}.{b}." in used:  # a subnet another test host has
            a, b = random.randrange(64, 250), random.randrange(0, 250)
        host_addr, addr = f"10.{a}.{b}.1", f"10.{a}.{b}.2"
        parent = behind.name if behind else None
        near = ("netns", "exec", parent, "ip") if parent else ()
        _ip("netns", "add", name)
        try:
            _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            _ip("link", "set", ns_if, "netns", name)
            if parent:
                _ip("link", "set", host_if, "netns", parent)
            _ip(*near, "addr", "add", f"{host_addr}/30", "dev", host_if)
            _ip(*near, "link", "set", host_if, "up")
            _ip("netns", "exec", name, "ip", "addr", "add", f"{addr}/30", "dev", ns_if)
            _ip("netns", "exec", name, "ip", "link", "set", ns_if, "up")
            _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
            if parent:
                # Only through `behind`: it does not route for us, and this machine has no way of its own.
                subprocess.run(["ip", "netns", "exec", parent, "sysctl", "-qw", "net.ipv4.ip_forward=0"], check=False)
                _ip("route", "replace", "unreachable", f"{addr}/32")
        except subprocess.CalledProcessError as exc:
            _ip(*near, "link", "del", host_if, check=False)
            _ip("netns", "del", name, check=False)
            raise RuntimeError(f"cannot build the test network host: {exc.stderr}") from None
        return cls(name, host_if, ns_if, host_addr, addr, parent)

    def cut(self) -> None:
        """Take the link down on the far side, as a pulled cable: our route stays (marked
        linkdown), so packets vanish silently and connections hang until their timeouts.
        (Taking our side down instead would send them out of the default route.)"""
        self._ns_ip("link", "set", self.ns_if, "down")

    def restore(self) -> None:
        self._ns_ip("link", "set", self.ns_if, "up")
        near = ("netns", "exec", self.parent, "ip") if self.parent else ()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # wait for the carrier on our side
            if "linkdown" not in _ip(*near, "route", "show", "dev", self.host_if).stdout:
                return
            time.sleep(0.05)

    def _ns_ip(self, *args: str) -> None:
        _ip("netns", "exec", self.name, "ip", *args)

    def pids(self) -> list[int]:
        """Every process running inside the namespace."""
        out = _ip("netns", "pids", self.name, check=False).stdout
        return [int(p) for p in out.split()]

    def destroy(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        near = ("netns", "exec", self.parent, "ip") if self.parent else ()
        _ip(*near, "link", "del", self.host_if, check=False)
        if self.parent:
            _ip("route", "del", "unreachable", f"{self.addr}/32", check=False)
        _ip("netns", "del", self.name, check=False)
