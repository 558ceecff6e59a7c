"""Comparisons with a known answer: blocks generated with known speculative / baseline ratios and this machine's
noise, passed through the product's own decision code, every rule included.

What the product runs, here too: ``designs.run_in_turn`` takes the rounds (ABBA order), with the set-aside
rules as blocks end (``Sweeper.judged``: failed requests and the client's lag set aside, a lag met again
counted) and the stopping rule (``decision.pair_needs_more``); ``compare.compare_levels`` turns the blocks
into intervals, verdicts and the setting (``recommend``). Only the measurement is simulated: a block's
throughput is the true speed times the machine's noise, and its reason for being set aside is the one
``sweep.disturbance.disturbance`` gives for the client lag the simulation drew.

The noise, shaped like this machine's (``/work/shared/notes/statistics.md``):
- white noise per round of 5-18 % (log-normal on each block, the round's ratio spread by that much);
- a 1.6x shift of the machine inside a round, now and then (the second block of the round runs at 1/1.6 or 1.6
  times the first's speed);
- stalls: a block now and then loses a share of its throughput to a stall of its engine (either arm alike: the
  true ratio is the median's);
- client lag: a block now and then held back by the client's event loop (set aside by the product's rule; a
  lag met again at the level counts, as the product counts it).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from specsweep.analysis.compare import Comparison, compare_levels
from specsweep.analysis.decision import DecisionConfig, pair_needs_more
from specsweep.analysis.stats import Verdict
from specsweep.designs import rotation, run_in_turn
from specsweep.records import Block, BlockRow, BlockRun
from specsweep.sweep import Level
from specsweep.sweep.disturbance import disturbance

SHIFT_P, SHIFT = 0.04, 1.6
STALL_P, STALL_COST = 0.03, 0.35
LAG_P, LAG_COST = 0.02, 0.2
NUM_REQUESTS = 32
#: Scenarios: (name, true ratios by level).
FIXED: tuple[tuple[str, tuple[float, ...]], ...] = (
    ("1.15,1.15,1.00,0.80", (1.15, 1.15, 1.00, 0.80)),
    ("crossover between 16 and 24", (1.35, 1.25, 1.12, 1.04, 0.93, 0.85)),
    ("all 1.00", (1.0, 1.0, 1.0, 1.0, 1.0)),
)


@dataclass(frozen=True)
class Outcome:
    scenario: str
    noise: float
    truth: tuple[float, ...]
    comparison: Comparison

    @property
    def wrong_verdicts(self) -> list[int | float]:
        return [lv.concurrency for lv, r in zip(self.comparison.levels, self.truth, strict=True)
                if wrong(lv.verdict, r, self.comparison.margin)]

    @property
    def covered(self) -> bool:
        """Every level's interval holds its true ratio (an unbounded one holds anything)."""
        return all((lv.ratio_low is None or lv.ratio_low <= r) and (lv.ratio_high is None or r <= lv.ratio_high)
                   for lv, r in zip(self.comparison.levels, self.truth, strict=True))

    @property
    def true_loss(self) -> float:
        """What the chosen setting truly gives up, worst over the levels, against the better fixed policy."""
        off = self.comparison.recommendation.speculation_off_from
        return max(max(0.0, 1.0 - r) if off is None or lv.concurrency < off else max(0.0, 1.0 - 1.0 / r)
                   for lv, r in zip(self.comparison.levels, self.truth, strict=True))

    @property
    def beyond_bound(self) -> bool:
        bound = self.comparison.recommendation.worst_case_loss
        return bound is not None and self.true_loss > bound + 1e-12


def wrong(v: Verdict, r: float, margin: float) -> bool:
    """A verdict the true ratio contradicts."""
    return {"faster": r <= 1.0, "slower": r >= 1.0, "equivalent": not 1.0 - margin <= r <= 1.0 + margin,
            "no gain": r >= 1.0 + margin, "undetermined": False}[v]


def _row(name: str, level: Block, throughput: float, disturbed: str | None) -> BlockRow:
    return BlockRow(config_name=name, level_index=level.index, mode="concurrency", concurrency=int(level.value),
                    repeat=level.repeat, output_tokens_per_s=throughput, completed=NUM_REQUESTS,
                    requests=NUM_REQUESTS, duration_s=NUM_REQUESTS * 100 / throughput, disturbed=disturbed)


class Machine:
    """This machine's noise, drawing each block in the order the design measures it."""

    def __init__(self, rng: random.Random, truth: Sequence[float], noise: float) -> None:
        self.rng, self.truth, self.block_sd = rng, truth, noise / math.sqrt(2.0)
        self.shifted: dict[tuple[int, int], float] = {}

    def speed(self, level: Block, arm: int) -> tuple[float, str | None]:
        rng = self.rng
        key = (level.index, level.repeat)
        # The shift of a round lands on the block measured second in it.
        second = rotation(2, level.repeat)[1] == arm
        if second and rng.random() < SHIFT_P:
            self.shifted[key] = SHIFT if rng.random() < 0.5 else 1.0 / SHIFT
        tps = 100.0 * (2 ** level.index) ** 0.7 * math.exp(rng.gauss(0.0, self.block_sd))
        tps *= self.truth[level.index] if arm == 1 else 1.0
        tps *= self.shifted.get(key, 1.0) if second else 1.0
        if rng.random() < STALL_P:
            tps *= 1.0 - STALL_COST * rng.random()  # the engine's own: it counts
        lag_ms = 1.0
        if rng.random() < LAG_P:
            tps *= 1.0 - LAG_COST * rng.random()
            lag_ms = 300.0 + 900.0 * rng.random()
        why = disturbance(BlockRun(level, [], 0.0, loop_lag_max_ms=lag_ms), {"failed": 0, "errors": None})
        return tps, why


async def _compare(rng: random.Random, truth: Sequence[float], noise: float, decision: DecisionConfig) -> Comparison:
    machine = Machine(rng, truth, noise)
    points = [Level(i, "concurrency", 2 ** i) for i in range(len(truth))]

    def arm(a: int, name: str) -> Callable[[Block], Awaitable[BlockRow]]:
        async def measure(level: Block) -> BlockRow:
            tps, why = machine.speed(level, a)
            return _row(name, level, tps, why)
        return measure

    more = pair_needs_more(decision, NUM_REQUESTS, len(points))
    base, spec = await run_in_turn(points, [arm(0, "base"), arm(1, "spec")], more=lambda c: more(c[0], c[1]))
    return compare_levels(base, spec, decision=decision, paired=True, num_requests=NUM_REQUESTS)


def scenarios(rng: random.Random, n: int) -> list[tuple[str, tuple[float, ...]]]:
    """n scenarios: the fixed ones in turn with random monotone crossovers of 4-8 levels."""
    out = []
    for i in range(n):
        if i % 4 < len(FIXED):
            out.append(FIXED[i % 4])
            continue
        k = rng.randint(4, 8)
        top, bottom = rng.uniform(1.05, 1.4), rng.uniform(0.7, 1.0)
        out.append((f"random crossover, {k} levels", tuple(top + (bottom - top) * j / (k - 1) for j in range(k))))
    return out


def simulate(n: int, *, seed: int = 43, decision: DecisionConfig | None = None) -> list[Outcome]:
    """n comparisons with known answers through the product's decision code."""
    decision = decision or DecisionConfig(design="alternate", max_requests_per_level=NUM_REQUESTS * 24,
                                          max_seconds_per_level=86400)
    rng = random.Random(seed)

    async def run_all() -> list[Outcome]:
        out = []
        for name, truth in scenarios(rng, n):
            noise = rng.uniform(0.05, 0.18)
            out.append(Outcome(name, noise, truth, await _compare(rng, truth, noise, decision)))
        return out

    return asyncio.run(run_all())
