"""A configuration as the designs (``specsweep.designs``) drive it, on the flow's own tasks.

``serve`` is the design card's pipeline for one server: kill_server (leftovers) → start_server →
wait_for_health → warm up, and the final kill_server however the block ends; each block on it is a
``run_concurrency_benchmark`` task. The one-configuration flow (``flows/benchmark_config.py``)
spells the same calls out in its body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass

from prefect import get_run_logger

from orchestration.run import Configuration, Run
from specsweep.hosts import Host
from specsweep.records import Block, BlockRow
from specsweep.sweep import SweepJob, set_aside
from tasks.benchmark import run_concurrency_benchmark, warm_up
from tasks.results import fingerprint_environment
from tasks.server import Server, kill_server, start_server, wait_for_health


@dataclass
class Measuring:
    """A server up and ready, and the run it measures for."""

    server: Server
    job: SweepJob

    async def measure(self, level: Block) -> BlockRow:
        return await run_concurrency_benchmark(self.server, self.job, level)

    async def check(self, when: str) -> None:
        await self.server.check(when)


async def record_environment(config: Configuration, server: Server) -> None:
    """After the configuration's first start: its environment and time to ready in its run row."""
    if server.ready is not None:
        if not config.ready_s:
            config.recorder.record_fingerprint(await fingerprint_environment(server.host, server.target))
            config.recorder.update(time_to_ready_s=server.ready.time_to_ready_s)
        config.ready_s.append(server.ready.time_to_ready_s)


class ServerArm:
    """One configuration of a comparison or a grid."""

    def __init__(self, run: Run, host: Host, config: Configuration) -> None:
        self.run, self.host, self.config = run, host, config
        self.name = config.name

    def finished(self) -> list[BlockRow] | None:
        done = self.config.finished()
        if done is not None:
            # A retry of this flow run: this configuration finished in an earlier try. Its results are
            # kept, and its server is not started again for nothing.
            get_run_logger().info("%s finished in an earlier try of this flow run (run id %s): keeping its %d "
                                  "block(s)", self.name, self.config.job.run_id, len(done))
        return done

    def recording(self) -> AbstractContextManager[object]:
        return self.config.recorder

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[Measuring]:
        profile, stages = self.config.profile, self.run.stages
        await kill_server(self.host, profile, stages)  # leftovers of earlier runs
        async with start_server(self.host, profile, self.run.request_for(profile), stages,
                                marker=self.run.marker) as server:  # and the final kill_server, however it ends
            await wait_for_health(server)
            await record_environment(self.config, server)
            await warm_up(server, self.config.job)
            yield Measuring(server, self.config.job)

    async def on_block(self, row: BlockRow, done: int, total: int) -> None:
        await self.config.progress(row, done, total)

    async def set_aside(self, row: BlockRow) -> None:
        if row.disturbed is None:
            get_run_logger().info("%s %s: counted after all: what set its level's earlier block aside happened again, "
                                  "so it is the server's behaviour", self.name, row.level)
        else:
            get_run_logger().warning("%s %s: set aside, measured again (%s)", self.name, row.level, row.disturbed)
        await set_aside(self.config.job, row)

    def on_saturation(self) -> None:
        get_run_logger().info("%s: throughput stopped rising for two levels while latency grew: stopping the sweep",
                              self.name)
