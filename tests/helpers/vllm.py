"""The real vLLM in tests: its settings for the tiny models, and which of its processes a test's runs own."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import TracebackType

from specsweep.engines.vllm import VLLMSettings
from specsweep.targets.vllm.models import HFModels


def settings(models: HFModels, python: str, port: int, *, worker: bool = False, **fields: object) -> VLLMSettings:
    """The tiny models on the CPU backend. The model runs in the engine core itself: two processes (API server and
    engine core) instead of the CPU backend's default three, each of which imports torch. The CPU platform keeps
    ``--distributed-executor-backend uni`` only with VLLM_ENABLE_V1_MULTIPROCESSING=0 and otherwise switches back
    to "mp" with a worker process (vllm/platforms/cpu.py); with both, a start with a draft model took 29-31 s
    alone here, against 41-46 s (two starts of each, in turn), and 27 CPU-seconds against 38. Serving costs more
    that way (20 requests of 64 tokens: 31 CPU-seconds against 21), but these tests serve few tokens. ``worker``:
    the default layout (API server, engine core and worker), for a test of what is left when the server dies.
    ``env`` adds to the tests' environment."""
    eager = ["--dtype", "bfloat16", "--enforce-eager"]  # bf16 is what the CPU backend runs fastest; no torch.compile
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}  # 1 GiB of KV cache, so that it fits beside the other tests
    if not worker:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    more = fields.pop("env", {})
    assert isinstance(more, dict)
    env.update(more)
    return VLLMSettings.model_validate({
        "model": str(models.target), "method": "draft_model", "draft_model": str(models.draft),
        "num_speculative_tokens": 3, "port": port, "max_model_len": 1024, "python": python,
        "extra_args": eager if worker else [*eager, "--distributed-executor-backend", "uni"],
        "env": env,
        "startup_timeout_s": 300,
        **fields})


def _server_groups(ports: tuple[int, ...]) -> set[int]:
    """The process groups of the vLLM API servers listening on ``ports`` (their engine cores, and workers where
    they have them, run in the same group; the core's title overwrites its command line and environment, so it
    is known by its group)."""
    groups = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "vllm.entrypoints" in cmd and any(f"--port {port} " in cmd for port in ports):
                groups.add(os.getpgid(int(d.name)))
        except OSError:
            continue
    # The start's own shell carries the server's command line for a moment, in the test's group, before it
    # starts the server in a session of its own (setsid): that group is the tests', not a server's.
    return groups - {os.getpgrp()}


def _members(groups: set[int]) -> list[tuple[int, str]]:
    """The live processes (pid, command line or title) in ``groups``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getpgid(int(d.name)) not in groups:
                    continue
                if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # dead, not yet reaped (a killed server's children are reparented for that)
                found.append((int(d.name), (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")))
            except OSError:
                continue
    return found


class ServerGroups:
    """Watches, while a test's runs go on, the process groups of the vLLM servers on its ports; afterwards
    ``alive()`` lists every process still in one of them, ``titles`` holds the titles vLLM gave the processes
    it started (``VLLM::EngineCore``, ``VLLM::Worker``), and ``tmp`` what the folders of their ZeroMQ sockets
    (VLLM_RPC_BASE_PATH) held. Tests on other ports (other workers) are never seen."""

    def __init__(self, *ports: int) -> None:
        self.ports = ports
        self.seen: set[int] = set()
        self.titles: set[str] = set()
        self.tmp: dict[Path, set[str]] = {}
        self._task: asyncio.Task[None] | None = None

    def _look(self) -> None:
        self.seen |= _server_groups(self.ports)
        members = _members(self.seen)
        self.titles |= {cmd.strip() for _, cmd in members if cmd.startswith("VLLM::")}
        for pid, _ in members:
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for folder in (Path(v.decode().partition("=")[2]) for v in env if v.startswith(b"VLLM_RPC_BASE_PATH=")):
                try:
                    self.tmp.setdefault(folder, set()).update(os.listdir(folder))
                except OSError:
                    self.tmp.setdefault(folder, set())

    async def _watch(self) -> None:
        while True:
            await asyncio.to_thread(self._look)
            await asyncio.sleep(0.3)

    async def __aenter__(self) -> ServerGroups:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        assert self._task is not None
        self._task.cancel()

    def alive(self) -> list[str]:
        """Live processes (pid and command line) in a group a server on these ports had (assert ``seen`` too: a
        watch that saw nothing proves nothing)."""
        return [f"{pid} {cmd[:200]}" for pid, cmd in _members(self.seen)]
