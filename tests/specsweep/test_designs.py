"""The designs without Prefect or servers: a fake ``Arm`` whose blocks have known throughputs, and which records
what each design asked of it (server starts, blocks in order)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from specsweep import designs
from specsweep.analysis.decision import DecisionConfig
from specsweep.bench.config import SweepConfig
from specsweep.records import Block, BlockRow
from specsweep.sweep import sweep_levels

LEVELS = sweep_levels(SweepConfig(concurrency=[1, 8]))


class FakeArm:
    """A configuration whose block at C has throughput ``speed(C)``; it logs every start, block and record."""

    def __init__(self, name: str, speed: Callable[[int], float], log: list[str],
                 finished: list[BlockRow] | None = None) -> None:
        self.name, self.speed, self.log, self.done = name, speed, log, finished
        self.recorded = 0
        self.aside: list[BlockRow] = []

    def finished(self) -> list[BlockRow] | None:
        return self.done

    @contextmanager
    def recording(self) -> Iterator[object]:
        self.recorded += 1
        yield self

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[FakeArm]:
        self.log.append(f"start {self.name}")
        try:
            yield self
        finally:
            self.log.append(f"stop {self.name}")

    async def measure(self, level: Block) -> BlockRow:
        self.log.append(f"{self.name} {level}")
        c = int(level.value)
        return BlockRow(config_name=self.name, level_index=level.index, mode="concurrency", concurrency=c,
                        repeat=level.repeat, requests=8, completed=8, duration_s=1.0,
                        output_tokens_per_s=self.speed(c), steady_output_tokens_per_s=self.speed(c),
                        reached_concurrency=True)

    async def check(self, when: str) -> None:
        self.log.append(f"check {self.name}")

    async def on_block(self, row: BlockRow, done: int, total: int) -> None:
        pass

    def on_saturation(self) -> None:
        self.log.append("saturated")

    async def set_aside(self, row: BlockRow) -> None:
        self.aside.append(row)


def arms(log: list[str]) -> tuple[FakeArm, FakeArm]:
    # Speculation doubles throughput at one stream and halves it at eight: each level decided at once.
    return FakeArm("base", lambda c: 100.0 * c, log), FakeArm("spec", lambda c: 200.0 if c == 1 else 400.0, log)


DECISION = DecisionConfig(min_blocks=3, max_requests_per_level=64)


async def test_one_measures_each_level_in_blocks_on_one_server_start() -> None:
    log: list[str] = []
    base, _ = arms(log)
    rows = await designs.one(base, LEVELS, lambda _p, got: len(got) < 2)
    assert [str(r.repeat) + str(r.concurrency) for r in rows] == ["01", "11", "08", "18"]
    assert log[0] == "start base" and log[-1] == "stop base" and log.count("start base") == 1
    assert base.recorded == 1


async def test_sequential_measures_the_baseline_whole_then_the_other_arm() -> None:
    log: list[str] = []
    base, spec = arms(log)
    base_rows, spec_rows = await designs.sequential([base, spec], LEVELS, DECISION, 8)
    first_spec = log.index("start spec")
    assert all(not line.startswith("spec") for line in log[:first_spec])  # every baseline block first
    assert log.index("stop base") < first_spec
    assert {r.concurrency for r in base_rows} == {r.concurrency for r in spec_rows} == {1, 8}
    assert min(sum(r.concurrency == c for r in spec_rows) for c in (1, 8)) >= DECISION.min_blocks


async def test_alternate_side_by_side_takes_blocks_in_turn_on_servers_started_once() -> None:
    log: list[str] = []
    base, spec = arms(log)
    base_rows, spec_rows = await designs.alternate(base, spec, LEVELS, DECISION, 8, restart=False)
    assert log.count("start base") == log.count("start spec") == 1
    blocks = [line.split()[0] for line in log if line.startswith(("base C=1", "spec C=1"))]
    # ABBA: base first in even rounds, spec first in odd ones.
    assert blocks[:4] == ["base", "spec", "spec", "base"]
    assert len(base_rows) == len(spec_rows) >= 2 * DECISION.min_blocks


async def test_alternate_by_restart_starts_a_server_for_each_block() -> None:
    log: list[str] = []
    base, spec = arms(log)
    base_rows, spec_rows = await designs.alternate(base, spec, LEVELS, DECISION, 8, restart=True)
    assert log.count("start base") == len(base_rows) and log.count("start spec") == len(spec_rows)
    assert log.count("stop base") == log.count("start base")  # each block's server gone before the next


async def test_in_turn_rotates_three_arms_and_records_each_once() -> None:
    log: list[str] = []
    base, spec = arms(log)
    third = FakeArm("sched", lambda c: 200.0 if c == 1 else 800.0, log)
    out = await designs.in_turn([base, spec, third], LEVELS[:1], lambda clean: len(clean[0]) < 3, restart=False)
    order = [line.split()[0] for line in log if " C=1 " in line]
    assert order == ["base", "spec", "sched", "spec", "sched", "base", "sched", "base", "spec"]
    assert [len(rows) for rows in out] == [3, 3, 3] and base.recorded == spec.recorded == third.recorded == 1


async def test_in_turns_starts_each_server_once_a_round_and_measures_every_open_level_in_its_turn() -> None:
    """The verify stage one server at a time: a start per arm and round, never a restart per block; a level that
    is settled takes no more blocks while the others go on."""
    log: list[str] = []
    base, spec = arms(log)
    third = FakeArm("sched", lambda c: 200.0 if c == 1 else 800.0, log)

    def more(clean: list[list[BlockRow]]) -> bool:  # C=1 settles after 2 rounds, C=8 after 3
        return len(clean[0]) < (2 if clean[0] and clean[0][0].concurrency == 1 else 3)

    out = await designs.in_turns([base, spec, third], LEVELS, more)
    assert [len(rows) for rows in out] == [5, 5, 5]  # 2 at C=1 and 3 at C=8, each arm
    assert log.count("start base") == log.count("start spec") == log.count("start sched") == 3  # one a round
    first_turn = log[:log.index("stop base") + 1]
    assert first_turn == ["start base", "base C=1 #0", "base C=8 #0", "stop base"]
    third_round = log[-9:]  # C=1 is settled: each turn measures C=8 alone
    assert [line for line in third_round if " C=" in line] == ["sched C=8 #2", "base C=8 #2", "spec C=8 #2"]
    assert base.recorded == spec.recorded == third.recorded == 1


async def test_an_arm_an_earlier_try_finished_is_not_measured_again() -> None:
    log: list[str] = []
    base, spec = arms(log)
    earlier = await designs.one(base, LEVELS, lambda _p, got: len(got) < 2)
    log.clear()
    done = FakeArm("base", base.speed, log, finished=earlier)
    assert await designs.one(done, LEVELS, lambda _p, got: len(got) < 2) == earlier
    assert log == [] and done.recorded == 0
    # In turn: an arm finished whole is kept; when every arm is, nothing starts.
    finished_spec = FakeArm("spec", spec.speed, log, finished=[])
    assert await designs.in_turn([done, finished_spec], LEVELS, lambda clean: False, restart=False) == [earlier, []]
    assert log == []


#: Speedup by concurrency, the shape of EAGLE-1 in SGLang (arXiv 2503.01840, Table 3) with its crossover placed
#: between 16 and 24 (x1.10 and x0.90 there); log-linear between the points.
SPEEDUPS = {1: 1.40, 4: 1.40, 8: 1.23, 16: 1.10, 24: 0.90, 32: 0.88, 64: 0.88}


def crossover(c: int) -> float:
    from specsweep.targets.sim.model import speedup_at

    return speedup_at(SPEEDUPS, c)


class NoisyArm(FakeArm):
    """A block's throughput with a known ratio and a few per cent of seeded noise; a block holds max(8, 2C)
    requests of 64 tokens (requests_per_slot 2), and lasts as long as they take at that throughput."""

    def __init__(self, name: str, ratio: Callable[[int], float], log: list[str], seed: int) -> None:
        import random

        super().__init__(name, lambda c: 100.0 * c, log)
        self.ratio, self.rng = ratio, random.Random(seed)

    async def measure(self, level: Block) -> BlockRow:
        row = await super().measure(level)
        c = int(level.value)
        speed = 100.0 * c * self.ratio(c) * self.rng.uniform(0.97, 1.03)
        requests = max(8, 2 * c)
        return row.model_copy(update={"output_tokens_per_s": speed, "steady_output_tokens_per_s": speed,
                                      "requests": requests, "completed": requests, "duration_s": requests * 64 / speed})


async def test_a_search_brackets_the_crossover_between_16_and_24_in_half_the_grids_time() -> None:
    from specsweep.analysis.compare import compare_levels
    from specsweep.bench.config import SearchRange

    decision = DecisionConfig(min_blocks=4, max_requests_per_level=8 * 24)
    steps: list[str] = []
    log: list[str] = []
    base, spec = NoisyArm("base", lambda c: 1.0, log, 1), NoisyArm("spec", crossover, log, 2)
    base_rows, spec_rows = await designs.search(base, spec, SearchRange(min=1, max=64), decision, 8, restart=False,
                                                on_step=lambda s: steps.append(f"{s.kind} {s.concurrency} {s.why}"))
    comp = compare_levels(base_rows, spec_rows, decision=decision, paired=True, num_requests=8, answer_levels=7,
                          search=True)
    measured = sorted(lv.concurrency for lv in comp.levels)
    t = comp.recommendation.speculation_off_from
    assert t is not None and 17 <= t <= 24, (t, measured, steps[-1])
    below = max(c for c in measured if c < t)
    assert below >= 16, (below, t, measured)  # bracketed within [16, 24]
    assert steps[-1].startswith("stop None settled"), steps[-1]
    # The power-of-two grid over 1..64 with the same decision settings: its bracket is (16, 32], in more time.
    grid_log: list[str] = []
    grid_base, grid_spec = NoisyArm("base", lambda c: 1.0, grid_log, 1), NoisyArm("spec", crossover, grid_log, 2)
    grid_rows = await designs.alternate(grid_base, grid_spec, sweep_levels(SweepConfig(concurrency=[1, 2, 4, 8, 16, 32, 64])),
                                        decision, 8, restart=False)
    grid = compare_levels(*grid_rows, decision=decision, paired=True, num_requests=8)
    assert grid.recommendation.speculation_off_from == 32
    measured = sum(r.duration_s for r in (*base_rows, *spec_rows))
    grid_measured = sum(r.duration_s for rows in grid_rows for r in rows)
    assert measured <= 0.5 * grid_measured, (measured, grid_measured)
    assert log.count("start base") == 1  # side by side: the servers stay up for the whole search


async def test_a_search_stops_within_its_time_budget() -> None:
    from specsweep.bench.config import SearchRange

    now = [0.0]
    budget = designs.Budget(1.0, clock=lambda: now[0])

    class Slow(NoisyArm):
        async def measure(self, level: Block) -> BlockRow:
            now[0] += 7.0  # each block takes 7 s of the budget's clock
            return await super().measure(level)

    steps: list[str] = []
    log: list[str] = []
    base_rows, _ = await designs.search(Slow("base", lambda c: 1.0, log, 1), Slow("spec", crossover, log, 2),
                                        SearchRange(min=1, max=64), DecisionConfig(), 8, restart=False, budget=budget,
                                        on_step=lambda s: steps.append(s.why))
    # 60 s at 14 s a round: after four (56 s), a fifth would end at 70 s, more than one block (7 s) over: not started.
    assert len(base_rows) == 4 and now[0] == 56.0
    assert steps[-1].startswith("the time budget: 1.2 of 1.0 minutes spent") or "time budget" in steps[-1], steps[-1]


async def test_a_search_whose_level_is_never_measured_cleanly_goes_on_without_it_and_ends() -> None:
    """Every block at C=8 fails (a server that answers 500 there): its rounds are set aside as often as allowed, the
    level is closed, and the search goes on and ends, with no more levels than its error control allows."""
    from specsweep.analysis.search import max_levels
    from specsweep.bench.config import SearchRange

    class FailsAt8(NoisyArm):
        async def measure(self, level: Block) -> BlockRow:
            row = await super().measure(level)
            if int(level.value) == 8:
                return row.model_copy(update={"completed": 0, "failed": row.requests, "errors": f"HTTPStatus: {row.requests}",
                                              "disturbed": f"{row.requests} request(s) failed (HTTPStatus: {row.requests})"})
            return row

    log: list[str] = []
    steps: list[str] = []
    base_rows, spec_rows = await designs.search(NoisyArm("base", lambda c: 1.0, log, 1), FailsAt8("spec", crossover, log, 2),
                                                SearchRange(min=1, max=64), DecisionConfig(min_blocks=4), 8,
                                                restart=False, on_step=lambda s: steps.append(s.why))
    assert len(steps) < 200 and steps[-1]  # it ended
    assert len({r.concurrency for r in base_rows}) <= max_levels(1, 64)
    at8 = [r for r in spec_rows if r.concurrency == 8]
    assert at8 and all(r.disturbed for r in at8) and len(at8) == 5  # set aside MAX_SET_ASIDE + 1 times, then closed
