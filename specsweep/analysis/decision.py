"""When a comparison has measured a level enough: the decision settings, the error control of the answer as
a whole, and the rules that ask for another block.

Error control. The answer as a whole (the setting and its bound, every level's verdict, every category's) is
wrong with probability at most ``alpha``: every interval it rests on is held at a confidence such that all of
them hold together. ``LEVELS_SHARE`` of alpha goes to the levels' intervals, the rest to the per-category
ones; each share is split evenly over the levels (and categories) by Bonferroni. Within a level, a level may
stop after any round from ``min_blocks`` to its budget, so each of those rounds is a look: the paired
intervals' per-look confidence is set so that all the looks hold together, exactly
(``stats.sequential_confidence``: the rounds' signs about the median are fair coin flips whatever the noise);
the unpaired ones (sequential design) are Bonferroni over the looks.

A comparison measures each level in blocks (``sweep.num_requests`` requests each) until the level is settled
for the setting: its interval shows that one of the two fixed policies costs at most the margin there
(speculation: low >= 1 - margin; baseline: high <= 1 / (1 - margin)), so that the least worst-case loss
(``specsweep.analysis.recommend``) can come within the margin; or until its budget is spent:

- alternate design: baseline and speculative blocks taken in turn (ABBA order), paired;
- sequential design: all baseline levels first, each until its own throughput is known to
  ±margin/2, then the speculative levels, each until it is settled against the baseline's blocks.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specsweep.analysis.slo import SLO
from specsweep.analysis.stats import (
    RatioInterval,
    Verdict,
    min_rounds,
    ratio_interval,
    sequential_confidence,
    t_quantile,
    verdict,
)
from specsweep.records import BlockRow

Design = Literal["sequential", "alternate"]
Alternation = Literal["side-by-side", "restart"]

#: The share of alpha the levels' intervals get; the per-category intervals share the rest.
LEVELS_SHARE = 0.8


class DecisionConfig(BaseModel):
    """How a comparison decides: the margin, the error rate of the answer, the budget, the design."""

    model_config = ConfigDict(extra="forbid")

    margin: float = Field(0.05, gt=0, lt=0.5, description="The loss a setting may carry and still be decided "
                          "(0.05: it gives up at most 5 % of the better fixed policy's throughput at any level, "
                          "worst case); ratios within ±margin count as equivalent.")
    alpha: float = Field(0.05, gt=0, le=0.5, description="The error rate of the answer as a whole: the setting's "
                         "bound and every verdict hold together with probability at least 1 - alpha (over levels, "
                         "looks and categories).")
    min_blocks: int = Field(4, ge=2, le=100, description="Blocks per configuration at least, before a level may stop "
                            "(a level's spread is judged from these; its interval needs more to be bounded).")
    max_requests_per_level: int = Field(
        384, ge=2, le=1_000_000,
        description="Budget: measured requests per configuration at one level (blocks of sweep.num_requests). The "
        "distribution-free intervals need rounds: at 4 levels and alpha 0.05, 9 rounds or more bound one at all.")
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
    fail_on_drift: bool = Field(
        False, description="Fail the run's last stage (red in the UI, its notifications fire) when its answer drifted "
        "from the last comparison of the same kind in the results' history (the nightly deployments set it).")
    budget_minutes: float | None = Field(
        None, gt=0, le=7 * 24 * 60, description="The run's time budget: a comparison found by search (sweep.search) "
        "stops before a round would pass it (one block over at most), and the plan at its start says what it buys.")
    verify: bool = Field(
        False, description="After a decided answer, start the engine with the recommended per-batch setting and "
        "measure it at the same levels in turn with always-on and always-off (specsweep.analysis.verify).")
    verify_controller: bool | None = Field(
        None, description="With verify: also measure the engine's own speculation controller as a fourth arm (adaptive "
        "tiers, adaptive verification: the engine's docs in docs/engines.md) and say per level whether the measured "
        "schedule beats, "
        "matches or loses to it. None: where the engine has one; false: never; true: refused where it has none.")
    controller_config: dict[str, Any] | None = Field(
        None, description="The engine's own controller's config for that arm, in the engine's own keys (the file its "
        "adaptive flag loads, e.g. candidate_steps and ema_alpha; or keys merged into its speculative config, e.g. "
        "num_speculative_tokens_per_batch_size). None: the engine's defaults.")

    @model_validator(mode="before")
    @classmethod
    def _old_confidence(cls, data: object) -> object:
        """Decision settings stored before alpha replaced confidence (runs in a results store) still read."""
        if isinstance(data, dict) and "confidence" in data:
            data = dict(data)
            data.setdefault("alpha", round(1.0 - float(data.pop("confidence")), 6))
        return data

    def max_blocks(self, num_requests: int) -> int:
        return max(self.min_blocks, self.max_requests_per_level // max(1, num_requests))

    def interval_confidence(self, num_requests: int, levels: int = 1, categories: int = 0,
                            paired: bool = True) -> float:
        """The confidence of each interval, so that all of them hold together at 1 - alpha (module docstring):
        ``levels`` levels (``categories`` categories at each, for a category's interval; 0: a level's own)."""
        return _interval_confidence(self.alpha, self.min_blocks, self.max_blocks(num_requests), max(1, levels),
                                    categories, paired)

    def look_confidence(self, num_requests: int, comparisons: int = 1) -> float:
        """The confidence of one of the verify stage's intervals at a level: its levels' share of alpha split by
        Bonferroni over the ``comparisons`` each level makes (the schedule against the better fixed policy, and
        against the engine's own controller where that arm runs); each level's looks held together exactly."""
        return self.interval_confidence(num_requests, levels=comparisons)


@functools.lru_cache(maxsize=4096)
def _interval_confidence(alpha: float, min_blocks: int, top: int, levels: int, categories: int, paired: bool) -> float:
    share = alpha * (LEVELS_SHARE if categories == 0 else (1.0 - LEVELS_SHARE) / categories)
    each = share / levels
    every = top - min_blocks + 1
    if not paired:
        return 1.0 - each / every
    return sequential_confidence(each, min_blocks, top)


def throughputs(rows: Sequence[BlockRow]) -> list[float]:
    """Steady output tokens/s of each block (a block that produced nothing counts as a tiny positive number)."""
    return [max(r.throughput, 1e-9) for r in rows]


def level_verdict(base: Sequence[BlockRow], spec: Sequence[BlockRow], config: DecisionConfig, *, paired: bool,
                  num_requests: int, levels: int = 1) -> tuple[RatioInterval, Verdict]:
    """A level's interval (at the confidence that holds over ``levels`` levels and their looks) and verdict."""
    interval = ratio_interval(throughputs(base), throughputs(spec), paired=paired,
                              confidence=config.interval_confidence(num_requests, levels, paired=paired))
    return interval, verdict(interval, config.margin)


def losses(interval: RatioInterval) -> tuple[float, float]:
    """The throughput each fixed policy may give up at a level against the better one, worst case over the
    interval: (speculation on: 1 - low; off: 1 - 1/high), 0 at best; infinite where the interval is unbounded."""
    if interval.low is None or interval.high is None:
        return math.inf, math.inf
    return max(0.0, 1.0 - interval.low), max(0.0, 1.0 - 1.0 / interval.high)


def settled(interval: RatioInterval, margin: float) -> bool:
    """One of the two fixed policies costs at most ``margin`` at this level, worst case."""
    return min(losses(interval)) <= margin


def budget_spent(rows: Sequence[BlockRow], config: DecisionConfig, num_requests: int, blocks: int) -> bool:
    return blocks >= config.max_blocks(num_requests) or sum(r.duration_s for r in rows) >= config.max_seconds_per_level


#: How many times more blocks than the budget allows the noise may ask for before a level stops as hopeless.
HOPELESS = 2.0


def blocks_needed(interval: RatioInterval, margin: float, *, most: int = 1000) -> float:
    """Rounds (blocks of each configuration) in all that the level needs to be settled, from the spread of its
    rounds so far: the median's distribution-free interval is about z x 1.25 x spread / sqrt(rounds) wide each
    way (z: the normal quantile of its confidence; 1.25: the median's cost against the mean under normal noise),
    and it must come within |log ratio| - log(1 - margin) (then one fixed policy's worst-case loss is within
    the margin). At least the rounds that bound it at all. Infinity past ``most``."""
    n = min(interval.blocks)
    if interval.low is not None and interval.high is not None and settled(interval, margin):
        return float(n)
    floor = float(max(n + 1, min_rounds(interval.confidence)))
    if interval.spread is None:
        return floor
    need = abs(math.log(interval.ratio)) - math.log1p(-margin)
    z = statistics.NormalDist().inv_cdf(1.0 - (1.0 - interval.confidence) / 2.0)
    blocks = max(floor, math.ceil((z * 1.2533 * interval.spread / need) ** 2))
    return float(blocks) if blocks <= most else float("inf")


def _hopeful(interval: RatioInterval, config: DecisionConfig, num_requests: int) -> bool:
    """The spread so far says the level can be settled within (a little more than) its budget. Asked only once
    half the budget is spent: a few blocks' estimate of the spread (and of the ratio) is too rough to give up on."""
    budget = config.max_blocks(num_requests)
    if min(interval.blocks) < max(config.min_blocks, budget // 2):
        return True
    return math.isfinite(blocks_needed(interval, config.margin, most=int(HOPELESS * budget)))


MoreForPair = Callable[[list[BlockRow], list[BlockRow]], bool]
More = Callable[[list[BlockRow]], bool]


def pair_needs_more(config: DecisionConfig, num_requests: int, levels: int = 1) -> MoreForPair:
    """Alternate design: another pair of blocks at this level (one of ``levels``)? Until it is settled."""

    def more(base: list[BlockRow], spec: list[BlockRow]) -> bool:
        n = min(len(base), len(spec))
        if n < config.min_blocks:
            return True
        if budget_spent([*base, *spec], config, num_requests, n):
            return False
        interval, _ = level_verdict(base, spec, config, paired=True, num_requests=num_requests, levels=levels)
        return not settled(interval, config.margin) and _hopeful(interval, config, num_requests)

    return more


def unpaired_floor(config: DecisionConfig, num_requests: int, levels: int) -> int:
    """Sequential design: the blocks each configuration needs at a level before the unpaired interval can be
    bounded at all (m against m blocks: 2 / C(2m, m) at most 1 - confidence), within the budget."""
    tail = 1.0 - config.interval_confidence(num_requests, levels, paired=False)
    m = 2
    while 2.0 / math.comb(2 * m, m) > tail:
        m += 1
    return min(max(config.min_blocks, m), config.max_blocks(num_requests))


def baseline_needs_more(config: DecisionConfig, num_requests: int, levels: int = 1) -> More:
    """Sequential design, baseline: another block until its throughput is known to ±margin/2, and it has the
    blocks an unpaired interval needs (``unpaired_floor``)."""
    floor = unpaired_floor(config, num_requests, levels)

    def more(rows: list[BlockRow]) -> bool:
        if len(rows) < floor:
            return True
        # The speculative blocks get the rest of the level's time budget.
        if budget_spent(rows, config.model_copy(update={"max_seconds_per_level": config.max_seconds_per_level / 2}),
                         num_requests, len(rows)):
            return False
        logs = [math.log(x) for x in throughputs(rows)]
        mean = sum(logs) / len(logs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
        q = (1 + config.interval_confidence(num_requests, paired=False)) / 2
        return t_quantile(q, len(logs) - 1) * sd / math.sqrt(len(logs)) > config.margin / 2

    return more


def speculative_needs_more(config: DecisionConfig, num_requests: int, base: list[BlockRow], levels: int = 1) -> More:
    """Sequential design, speculative: another block until it is settled against ``base``."""
    floor = unpaired_floor(config, num_requests, levels)

    def more(spec: list[BlockRow]) -> bool:
        if len(spec) < floor:
            return True
        if not base:  # the baseline never reached this level: nothing to decide against
            return False
        if budget_spent([*base, *spec], config, num_requests, len(spec)):
            return False
        interval, _ = level_verdict(base, spec, config, paired=False, num_requests=num_requests, levels=levels)
        return not settled(interval, config.margin) and _hopeful(interval, config, num_requests)

    return more
