"""An engine's own speculation controller, read while a block runs: its active tier (draft steps).

An engine that shows its controller's active tier over HTTP names where (``Engine.tier_at``) and how to read it
from the answer (``Engine.controller_tier``: None where the server does not run its controller). The sampler reads
it every ``interval_s`` while a block runs and the block's row keeps its mean and distribution
(``controller_tier_mean``, ``controller_tiers``). A server that does not run its controller is read once: a fixed
setting's steps are not a tier. Engines without such an endpoint show their depth in the counters' draft tokens per
step (``spec_drafted_per_step``).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from specsweep.server.periodic import Periodic


class TierSampler(Periodic):
    """Reads the active tier every ``interval_s`` while a block runs (``async with``). Stops at the first answer
    without one (no controller running there), or after three reads without an answer."""

    def __init__(self, read: Callable[[str], Awaitable[dict[str, Any] | None]], path: str,
                 tier: Callable[[dict[str, Any]], int | None], interval_s: float = 0.5) -> None:
        self.read, self.path, self.tier, self.interval_s = read, path, tier, interval_s
        self.samples: list[tuple[float, int]] = []

    async def _loop(self) -> None:
        misses = 0
        while misses < 3:
            info = await self.read(self.path)
            if info is None:
                misses += 1
            elif (tier := self.tier(info)) is None:
                return
            else:
                misses = 0
                self.samples.append((time.time(), tier))
            await asyncio.sleep(self.interval_s)

    def within(self, start: float, end: float) -> list[int]:
        return [tier for t, tier in self.samples if start <= t <= end]


def tier_figures(tiers: Sequence[int]) -> dict[str, Any]:
    """A block's ``controller_tier_mean`` and ``controller_tiers`` (draft steps to their share of the samples, as
    JSON); nothing where no sample fell inside the block."""
    if not tiers:
        return {}
    shares = {str(t): round(tiers.count(t) / len(tiers), 4) for t in sorted(set(tiers))}
    return {"controller_tier_mean": statistics.fmean(tiers), "controller_tiers": json.dumps(shares)}
