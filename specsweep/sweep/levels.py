"""The sweep loop: each level measured in blocks until enough count, each block judged as it ends (a block the
machine disturbed is set aside and measured again), the server checked after failures, the sweep stopped at
saturation."""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable
from typing import Any

from specsweep.records import Block, BlockRow
from specsweep.sweep import disturbance
from specsweep.sweep.job import Level

Measure = Callable[[Block], Awaitable[BlockRow]]
ServerCheck = Callable[[str], Awaitable[None]]
OnLevel = Callable[[BlockRow, int, int], Awaitable[None]]


def saturated(rows: list[BlockRow], *, min_gain: float = 0.05) -> bool:
    """True once output throughput stopped rising for two levels while latency grew.

    ``rows`` are per-level figures in sweep order (one per level, repeats merged).
    """
    if len(rows) < 3:
        return False
    best_before = max(r.output_tokens_per_s for r in rows[:-2])
    flat = all(r.output_tokens_per_s <= best_before * (1 + min_gain) for r in rows[-2:])
    lat = [r.e2e_ms_median or 0.0 for r in rows[-3:]]
    return flat and lat[2] > lat[1] > lat[0]

def merge_repeats(rows: list[BlockRow]) -> BlockRow:
    """One row per level: the median over repeats of every measured figure (the level's identity
    and counts are the first repeat's)."""
    if len(rows) == 1:
        return rows[0]
    merged: dict[str, Any] = rows[0].model_dump()
    for name in merged:
        values = [v for r in rows if isinstance(v := getattr(r, name), float)]
        if values:
            merged[name] = statistics.median(values)
    return BlockRow.model_validate(merged)

More = Callable[[Level, list[BlockRow]], bool]

def repeats(n: int) -> More:
    """A fixed number of blocks per level."""
    return lambda point, rows: len(rows) < n

SetAside = Callable[[BlockRow], Awaitable[None]]

#: Blocks (or rounds of blocks in turn) of one level set aside as disturbed at most: past it the level keeps
#: what it has, and says so.
MAX_SET_ASIDE = 4

PAIRED_WITH_DISTURBED = "measured in turn with a block that was set aside"

class Sweeper:
    """What the sweeps share: measuring a block with the crash check around it, setting aside a block the
    machine disturbed, and the stop at saturation."""

    def __init__(self, stop_at_saturation: bool, on_saturation: Callable[[], None] | None) -> None:
        self.stop_at_saturation, self.on_saturation = stop_at_saturation, on_saturation
        self.merged: list[BlockRow] = []

    @staticmethod
    async def block(measure: Measure, level: Block, check_server: ServerCheck | None) -> BlockRow:
        try:
            row = await measure(level)
        except Exception:
            if check_server is not None:
                await check_server(f"while level {level.label} was measured")
            raise
        if row.failed and check_server is not None:
            await check_server(f"during level {level.label}")
        return row

    @staticmethod
    async def judged(row: BlockRow, level_rows: list[BlockRow], clean: list[BlockRow],
                     set_aside: SetAside | None) -> BlockRow:
        """The block judged against its level's earlier blocks (``level_rows``, the ``clean`` ones among them).
        Failed requests or a client lag met again after a block was set aside for them are how the level runs
        here: the block counts (stored so), unless no request of it completed (an outage, or a server that
        answers nothing, has no throughput to count). A stall is a disturbance however often it comes back
        (up to MAX_SET_ASIDE). Else it is marked disturbed when its
        throughput lies far outside its level's clean blocks. A disturbed block goes to ``set_aside`` (stored
        with its reason)."""
        cause = disturbance.own_cause(row.disturbed)
        if cause in disturbance.THE_SERVERS_WHEN_MET_AGAIN and row.completed and \
                any(disturbance.own_cause(r.disturbed) == cause for r in level_rows):
            row = row.model_copy(update={"disturbed": None})
            if set_aside is not None:
                await set_aside(row)
            return row
        if row.disturbed is None and (why := disturbance.outlier(row.throughput, [r.throughput for r in clean])):
            row = row.model_copy(update={"disturbed": why})
        if row.disturbed is not None and set_aside is not None:
            await set_aside(row)
        return row

    def saturated_after(self, rows: list[BlockRow]) -> bool:
        self.merged.append(merge_repeats(rows))
        if self.stop_at_saturation and saturated(self.merged):
            if self.on_saturation is not None:
                self.on_saturation()
            return True
        return False

async def run_levels(
    sweep: list[Level],
    measure: Measure,
    *,
    more: More,
    stop_at_saturation: bool = False,
    check_server: ServerCheck | None = None,
    on_level: OnLevel | None = None,
    on_saturation: Callable[[], None] | None = None,
    set_aside: SetAside | None = None,
) -> list[BlockRow]:
    """Measure each level in blocks, in order, and return every block's row.

    ``more(point, rows)`` says whether a level needs another block (``repeats(n)`` for a fixed number); it
    sees only the blocks that count: a block the machine disturbed (``BlockRow.disturbed``; an outlier among
    its level's blocks is marked here and stored again by ``set_aside``) is kept and measured again, at most
    MAX_SET_ASIDE times per level; failures or a client lag met again in the block measured again count.
    ``check_server(when)`` runs after a block with failed requests and when
    ``measure`` raises: it raises if the server is gone (the sweep stops there, with the blocks before it
    kept).
    """
    state = Sweeper(stop_at_saturation, on_saturation)
    rows: list[BlockRow] = []
    for n, point in enumerate(sweep, 1):
        level_rows: list[BlockRow] = []
        clean: list[BlockRow] = []
        while True:
            row = await state.block(measure, point.block(len(level_rows)), check_server)
            row = await state.judged(row, level_rows, clean, set_aside)
            level_rows.append(row)
            rows.append(row)
            if on_level is not None:
                await on_level(row, n, len(sweep))
            if row.disturbed is not None:
                if len(level_rows) - len(clean) > MAX_SET_ASIDE:
                    break
                continue
            clean.append(row)
            if not more(point, clean):
                break
        if state.saturated_after(clean or level_rows):
            break
    return rows
