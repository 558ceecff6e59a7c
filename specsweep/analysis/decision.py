"""When a comparison has measured a level enough: the decision settings and the rules that ask
for another block.

A comparison measures each level in blocks (``sweep.num_requests`` requests each) until the
level's verdict (``specsweep.analysis.stats``) is decided or its budget is spent:

- alternate design: baseline and speculative blocks taken in turn (ABBA order), paired; the
  level stops once the paired verdict is decided (after ``min_blocks`` pairs at least);
- sequential design: all baseline levels first, each until its own throughput is known to
  ±margin/2, then the speculative levels, each until its verdict against the baseline's
  blocks is decided.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from specsweep.analysis.slo import SLO
from specsweep.analysis.stats import RatioInterval, Verdict, ratio_interval, simultaneous_confidence, t_quantile, verdict
from specsweep.records import BlockRow

Design = Literal["sequential", "alternate"]
Alternation = Literal["side-by-side", "restart"]


class DecisionConfig(BaseModel):
    """How a comparison decides each level: the margin, the confidence, the budget, the design."""

    model_config = ConfigDict(extra="forbid")

    margin: float = Field(0.03, gt=0, lt=0.5, description="Ratios within ±margin count as equivalent (0.03: ±3 %).")
    confidence: float = Field(0.95, ge=0.5, lt=1, description="Confidence of each level's interval (held over all "
                              "the looks the budget allows).")
    min_blocks: int = Field(4, ge=2, le=100, description="Blocks per configuration at least, before a level may stop "
                            "(with fewer, the interval of a level is wide: few degrees of freedom).")
    max_requests_per_level: int = Field(
        96, ge=2, le=1_000_000,
        description="Budget: measured requests per configuration at one level (blocks of sweep.num_requests).")
    max_seconds_per_level: float = Field(
        120.0, gt=0, le=24 * 3600, description="Budget: seconds of measured load per level, both configurations.")
    design: Design = Field(
        "sequential", description="sequential: all baseline levels, then all speculative ones; alternate: baseline "
        "and speculative blocks in turn at each level, so that slow drift of the machine lands on both alike.")
    alternate_by: Alternation = Field(
        "restart", description="alternate design: restart: one server at a time, restarted for each block (GPU hosts; "
        "each start costs its load time); side-by-side: both servers up at once on two ports (when both fit).")
    allow_mismatch: bool = Field(False, description="Compare even if GPU, driver, engine or model differ.")
    slo: SLO | None = Field(None, description="Latency targets (p99 TTFT and TPOT, ms): the report then gives each "
                            "configuration's capacity within them and its goodput per level.")
    verify: bool = Field(
        False, description="After a decided answer, start the engine with the recommended per-batch setting and "
        "measure it at the same levels in turn with always-on and always-off (specsweep.analysis.verify).")

    def max_blocks(self, num_requests: int) -> int:
        return max(self.min_blocks, self.max_requests_per_level // max(1, num_requests))

    def look_confidence(self, num_requests: int) -> float:
        """The confidence of each look at a level (Bonferroni over the looks its budget allows)."""
        return simultaneous_confidence(self.confidence, self.max_blocks(num_requests) - self.min_blocks + 1)


def throughputs(rows: Sequence[BlockRow]) -> list[float]:
    """Steady output tokens/s of each block (a block that produced nothing counts as a tiny positive number)."""
    return [max(r.throughput, 1e-9) for r in rows]


def level_verdict(base: Sequence[BlockRow], spec: Sequence[BlockRow], config: DecisionConfig, *, paired: bool,
                  num_requests: int) -> tuple[RatioInterval, Verdict]:
    interval = ratio_interval(throughputs(base), throughputs(spec), paired=paired,
                              confidence=config.look_confidence(num_requests))
    return interval, verdict(interval, config.margin)


def budget_spent(rows: Sequence[BlockRow], config: DecisionConfig, num_requests: int, blocks: int) -> bool:
    return blocks >= config.max_blocks(num_requests) or sum(r.duration_s for r in rows) >= config.max_seconds_per_level


#: How many times more blocks than the budget allows the noise may ask for before a level stops as hopeless.
HOPELESS = 2.0


def blocks_needed(interval: RatioInterval, margin: float, *, most: int = 1000) -> float:
    """Blocks the level needs to be decided, from the noise of the blocks so far: with N blocks the interval's
    half-width is t(N - 1) times a standard error that shrinks as one over the square root of N, and it must
    come within the distance from the ratio to the nearest edge a verdict needs (1, to show a gain; 1 +
    margin, to rule one out). Infinity past ``most``."""
    half = interval.half_width
    n = min(interval.blocks)
    if half is None or n < 2:
        return float("inf")
    centre, top = math.log(interval.ratio), math.log1p(margin)
    distance = max(centre, top - centre) if centre < top else centre
    if distance <= 1e-9:
        return float("inf")
    q = (1 + interval.confidence) / 2
    se_one = half / t_quantile(q, n - 1) * math.sqrt(n)  # the standard error of a single block
    for blocks in range(n, most + 1):
        if t_quantile(q, blocks - 1) * se_one / math.sqrt(blocks) < distance:
            return float(blocks)
    return float("inf")


def _hopeful(interval: RatioInterval, config: DecisionConfig, num_requests: int) -> bool:
    """The noise so far says the level can be decided within (a little more than) its budget. Asked only once
    half the budget is spent: a few blocks' estimate of the noise (and of the ratio) is too rough to give up on."""
    budget = config.max_blocks(num_requests)
    if min(interval.blocks) < max(config.min_blocks, budget // 2):
        return True
    return math.isfinite(blocks_needed(interval, config.margin, most=int(HOPELESS * budget)))


MoreForPair = Callable[[list[BlockRow], list[BlockRow]], bool]
More = Callable[[list[BlockRow]], bool]


def pair_needs_more(config: DecisionConfig, num_requests: int) -> MoreForPair:
    """Alternate design: another pair of blocks at this level?"""

    def more(base: list[BlockRow], spec: list[BlockRow]) -> bool:
        n = min(len(base), len(spec))
        if n < config.min_blocks:
            return True
        if budget_spent([*base, *spec], config, num_requests, n):
            return False
        interval, v = level_verdict(base, spec, config, paired=True, num_requests=num_requests)
        return v == "undetermined" and _hopeful(interval, config, num_requests)

    return more


def baseline_needs_more(config: DecisionConfig, num_requests: int) -> More:
    """Sequential design, baseline: another block until its throughput is known to ±margin/2."""

    def more(rows: list[BlockRow]) -> bool:
        if len(rows) < config.min_blocks:
            return True
        # The speculative blocks get the rest of the level's time budget.
        if budget_spent(rows, config.model_copy(update={"max_seconds_per_level": config.max_seconds_per_level / 2}),
                         num_requests, len(rows)):
            return False
        logs = [math.log(x) for x in throughputs(rows)]
        mean = sum(logs) / len(logs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
        q = (1 + config.look_confidence(num_requests)) / 2
        return t_quantile(q, len(logs) - 1) * sd / math.sqrt(len(logs)) > config.margin / 2

    return more


def speculative_needs_more(config: DecisionConfig, num_requests: int, base: list[BlockRow]) -> More:
    """Sequential design, speculative: another block until its verdict against ``base`` is decided."""

    def more(spec: list[BlockRow]) -> bool:
        if len(spec) < config.min_blocks:
            return True
        if not base:  # the baseline never reached this level: nothing to decide against
            return False
        if budget_spent([*base, *spec], config, num_requests, len(spec)):
            return False
        interval, v = level_verdict(base, spec, config, paired=False, num_requests=num_requests)
        return v == "undetermined" and _hopeful(interval, config, num_requests)

    return more
