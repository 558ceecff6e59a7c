"""How the configurations of a comparison or a grid take turns at the levels: the designs, once.

    one(arm, points, more)              one configuration, level by level, each in blocks until ``more``
    sequential(arms, points, decision)  the first arm (the baseline) over every level, each until its own
                                        throughput is known; then each other arm, each level until it
                                        is settled against the baseline's blocks (comparisons
                                        with ``design: sequential``, and every grid)
    alternate(base, spec, points, ...)  baseline and speculative blocks in turn at each level (ABBA), both
                                        servers up side by side, or one at a time restarted per block
    in_turn(arms, points, more, ...)    the same for any number of arms (the verify stage: always off,
                                        always on and the recommended setting)
    in_turns(arms, points, more)        the verify stage one server at a time: turns of several blocks,
                                        a start per arm and round, never a restart per block
    search(base, spec, span, ...)       the same, a round at a time at the level a search names next
                                        (``specsweep.analysis.search``), within a time budget

An ``Arm`` is what a design needs of a configuration: whether an earlier try of the run already
finished it, its run row's recording, and its server's pipeline (``serve``: kill leftovers →
start → wait → warm up; the final kill however it ends) with a way to measure a block on it. The
flows build arms from their Prefect tasks; the designs know nothing of Prefect.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, AsyncExitStack, ExitStack, asynccontextmanager
from typing import Protocol

from specsweep.analysis.compare import compare_levels
from specsweep.analysis.decision import (
    DecisionConfig,
    baseline_needs_more,
    budget_spent,
    pair_needs_more,
    speculative_needs_more,
)
from specsweep.analysis.search import Step, max_levels, next_step
from specsweep.bench.config import SearchRange
from specsweep.records import Block, BlockRow
from specsweep.sweep.job import Level
from specsweep.sweep.levels import (
    MAX_SET_ASIDE,
    PAIRED_WITH_DISTURBED,
    Measure,
    More,
    OnLevel,
    ServerCheck,
    SetAside,
    Sweeper,
    run_levels,
)


class Serving(Protocol):
    """A configuration's server while it is up: measure a block on it, check it after failures."""

    async def measure(self, level: Block) -> BlockRow: ...

    async def check(self, when: str) -> None: ...


class Arm(Protocol):
    """One configuration as a design drives it."""

    name: str

    def finished(self) -> list[BlockRow] | None:
        """Every block of this configuration, when an earlier try of the run measured it whole."""

    def recording(self) -> AbstractContextManager[object]:
        """The configuration's run row: running, then completed, failed or cancelled."""

    def serve(self) -> AbstractAsyncContextManager[Serving]:
        """Its server up and ready; the final kill when the block ends, however it ends."""

    async def on_block(self, row: BlockRow, done: int, total: int) -> None:
        """After each block: progress for people."""

    def on_saturation(self) -> None:
        """The sweep stops: throughput stopped rising while latency grew."""

    async def set_aside(self, row: BlockRow) -> None:
        """Keep a block set aside as disturbed, with its reason, where its run's rows are kept."""


async def one(arm: Arm, points: Sequence[Level], more: More, *, stop_at_saturation: bool = False) -> list[BlockRow]:
    """One configuration over ``points``, each level in blocks until ``more`` says enough."""
    if (done := arm.finished()) is not None:
        return done
    with arm.recording():
        async with arm.serve() as server:
            return await run_levels(list(points), server.measure, more=more, stop_at_saturation=stop_at_saturation,
                                    check_server=server.check, on_level=arm.on_block,
                                    on_saturation=arm.on_saturation, set_aside=arm.set_aside)


def by_level(rows: Sequence[BlockRow]) -> dict[int, list[BlockRow]]:
    """The blocks that count (not set aside as disturbed), by level."""
    out: dict[int, list[BlockRow]] = {}
    for r in rows:
        if r.disturbed is None:
            out.setdefault(r.level_index, []).append(r)
    return out


async def sequential(arms: Sequence[Arm], points: Sequence[Level], decision: DecisionConfig, num_requests: int, *,
                     stop_at_saturation: bool = False) -> list[list[BlockRow]]:
    """The baseline (``arms[0]``) over every level, each until its throughput is known to ±margin/2; then each
    other arm over the levels the baseline reached, each until it is settled against the baseline."""
    base_more = baseline_needs_more(decision, num_requests, len(points))
    base_rows = await one(arms[0], points, lambda _p, rows: base_more(rows), stop_at_saturation=stop_at_saturation)
    return [base_rows, *await against_baseline(base_rows, arms[1:], points, decision, num_requests)]


async def against_baseline(base_rows: list[BlockRow], arms: Sequence[Arm], points: Sequence[Level],
                           decision: DecisionConfig, num_requests: int) -> list[list[BlockRow]]:
    """Each arm in turn over the levels the baseline's ``base_rows`` reached, each level until it is settled against
    the baseline (the sequential design's second part; a grid measures some of its points after others)."""
    base = by_level(base_rows)
    reached = [p for p in points if p.index in base]  # the baseline may have stopped at saturation

    def against_base(point: Level, rows: list[BlockRow]) -> bool:
        return speculative_needs_more(decision, num_requests, base.get(point.index, []), len(reached))(rows)

    return [await one(arm, reached, against_base) for arm in arms]


async def in_turn(arms: Sequence[Arm], points: Sequence[Level], more: Callable[[list[list[BlockRow]]], bool], *,
                  restart: bool, stop_at_saturation: bool = False) -> list[list[BlockRow]]:
    """A block of each arm in turn at each level (``rotation``), round after round until ``more(rows
    per arm)`` says enough: every server up side by side, or (``restart``) one at a time, started for each
    block. Arms an earlier try finished whole are not measured again."""
    done = [arm.finished() for arm in arms]
    if all(d is not None for d in done):
        return [d or [] for d in done]
    async with taking_turns(arms, restart=restart, stop_at_saturation=stop_at_saturation) as turn:
        return await run_in_turn(list(points), turn=turn, more=more)


async def in_turns(arms: Sequence[Arm], points: Sequence[Level],
                   more: Callable[[list[list[BlockRow]]], bool]) -> list[list[BlockRow]]:
    """The arms one server at a time, in turns of several blocks (the verify stage where its servers cannot all be
    up at once): a round is a turn of each arm (``rotation``), and in its turn an arm's server is started once and
    measures a block at every level that ``more`` says is not settled yet. A level's round with a disturbed block is
    set aside whole (the others marked as measured beside it), at most MAX_SET_ASIDE times per level. Starts: one
    per arm and round, where a block per start would take one per arm, level and round."""
    done = [arm.finished() for arm in arms]
    if all(d is not None for d in done):
        return [d or [] for d in done]
    k = len(arms)
    out: list[list[BlockRow]] = [[] for _ in range(k)]
    clean: dict[int, list[list[BlockRow]]] = {p.index: [[] for _ in range(k)] for p in points}
    level_rows: dict[int, list[list[BlockRow]]] = {p.index: [[] for _ in range(k)] for p in points}
    aside: dict[int, int] = {}
    sweeper = Sweeper(False, None)
    with ExitStack() as records:
        for arm in arms:
            records.enter_context(arm.recording())
        repeat = 0
        while todo := [p for p in points if aside.get(p.index, 0) <= MAX_SET_ASIDE and more(clean[p.index])]:
            got: dict[int, dict[int, BlockRow]] = {p.index: {} for p in todo}
            for a in rotation(k, repeat):
                async with arms[a].serve() as server:
                    for n, p in enumerate(todo, 1):
                        row = await sweeper.block(server.measure, p.block(repeat), server.check)
                        row = await sweeper.judged(row, level_rows[p.index][a], clean[p.index][a], arms[a].set_aside)
                        level_rows[p.index][a].append(row)
                        got[p.index][a] = row
                        await arms[a].on_block(row, n, len(todo))
            for p in todo:
                rows = got[p.index]
                if any(r.disturbed is not None for r in rows.values()):
                    for a, row in rows.items():
                        if row.disturbed is None:
                            rows[a] = row.model_copy(update={"disturbed": PAIRED_WITH_DISTURBED})
                            await arms[a].set_aside(rows[a])
                    aside[p.index] = aside.get(p.index, 0) + 1
                else:
                    for a in range(k):
                        clean[p.index][a].append(rows[a])
                for a in range(k):
                    out[a].append(rows[a])
            repeat += 1
    return out


@asynccontextmanager
async def taking_turns(arms: Sequence[Arm], *, restart: bool,
                       stop_at_saturation: bool = False) -> AsyncIterator[InTurn]:
    """The arms recorded and served for blocks in turn: every server up side by side for the whole ``async
    with``, or (``restart``) one at a time, started for each block; their final kills when it ends."""
    with ExitStack() as records:
        for arm in arms:
            records.enter_context(arm.recording())
        async with AsyncExitStack() as stack:
            checks: list[Callable[[str], Awaitable[None]] | None] = [None] * len(arms)
            if restart:
                measures = [_restarted(arm) for arm in arms]
            else:
                servers = [await stack.enter_async_context(arm.serve()) for arm in arms]
                measures, checks = [s.measure for s in servers], [s.check for s in servers]
            by_name = {arm.name: arm for arm in arms}

            async def on_block(row: BlockRow, done: int, total: int) -> None:
                await by_name[row.config_name].on_block(row, done, total)

            yield InTurn(measures, checks=checks, on_block=on_block, set_asides=[arm.set_aside for arm in arms],
                         sweeper=Sweeper(stop_at_saturation, arms[0].on_saturation))


async def alternate(base: Arm, spec: Arm, points: Sequence[Level], decision: DecisionConfig, num_requests: int, *,
                    restart: bool, stop_at_saturation: bool = False) -> tuple[list[BlockRow], list[BlockRow]]:
    """Baseline and speculative blocks in turn at each level (ABBA), until each level is settled (one fixed
    policy within the margin there, worst case): both servers up side by side, or (``restart``) one at a time,
    started for each block."""
    more = pair_needs_more(decision, num_requests, len(points))
    base_rows, spec_rows = await in_turn([base, spec], points, lambda clean: more(clean[0], clean[1]), restart=restart,
                                         stop_at_saturation=stop_at_saturation)
    return base_rows, spec_rows


def _restarted(arm: Arm) -> Callable[[Block], Awaitable[BlockRow]]:
    """A block on a server started for it alone (checked for a crash when it had failures)."""

    async def measure(level: Block) -> BlockRow:
        async with arm.serve() as server:
            row = await server.measure(level)
            if row.failed:
                await server.check(f"during level {level.label}")
            return row

    return measure


async def compare(base: Arm, spec: Arm, points: Sequence[Level], decision: DecisionConfig, num_requests: int, *,
                  stop_at_saturation: bool = False, span: SearchRange | None = None, budget: Budget | None = None,
                  on_step: Callable[[Step], None] | None = None) -> tuple[list[BlockRow], list[BlockRow]]:
    """A comparison's blocks, in the design its decision settings name; with ``span``, the levels found by search
    (within ``budget``)."""
    if span is not None:
        return await search(base, spec, span, decision, num_requests, restart=decision.alternate_by == "restart",
                            budget=budget, on_step=on_step)
    if decision.design == "sequential":
        base_rows, spec_rows = await sequential([base, spec], points, decision, num_requests,
                                                stop_at_saturation=stop_at_saturation)
        return base_rows, spec_rows
    return await alternate(base, spec, points, decision, num_requests, restart=decision.alternate_by == "restart",
                           stop_at_saturation=stop_at_saturation)


# -- blocks in turn ------------------------------------------------------------------------------


def rotation(arms: int, repeat: int) -> list[int]:
    """Which arm measures first in a round: ABBA for two (so a drift within a pair falls on both alike),
    a rotation for more (each arm in each place in turn)."""
    if arms == 2:
        return [0, 1] if repeat % 2 == 0 else [1, 0]
    return [(repeat + i) % arms for i in range(arms)]


class InTurn:
    """Blocks of several arms taken in turn (``rotation``), a round at a time: each round at a level numbered on
    from the last (its blocks' repeat), a round with a disturbed block (failed requests, the client's lag: never
    its throughput or ratio) set aside whole, the others marked as measured beside it. The rows of every level
    are kept here: ``clean[level index][arm]`` (the rounds that count) and ``out[arm]`` (every block)."""

    def __init__(self, measures: Sequence[Measure], *, checks: Sequence[ServerCheck | None] | None = None,
                 on_block: OnLevel | None = None, set_asides: Sequence[SetAside | None] | None = None,
                 sweeper: Sweeper | None = None) -> None:
        self.k = len(measures)
        self.measures = list(measures)
        self.checks = list(checks) if checks is not None else [None] * self.k
        self.set_asides = list(set_asides) if set_asides is not None else [None] * self.k
        self.on_block = on_block
        self.sweeper = sweeper or Sweeper(False, None)
        self.out: list[list[BlockRow]] = [[] for _ in range(self.k)]
        self.clean: dict[int, list[list[BlockRow]]] = {}
        self.level_rows: dict[int, list[list[BlockRow]]] = {}
        self.rounds: dict[int, int] = {}
        self.aside: dict[int, int] = {}

    def counted(self, point: Level) -> list[list[BlockRow]]:
        """The rounds that count at ``point``, per arm."""
        return self.clean.setdefault(point.index, [[] for _ in range(self.k)])

    async def round(self, point: Level, done: int = 0, total: int = 0) -> bool:
        """One round at ``point``; whether it counts (False: set aside whole, as often as MAX_SET_ASIDE allows
        before ``exhausted``)."""
        clean = self.counted(point)
        level_rows = self.level_rows.setdefault(point.index, [[] for _ in range(self.k)])
        level = point.block(self.rounds.get(point.index, 0))
        self.rounds[point.index] = level.repeat + 1
        got: dict[int, BlockRow] = {}
        for arm in rotation(self.k, level.repeat):
            row = await self.sweeper.block(self.measures[arm], level, self.checks[arm])
            got[arm] = await self.sweeper.judged(row, level_rows[arm], clean[arm], self.set_asides[arm])
            level_rows[arm].append(got[arm])
            if self.on_block is not None:
                await self.on_block(got[arm], done, total)
        if any(r.disturbed is not None for r in got.values()):
            for arm, row in got.items():
                if row.disturbed is None:
                    got[arm] = row.model_copy(update={"disturbed": PAIRED_WITH_DISTURBED})
                    if (store_it := self.set_asides[arm]) is not None:
                        await store_it(got[arm])
            for arm in range(self.k):
                self.out[arm].append(got[arm])
            self.aside[point.index] = self.aside.get(point.index, 0) + 1
            return False
        for arm in range(self.k):
            self.out[arm].append(got[arm])
            clean[arm].append(got[arm])
        return True

    def exhausted(self, point: Level) -> bool:
        """Rounds were set aside at ``point`` more often than MAX_SET_ASIDE: it keeps what it has."""
        return self.aside.get(point.index, 0) > MAX_SET_ASIDE


async def run_in_turn(
    sweep: list[Level],
    measures: Sequence[Measure] = (),
    *,
    more: Callable[[list[list[BlockRow]]], bool],
    stop_at_saturation: bool = False,
    checks: Sequence[ServerCheck | None] | None = None,
    on_block: OnLevel | None = None,
    on_saturation: Callable[[], None] | None = None,
    set_asides: Sequence[SetAside | None] | None = None,
    turn: InTurn | None = None,
) -> list[list[BlockRow]]:
    """The alternate design: at each level, rounds of a block of each configuration in turn (``InTurn``; one is
    made of ``measures`` and the rest unless ``turn`` is given) until ``more(rows per configuration)`` says the
    level is settled, a set-aside round measured again at most MAX_SET_ASIDE times per level. The first
    configuration's blocks decide the stop at saturation. Returns every block's row of each configuration."""
    if turn is None:
        turn = InTurn(measures, checks=checks, on_block=on_block, set_asides=set_asides,
                      sweeper=Sweeper(stop_at_saturation, on_saturation))
    for n, point in enumerate(sweep, 1):
        while True:
            if not await turn.round(point, n, len(sweep)):
                if turn.exhausted(point):
                    break
                continue
            if not more(turn.counted(point)):
                break
        clean = turn.counted(point)[0]
        if turn.sweeper.saturated_after(clean or [r for r in turn.out[0] if r.level_index == point.index]):
            break
    return turn.out


# -- search ---------------------------------------------------------------------------------------


class Budget:
    """A run's time budget, from its start: what is left, and whether a step of a known cost still fits (one
    block over at most: a round of two blocks starts while half of it fits)."""

    def __init__(self, minutes: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = None if minutes is None else minutes * 60.0
        self.clock = clock
        self.started = clock()

    def spent_s(self) -> float:
        return self.clock() - self.started

    def part(self, share: float) -> Budget:
        """The first ``share`` of this budget, from the same start (a stage that must leave time to the next)."""
        part = Budget(None, self.clock)
        part.started = self.started
        part.seconds = None if self.seconds is None else self.seconds * share
        return part

    def remaining_s(self) -> float | None:
        """Seconds left (None: no budget)."""
        return None if self.seconds is None else self.seconds - self.spent_s()

    def fits(self, cost_s: float, blocks: int = 2) -> bool:
        if self.seconds is None:
            return True
        return self.spent_s() + cost_s * (blocks - 1) / blocks <= self.seconds


async def search(base: Arm, spec: Arm, span: SearchRange, decision: DecisionConfig, num_requests: int, *,
                 restart: bool, budget: Budget | None = None,
                 on_step: Callable[[Step], None] | None = None) -> tuple[list[BlockRow], list[BlockRow]]:
    """The crossover found by search (``specsweep.analysis.search``): baseline and speculative blocks in turn
    (ABBA), a round at a time at the level the search names next, from both ends of ``span``, until it stops or
    the next round would pass ``budget``. Returns each configuration's blocks."""
    done = [arm.finished() for arm in (base, spec)]
    if all(d is not None for d in done):
        return done[0] or [], done[1] or []
    most = max_levels(span.min, span.max)
    levels: dict[int, Level] = {}
    round_s: dict[int, list[float]] = {}

    def level(c: int) -> Level:
        if c not in levels:
            levels[c] = Level(len(levels), "concurrency", float(c))
        return levels[c]

    for c in (span.min, span.max):
        level(c)
    async with taking_turns([base, spec], restart=restart) as turn:
        while True:
            # Every level taken up counts against the most (an exhausted one too); one whose rounds were set aside as
            # often as allowed, or whose time is spent, takes no more.
            answered = {c: len(turn.counted(lv)[0]) for c, lv in levels.items()}
            closed = {c for c, lv in levels.items() if turn.exhausted(lv) or budget_spent(
                [*turn.counted(lv)[0], *turn.counted(lv)[1]], decision, num_requests, answered[c])}
            comp = None
            if any(turn.counted(lv)[0] for lv in levels.values()):
                comp = compare_levels(turn.out[0], turn.out[1], decision=decision, paired=True,
                                      num_requests=num_requests, answer_levels=most, search=True)
            step = next_step(comp, answered, decision, num_requests, most, closed,
                             remaining_s=budget.remaining_s() if budget is not None else None,
                             round_s={c: statistics.median(xs) for c, xs in round_s.items() if xs})
            at = step.concurrency
            if at is not None:
                costs = round_s.get(at) or [s for xs in round_s.values() for s in xs]
                cost = statistics.median(costs) if costs else 0.0
                if budget is not None and not budget.fits(cost):
                    step = Step("stop", None, f"the time budget: {budget.spent_s() / 60:.1f} of "
                                f"{(budget.seconds or 0) / 60:.1f} minutes spent, and a round at C={at} takes about "
                                f"{cost:.0f} s")
            if on_step is not None:
                on_step(step)
            if step.kind == "stop" or at is None:
                break
            clock = budget.clock if budget is not None else time.monotonic
            t0 = clock()
            await turn.round(level(at), len(levels), most)
            round_s.setdefault(at, []).append(clock() - t0)
    return turn.out[0], turn.out[1]
