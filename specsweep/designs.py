"""How the configurations of a comparison or a grid take turns at the levels: the designs, once.

    one(arm, points, more)              one configuration, level by level, each in blocks until ``more``
    sequential(arms, points, decision)  the first arm (the baseline) over every level, each until its own
                                        throughput is known; then each other arm, each level until its
                                        verdict against the baseline's blocks is decided (comparisons
                                        with ``design: sequential``, and every grid)
    alternate(base, spec, points, ...)  baseline and speculative blocks in turn at each level (ABBA), both
                                        servers up side by side, or one at a time restarted per block
    in_turn(arms, points, more, ...)    the same for any number of arms (the verify stage: always off,
                                        always on and the recommended setting)

An ``Arm`` is what a design needs of a configuration: whether an earlier try of the run already
finished it, its run row's recording, and its server's pipeline (``serve``: kill leftovers →
start → wait → warm up; the final kill however it ends) with a way to measure a block on it. The
flows build arms from their Prefect tasks; the designs know nothing of Prefect.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, AsyncExitStack, ExitStack
from typing import Protocol

from specsweep.analysis.decision import DecisionConfig, baseline_needs_more, pair_needs_more, speculative_needs_more
from specsweep.records import Block, BlockRow
from specsweep.sweep import disturbance
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
    other arm over the levels the baseline reached, each until its verdict against the baseline is decided."""
    base_more = baseline_needs_more(decision, num_requests)
    base_rows = await one(arms[0], points, lambda _p, rows: base_more(rows), stop_at_saturation=stop_at_saturation)
    base = by_level(base_rows)
    reached = [p for p in points if p.index in base]  # the baseline may have stopped at saturation

    def against_base(point: Level, rows: list[BlockRow]) -> bool:
        return speculative_needs_more(decision, num_requests, base.get(point.index, []))(rows)

    return [base_rows, *[await one(arm, reached, against_base) for arm in arms[1:]]]


async def in_turn(arms: Sequence[Arm], points: Sequence[Level], more: Callable[[list[list[BlockRow]]], bool], *,
                  restart: bool, stop_at_saturation: bool = False) -> list[list[BlockRow]]:
    """A block of each arm in turn at each level (``rotation``), round after round until ``more(rows
    per arm)`` says enough: every server up side by side, or (``restart``) one at a time, started for each
    block. Arms an earlier try finished whole are not measured again."""
    done = [arm.finished() for arm in arms]
    if all(d is not None for d in done):
        return [d or [] for d in done]
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

            return await run_in_turn(list(points), measures, more=more, stop_at_saturation=stop_at_saturation,
                                     checks=checks, on_block=on_block, on_saturation=arms[0].on_saturation,
                                     set_asides=[arm.set_aside for arm in arms])


async def alternate(base: Arm, spec: Arm, points: Sequence[Level], decision: DecisionConfig, num_requests: int, *,
                    restart: bool, stop_at_saturation: bool = False) -> tuple[list[BlockRow], list[BlockRow]]:
    """Baseline and speculative blocks in turn at each level (ABBA), until each level's paired verdict is
    decided: both servers up side by side, or (``restart``) one at a time, started for each block."""
    more = pair_needs_more(decision, num_requests)
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
                  stop_at_saturation: bool = False) -> tuple[list[BlockRow], list[BlockRow]]:
    """A comparison's blocks, in the design its decision settings name."""
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

async def run_in_turn(
    sweep: list[Level],
    measures: Sequence[Measure],
    *,
    more: Callable[[list[list[BlockRow]]], bool],
    stop_at_saturation: bool = False,
    checks: Sequence[ServerCheck | None] | None = None,
    on_block: OnLevel | None = None,
    on_saturation: Callable[[], None] | None = None,
    set_asides: Sequence[SetAside | None] | None = None,
) -> list[list[BlockRow]]:
    """The alternate design: at each level, a block of each configuration in turn (``rotation``), round after
    round until ``more(rows per configuration)`` says the level is decided. A round with a disturbed block
    is set aside whole (the others marked as measured beside it) and measured again, at most MAX_SET_ASIDE
    times per level. The first configuration's blocks decide the stop at saturation. Returns every block's
    row of each configuration."""
    k = len(measures)
    checks = list(checks) if checks is not None else [None] * k
    set_asides = list(set_asides) if set_asides is not None else [None] * k
    state = Sweeper(stop_at_saturation, on_saturation)
    out: list[list[BlockRow]] = [[] for _ in range(k)]
    for n, point in enumerate(sweep, 1):
        clean: list[list[BlockRow]] = [[] for _ in range(k)]
        level_rows: list[list[BlockRow]] = [[] for _ in range(k)]
        rounds = aside = 0
        while True:
            level = point.block(rounds)
            rounds += 1
            got: dict[int, BlockRow] = {}
            for arm in rotation(k, level.repeat):
                row = await state.block(measures[arm], level, checks[arm])
                got[arm] = await state.judged(row, level_rows[arm], clean[arm], set_asides[arm])
                level_rows[arm].append(got[arm])
                if on_block is not None:
                    await on_block(got[arm], n, len(sweep))
            if any(r.disturbed is not None for r in got.values()):
                for arm, row in got.items():
                    if row.disturbed is None:
                        got[arm] = row.model_copy(update={"disturbed": PAIRED_WITH_DISTURBED})
                        if (store_it := set_asides[arm]) is not None:
                            await store_it(got[arm])
                for arm in range(k):
                    out[arm].append(got[arm])
                aside += 1
                if aside > MAX_SET_ASIDE:
                    break
                continue
            for arm in range(k):
                out[arm].append(got[arm])
                clean[arm].append(got[arm])
            if await _set_aside_shifted_round(clean, out, set_asides):
                aside += 1
                if aside > MAX_SET_ASIDE:
                    break
                continue
            if not more(clean):
                break
        if state.saturated_after(clean[0] or [r for r in out[0] if r.level_index == point.index]):
            break
    return out

async def _set_aside_shifted_round(clean: list[list[BlockRow]], out: list[list[BlockRow]],
                                   set_asides: Sequence[SetAside | None]) -> bool:
    """Set aside the round whose paired ratio (each arm against the first) lies far outside the others'
    (``disturbance.outlier_round``): its rows leave ``clean``, are marked in ``out`` and stored. True if one was."""
    for arm in range(1, len(clean)):
        found = disturbance.outlier_round([max(s.throughput, 1e-9) / max(b.throughput, 1e-9)
                                       for b, s in zip(clean[0], clean[arm], strict=False)])
        if found is None:
            continue
        index, why = found
        for a in range(len(clean)):
            row = clean[a].pop(index)
            marked = row.model_copy(update={"disturbed": why})
            out[a][next(i for i, r in enumerate(out[a]) if r is row)] = marked
            if (store_it := set_asides[a]) is not None:
                await store_it(marked)
        return True
    return False
