"""The crossover found by search instead of a grid: which level to measure next, or whether to stop.

A search over concurrency [low, high] measures the two ends, then takes one step at a time (``next_step``):

1. a level measured fewer than ``STEER_ROUNDS`` rounds gets a round (whether speculation is ahead there is not
   known yet);
2. where the verdicts change between two adjacent measured levels a and b (speculation ahead at one, behind at the
   other, by the levels' estimates so far) further apart than ``BRACKET`` (and more than one apart), the
   geometric midpoint of a and b is measured next: published crossovers fall between powers of two, and a level
   measured there halves the bracket. Within a time budget, only while what is left of it also pays for bounding
   the bracket the new level makes (``bounded_rounds`` at it and at the nearer end): a bracket bounded at 4 and 8
   is an answer with a bound, a bracket of 5 and 6 whose intervals are not bounded is none;
3. each level the answer rests on (``rests_on``) gets rounds until its interval is bounded at all
   (``bounded_rounds``: the distribution-free interval needs that many at the confidence it is held at);
4. else, while the setting's worst-case loss is beyond the margin, the next round goes where that loss lies (the
   level whose interval bounds it), as long as the level's budget and the spread so far say it can be settled;
   then to the next such level;
5. else it stops: settled (the loss within the margin, the threshold bracketed), or nothing more can shrink the
   bound within the levels' budgets.

Bisection assumes what published shapes show: speculation's gain falls as load grows, crossing once. Under that
assumption the answer rests on the two levels around the crossing (``rests_on``): a level below the last one where
speculation is ahead gains at least as much, one above the first where it is behind loses at least as much, so
the bound at those two covers the others, which are measured only to steer (``STEER_ROUNDS`` rounds). Where the
levels' estimates do not fall in that order, the assumption is not taken and the answer rests on every level.

The run's time budget is the loop's (``specsweep.designs.search``): a round whose cost would pass it is not
started. Every interval is held at the confidence of ``max_levels`` levels (the most a search over the range may
measure), so the answer's error control is the grid's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.stats import min_rounds

if TYPE_CHECKING:  # compare asks this module how many levels a search may measure
    from specsweep.analysis.compare import Comparison

#: Adjacent measured levels across the threshold closer than this factor need no level between them.
BRACKET = 1.5
#: Rounds a level gets before whether speculation is ahead there steers the search.
STEER_ROUNDS = 3


def rests_on(ratios: Mapping[int, float]) -> set[int]:
    """The levels a search's answer rests on (module docstring), from each measured level's ratio estimate: the
    last level where speculation is ahead and the first where it is behind, when every level ahead lies below
    every level behind; every level otherwise."""
    ahead = sorted(c for c, r in ratios.items() if r > 1.0)
    behind = sorted(c for c, r in ratios.items() if r <= 1.0)
    if ahead and behind and ahead[-1] > behind[0]:
        return set(ratios)  # not the one crossing bisection assumes
    return {c for c in (ahead[-1:] + behind[:1])}


def midpoint(a: int, b: int) -> int | None:
    """The geometric midpoint of a < b as a whole number strictly between them; None when there is none."""
    if b - a < 2:
        return None
    return min(b - 1, max(a + 1, round(math.sqrt(a * b))))


def bracketed(a: int, b: int) -> bool:
    """Whether a threshold between measured levels a < b is known closely enough."""
    return b / a <= BRACKET or midpoint(a, b) is None


@functools.lru_cache(maxsize=1024)
def _depth(a: int, b: int) -> int:
    if bracketed(a, b):
        return 0
    m = midpoint(a, b)
    assert m is not None
    return 1 + max(_depth(a, m), _depth(m, b))


def max_levels(low: int, high: int) -> int:
    """The most levels a search over [low, high] measures: the two ends and one bisection at a time until the
    threshold's bracket is within ``BRACKET``, whichever way each goes (the deepest path), and one more for a
    threshold that moves to another bracket while the rounds come in. The intervals' confidence is split over
    this many, and a search never measures more (``next_step``), so the answer's error control holds whatever it
    visits."""
    return 2 + _depth(low, high) + 1


@dataclass(frozen=True)
class Step:
    kind: Literal["round", "level", "stop"]
    concurrency: int | None
    why: str


def bounded_rounds(decision: DecisionConfig, num_requests: int, most_levels: int) -> int:
    """The rounds a level needs before its interval is bounded at all, at the confidence a search's intervals are
    held at (never fewer than ``decision.min_blocks``, never more than a level's budget)."""
    need = min_rounds(decision.interval_confidence(num_requests, levels=most_levels))
    return min(max(decision.min_blocks, need), decision.max_blocks(num_requests))


def next_step(comp: Comparison | None, rounds: Mapping[int, int], decision: DecisionConfig,
              num_requests: int, most_levels: int, closed: Collection[int] = (), *,
              remaining_s: float | None = None, round_s: Mapping[int, float] | None = None) -> Step:
    """What the search measures next (module docstring). ``comp``: the comparison of what is measured so far
    (None before any level has the rounds for one); ``rounds``: the rounds that count at each level it has taken up;
    ``most_levels``: the levels the intervals' confidence was split over (``max_levels``), never passed;
    ``closed``: levels that take no more rounds (every round set aside as often as allowed, or their time spent);
    ``remaining_s``: what is left of the time budget (None: no budget), with ``round_s``, the seconds a round
    took at each level measured so far."""
    for c in sorted(rounds, key=lambda c: (rounds[c], c)):  # the fewest rounds first: both ends early
        if rounds[c] < STEER_ROUNDS and c not in closed:
            return Step("round", c, f"C={c} has {rounds[c]} of the {STEER_ROUNDS} rounds that say whether speculation "
                        "is ahead there")
    if comp is None:
        return Step("stop", None, "nothing could be compared")
    rec = comp.recommendation
    ahead = {int(lv.concurrency): lv.ratio > 1.0 for lv in comp.levels if not math.isnan(lv.ratio)}  # concurrency
    measured = sorted(ahead)
    bounded = bounded_rounds(decision, num_requests, most_levels)
    costs = dict(round_s or {})

    def cost(c: int) -> float:
        """A round's seconds at c: as measured there, else as at the nearest level above it (rounds cost more as
        the load grows), else the dearest measured."""
        if c in costs:
            return costs[c]
        above = [x for x in sorted(costs) if x > c]
        return costs[above[0]] if above else max(costs.values(), default=0.0)

    def owed(c: int) -> float:
        return max(0, bounded - rounds.get(c, 0)) * cost(c) if c not in closed else 0.0

    for a, b in zip(measured, measured[1:], strict=False):
        if ahead[a] != ahead[b] and not bracketed(a, b) and (m := midpoint(a, b)) is not None \
                and m not in rounds and len(rounds) < most_levels:
            if remaining_s is not None and bounded * cost(m) + max(owed(a), owed(b)) > remaining_s:
                break  # what is left pays for bounding the bracket there is, not a narrower one
            return Step("level", m, f"the verdicts change between {a} and {b}: {m} is measured next")
    for c in sorted(rests_on({int(lv.concurrency): lv.ratio for lv in comp.levels if not math.isnan(lv.ratio)}),
                    key=lambda c: (rounds.get(c, 0), c)):
        if rounds.get(c, 0) < bounded and c not in closed:
            return Step("round", c, f"C={c}, which the answer rests on, has {rounds.get(c, 0)} of the "
                        f"{bounded} rounds that bound its interval")
    if rec.worst_case_loss is not None and rec.worst_case_loss <= decision.margin:
        return Step("stop", None, f"settled: the worst-case loss is within the margin ({decision.margin:.0%})")
    budget = decision.max_blocks(num_requests)
    by_c = {int(lv.concurrency): lv for lv in comp.levels}
    worst = int(rec.worst_case_level) if rec.worst_case_level is not None else None
    order = ([worst] if worst is not None else []) + [int(c) for c in rec.measure_next if c != worst]
    for c in order:
        lv = by_c.get(c)
        if lv is None or rounds.get(c, 0) >= budget or c in closed:
            continue
        need = lv.rounds_to_settle
        if need is None or need <= 2 * budget:  # hopeless beyond twice the level's budget
            return Step("round", c, f"the bound lies at C={c}: another round there")
    return Step("stop", None, "no level's budget can shrink the bound further")
