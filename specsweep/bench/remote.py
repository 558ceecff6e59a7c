"""The load generator on the GPU host itself: one level run there over SSH, its records brought back.

Through a tunnel every streamed token crosses the SSH link twice (the ssh client here, the
sshd there), which costs more CPU per token than the load generator itself; at high
concurrency against a fast server the tunnel, not the server, sets the pace
(``benchmarks/tunnel.py``). With ``load_generator: host`` in the host config, each level
runs on the host instead: the prompts (prepared here, the same for every configuration),
the request options and the level go to ``<host_python> -I -m specsweep.bench.remote`` on its
standard input (the API key too: never on a command line), the level runs there against
the server's own address, and the raw records come back on its standard output, to be
turned into the same rows as a local level.

The host needs an interpreter with specsweep installed (``pip install specsweep``, or this
checkout); ``HostLoadGenerator.check`` says so before any level when it has none.
"""

from __future__ import annotations

import asyncio
import math
import sys
from dataclasses import dataclass, replace
from typing import Any

import orjson

from specsweep import __version__
from specsweep.bench.config import RequestSpec, SweepConfig
from specsweep.bench.runner import Load, run_async, run_from_wire, run_level, run_to_wire
from specsweep.bench.workload import Prompt
from specsweep.errors import ConfigError, HostError
from specsweep.hosts.base import Host
from specsweep.records import Block, BlockRun
from specsweep.server.api import ServerAPI

#: Bumped whenever the payload changes: both sides must speak the same one.
PROTOCOL = 3  # 3: prompts carry their chat messages, category and output length; 2: the engine's /metrics snapshots
MODULE = "specsweep.bench.remote"


def load_to_wire(load: Load) -> dict[str, Any]:
    request = load.request.model_dump(mode="json")
    request["api_key"] = load.request.api_key.get_secret_value() if load.request.api_key else None
    return {"base_url": load.base_url, "request": request, "output_len": load.output_len,
            "sweep": load.sweep.model_dump(mode="json"), "model": load.model, "engine": load.engine,
            "prompts": [p.to_wire() for p in load.prompts],
            "warmup_prompts": [p.to_wire() for p in load.warmup_prompts]}


def load_from_wire(wire: dict[str, Any]) -> Load:
    return Load(base_url=wire["base_url"], request=RequestSpec(**wire["request"]),
                prompts=tuple(Prompt.from_wire(p) for p in wire["prompts"]), output_len=wire["output_len"],
                sweep=SweepConfig(**wire["sweep"]), model=wire["model"], engine=wire["engine"],
                warmup_prompts=tuple(Prompt.from_wire(p) for p in wire["warmup_prompts"]))


@dataclass
class HostLoadGenerator:
    """Runs levels on ``host`` with ``python`` against the server at ``base_url`` (as the host sees it)."""

    host: Host
    python: str
    base_url: str

    def check(self) -> None:
        """Fail before any level when the host cannot run the load generator (no such interpreter, no
        specsweep in it, another protocol), naming the field and the fix."""
        try:
            result = self.host.run([self.python, "-I", "-m", MODULE, "--hello"], timeout=60)
        except HostError as exc:
            result = None
            why = str(exc)
        if result is not None and result.ok:
            try:
                hello = orjson.loads(result.stdout)
            except orjson.JSONDecodeError:
                hello = {}
            if hello.get("protocol") == PROTOCOL:
                return
            why = (f"it speaks protocol {hello.get('protocol')} (specsweep {hello.get('specsweep')}), this side "
                   f"{PROTOCOL} (specsweep {__version__}): install the same specsweep version there")
        elif result is not None:
            why = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.exit_code}").splitlines()[-1]
        raise ConfigError(
            f"load_generator is 'host', but host_python ({self.python}) on {self.host.label} cannot run the load "
            f"generator: {why}. Install specsweep into that interpreter on the host (pip install specsweep, or "
            "this checkout), set host_python to one that has it, or set load_generator to 'client'."
        )

    def timeout_s(self, load: Load, level: Block) -> float:
        """A bound on one level (its warm-up and timed requests in waves of its concurrency), so that a
        hung host cannot hold the run forever."""
        sweep, per_request = load.sweep, load.request.timeout_s
        if sweep.duration_s is not None:
            return sweep.duration_s + 2 * per_request + 120
        conc = max(1, int(level.value) if level.mode == "concurrency" else sweep.max_concurrency or 1)
        warm = math.ceil(sweep.warmup_requests / conc) + 1
        if level.mode == "rate":
            return sweep.num_requests / max(level.value, 1e-3) + (warm + 1) * per_request + 120
        return (warm + math.ceil(sweep.num_requests / conc)) * per_request + 120

    async def run(self, load: Load, level: Block) -> BlockRun:
        """One level on the host. Not retried when the SSH link drops under it (that would send its load
        twice): the level fails, naming the cut, and a retry of the run measures it again."""
        payload = orjson.dumps({"protocol": PROTOCOL, "load": load_to_wire(replace(load, base_url=self.base_url)),
                                "level": level.model_dump(mode="json")})
        result = await asyncio.to_thread(self.host.run, [self.python, "-I", "-m", MODULE], input=payload,
                                         timeout=self.timeout_s(load, level), retry=False)
        if not result.ok:
            lines = (result.stderr.strip() or f"exit code {result.exit_code}").splitlines()
            raise RuntimeError(f"the load generator on {self.host.label} failed at level {level.label}: {lines[-1]}")
        return run_from_wire(level, orjson.loads(result.stdout))


def on_host(host: Host, bind: str, port: int) -> HostLoadGenerator | None:
    """The load generator on the server's host, where the host's config puts it (``load_generator:
    host``), checked before any level; None where the load is generated here."""
    if host.config.load_generator != "host" or host.config.kind != "ssh":
        return None
    local = "127.0.0.1" if bind in ("0.0.0.0", "::", "localhost", "") else bind
    generator = HostLoadGenerator(host, host.config.host_python, f"http://{local}:{port}")
    generator.check()
    return generator


async def _serve(wire: dict[str, Any]) -> dict[str, Any]:
    load, level = load_from_wire(wire["load"]), Block(**wire["level"])
    async with ServerAPI(load.base_url, load.request.api_key) as api:
        return run_to_wire(await run_level(load, level, counters=api.engine_snapshot))


def main(argv: list[str] | None = None) -> int:
    """The host's side: read one level's job on stdin, run it, write its records on stdout."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--hello"]:
        sys.stdout.buffer.write(orjson.dumps({"protocol": PROTOCOL, "specsweep": __version__}))
        return 0
    try:
        wire = orjson.loads(sys.stdin.buffer.read())
        if wire.get("protocol") != PROTOCOL:
            raise ConfigError(f"the client speaks protocol {wire.get('protocol')}, this host {PROTOCOL} "
                              f"(specsweep {__version__}): install the same specsweep version on both")
        out = run_async(_serve(wire))
    except Exception as exc:  # noqa: BLE001 - reported to the client, which raises it
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    sys.stdout.buffer.write(orjson.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
