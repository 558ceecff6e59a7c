"""From per-level verdicts to one answer: from which concurrency should speculation be off?

The rule: speculation is kept only where it is shown to pay. A level pays when its interval lies
above 1 (``faster``); it does not when the interval lies below 1 + margin (``slower``, ``no gain``,
or ``equivalent``: within ±margin, where speculation costs work for nothing). A threshold "off from
level t" is supported when every level below it pays (or ties) and every level from it on does not;
t may be the first level (off everywhere: "never") or past the last (on everywhere: "always"). The
earliest supported threshold is the answer: a tie at the boundary is off.

An undetermined level (a gain beyond the margin still possible) could go either way: the answer is
decided only if every way it could go (it pays, or it does not, for each undetermined level) leads
to the same threshold; otherwise it is "undetermined between A and B", naming the levels to measure
next. The projected mean throughput of always on, always off and the answer is given beside it.

A level measured but not answered (every block of a configuration there was set aside as disturbed: the machine
was too busy to measure it) is an undetermined level too: whatever it would have said is still possible, so no
answer is decided across it, and it is among the levels to measure next.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from specsweep.analysis.stats import Verdict

Status = Literal["decided", "undetermined"]
_ON_OK = {"faster", "equivalent"}
_OFF_OK = {"slower", "equivalent", "no gain"}
_MAX_UNDETERMINED = 12  # 2**12 resolutions at most


class LevelVerdict(BaseModel):
    """What the recommendation needs of one level."""

    concurrency: int
    verdict: Verdict
    ratio: float
    baseline_tokens_per_s: float
    speculative_tokens_per_s: float
    batch_mean: float | None = Field(None, description="The running batch the speculative engine reported at this "
                                     "level (its /metrics gauge), mean; None: not measured.")
    batch_max: float | None = Field(None, description="The largest running batch it reported at this level.")


class Recommendation(BaseModel):
    status: Status
    speculation_off_from: int | None = Field(
        description="The concurrency from which to turn speculation off; None: keep it on (it pays or ties everywhere "
        "measured), or the answer is undetermined.")
    reason: str
    off_from_batch: int | None = Field(
        None, description="Decided, off somewhere: the running batch size from which an engine's per-batch setting "
        "turns speculation off: just above the largest batch the engine ran at the last level where it pays, as "
        "measured (a closed loop of C requests runs batches of fewer than C while requests finish and arrive, and an "
        "engine may cap its batch below C).")
    batch_measured: bool = Field(False, description="off_from_batch comes from the running batch the engine "
                                 "reported; False: it was not measured and the batch is taken as the concurrency.")
    between: tuple[int, int | None] | None = Field(
        None, description="Undetermined: the threshold lies from the first to the second level (None: maybe never).")
    measure_next: list[int] = Field(default_factory=list, description="Levels to measure (more) to decide it.")
    unanswered: list[int] = Field(default_factory=list, description="Levels measured but not answered (every block of "
                                  "a configuration there set aside as disturbed): open, and among measure_next.")
    projected_tokens_per_s: dict[str, float] = Field(
        default_factory=dict, description="Mean output tok/s over the measured levels: always_off, always_on and, "
        "when decided, as_recommended.")


def supported_thresholds(verdicts: Sequence[Verdict]) -> list[int]:
    """Indexes t (0..n) such that levels [:t] are faster-or-equivalent and [t:] slower-or-equivalent."""
    n = len(verdicts)
    return [t for t in range(n + 1) if all(v in _ON_OK for v in verdicts[:t]) and all(v in _OFF_OK for v in verdicts[t:])]


def _projection(levels: Sequence[LevelVerdict], t: int) -> float:
    """Mean output tok/s over the answered levels with speculation on below index t and off from it."""
    return statistics.fmean(x for i, lv in enumerate(levels) if not math.isnan(
        x := lv.speculative_tokens_per_s if i < t else lv.baseline_tokens_per_s))


def unanswered_level(concurrency: int) -> LevelVerdict:
    """A level measured but not answered: every block of a configuration there was set aside as disturbed."""
    nan = float("nan")
    return LevelVerdict(concurrency=concurrency, verdict="undetermined", ratio=nan, baseline_tokens_per_s=nan,
                        speculative_tokens_per_s=nan)


def _ratio_words(lv: LevelVerdict) -> str:
    return f"{lv.concurrency} (no block counted)" if math.isnan(lv.ratio) else f"{lv.concurrency} (×{lv.ratio:.2f})"


def _choose(verdicts: Sequence[Verdict]) -> int | str:
    """The threshold index (the earliest supported), or "no-threshold" (verdicts not monotonic)."""
    supported = supported_thresholds(verdicts)
    return supported[0] if supported else "no-threshold"


def _names(levels: Sequence[LevelVerdict], verdict: Verdict) -> list[int]:
    return [lv.concurrency for lv in levels if lv.verdict == verdict]


def _list(cs: Sequence[int]) -> str:
    return ", ".join(str(c) for c in cs)


def _ratios(levels: Sequence[LevelVerdict], cs: Sequence[int]) -> str:
    by = {lv.concurrency: lv for lv in levels}
    return ", ".join(_ratio_words(by[c]) for c in cs)


def recommend(levels: Sequence[LevelVerdict], margin: float, unanswered: Sequence[int] = ()) -> Recommendation:
    """The answer, from the verdicts of the measured levels (in concurrency order) and the levels measured but not
    answered (module docstring)."""
    if not levels:
        reason = (f"no level could be answered: every block at {_list(sorted(unanswered))} was set aside as disturbed"
                  if unanswered else "no level was measured")
        return Recommendation(status="undetermined", speculation_off_from=None, reason=reason,
                              measure_next=sorted(unanswered), unanswered=sorted(unanswered))
    missing = sorted(set(unanswered) - {lv.concurrency for lv in levels})
    rec = _answer(sorted([*levels, *map(unanswered_level, missing)], key=lambda lv: lv.concurrency), margin)
    rec.unanswered = missing
    return rec


def _answer(levels: Sequence[LevelVerdict], margin: float) -> Recommendation:
    cs = [lv.concurrency for lv in levels]
    fixed = {"always_off": _projection(levels, 0), "always_on": _projection(levels, len(levels))}
    verdicts = [lv.verdict for lv in levels]
    open_ = [i for i, v in enumerate(verdicts) if v == "undetermined"]
    if len(open_) > _MAX_UNDETERMINED:
        return Recommendation(status="undetermined", speculation_off_from=None, measure_next=[cs[i] for i in open_],
                              reason=f"{len(open_)} levels are undetermined: measure them with more requests",
                              projected_tokens_per_s=fixed)
    outcomes: set[int | str] = set()
    for resolution in itertools.product(("faster", "no gain"), repeat=len(open_)):
        trial = list(verdicts)
        for i, v in zip(open_, resolution, strict=True):
            trial[i] = v  # type: ignore[call-overload]
        outcomes.add(_choose(trial))
    if len(outcomes) == 1 and isinstance(t := next(iter(outcomes)), int):
        return _decided(levels, t, f"±{margin:.0%}", fixed)
    if "no-threshold" in outcomes and not open_:
        return _no_threshold(levels, fixed)
    return _undetermined(levels, outcomes, open_, fixed)


def _describe(levels: Sequence[LevelVerdict], which: Sequence[LevelVerdict], pct: str) -> str:
    """The verdicts of some levels in words: faster at 1 (×1.20); no gain at 8 (×1.01); within ±3% at 16."""
    words = {"faster": "faster at", "slower": "slower at", "no gain": "no gain beyond the margin at",
             "equivalent": f"within {pct} at"}
    parts = []
    for verdict, prefix in words.items():
        cs = [lv.concurrency for lv in which if lv.verdict == verdict]
        if cs:
            parts.append(f"{prefix} {_ratios(levels, cs) if verdict != 'equivalent' else _list(cs)}")
    return "; ".join(parts)


def _decided(levels: Sequence[LevelVerdict], t: int, pct: str, fixed: dict[str, float]) -> Recommendation:
    cs = [lv.concurrency for lv in levels]
    projected = {**fixed, "as_recommended": _projection(levels, t)}
    on, off = list(levels[:t]), list(levels[t:])
    if t == len(levels):
        reason = (f"Speculation pays at every level measured (up to {cs[-1]}): {_describe(levels, on, pct)}. "
                  "Keep it on.")
        return Recommendation(status="decided", speculation_off_from=None, reason=reason, projected_tokens_per_s=projected)
    if t == 0:
        reason = (f"Speculation does not pay at any level measured: {_describe(levels, off, pct)}. Turn it off.")
        return Recommendation(status="decided", speculation_off_from=cs[0], off_from_batch=1, reason=reason,
                              projected_tokens_per_s=projected)
    reason = (f"Speculation pays up to {cs[t - 1]} concurrent request{'s' if cs[t - 1] > 1 else ''} "
              f"({_describe(levels, on, pct)}) and not from {cs[t]} on ({_describe(levels, off, pct)}): "
              f"turn it off from {cs[t]}.")
    if cs[t] - cs[t - 1] > 1:
        reason += (f" (Levels between {cs[t - 1]} and {cs[t]} were not measured: {cs[t]} is the first measured level "
                   "where it does not pay.)")
    batch, measured, words = switch_batch(levels[t - 1], levels[t])
    return Recommendation(status="decided", speculation_off_from=cs[t], off_from_batch=batch, batch_measured=measured,
                          reason=f"{reason} {words}", projected_tokens_per_s=projected)


def batch_above(concurrency: int, batch_max: float | None) -> int:
    """The first running batch above what the engine ran at a level: the largest it reported, else (not measured)
    the level's concurrency."""
    return (max(1, math.ceil(batch_max - 1e-9)) if batch_max is not None else concurrency) + 1


def switch_batch(last_on: LevelVerdict, first_off: LevelVerdict) -> tuple[int, bool, str]:
    """Where an engine's per-batch setting turns speculation off, keyed on its running batch (what engines
    switch on), not on the client's concurrency: just above the largest batch the engine ran at the last level
    where speculation pays, so that level keeps it. Returns (batch, measured, the words for the report)."""
    b = batch_above(last_on.concurrency, last_on.batch_max)
    if last_on.batch_max is None:
        return b, False, (f"The engine's running batch was not measured (no /metrics gauge), so the batch is taken as "
                          f"the concurrency: an engine's per-batch setting turns speculation off from a batch of {b}.")
    words = (f"In batch sizes, as engines switch: the engine ran batches of up to {last_on.batch_max:g} at "
             f"{last_on.concurrency} (mean {last_on.batch_mean or 0:.1f}) and of {first_off.batch_mean or 0:.1f} on "
             f"average at {first_off.concurrency}: an engine's per-batch setting turns speculation off from a running "
             f"batch of {b}.")
    if first_off.batch_max is not None and first_off.batch_max < b:
        words += (f" The engine never ran a batch of {b} at {first_off.concurrency} (at most {first_off.batch_max:g}): "
                  "the per-batch setting cannot tell these levels apart (the engine caps its batch, or requests wait "
                  "outside it); a router that counts requests in flight can.")
    return b, True, words


def _no_threshold(levels: Sequence[LevelVerdict], fixed: dict[str, float]) -> Recommendation:
    cs = [lv.concurrency for lv in levels]
    verdicts = [lv.verdict for lv in levels]
    # The levels that break the order: one where it does not pay below one where it does, and that one.
    off = {"slower", "no gain"}
    involved = sorted({cs[i] for i, v in enumerate(verdicts) if v in off and "faster" in verdicts[i + 1:]}
                      | {cs[j] for j, v in enumerate(verdicts) if v == "faster" and off & set(verdicts[:j])})
    faster = _names(levels, "faster")
    below = [c for c in cs if c in involved and c not in faster]
    return Recommendation(
        status="undetermined", speculation_off_from=None, measure_next=involved, projected_tokens_per_s=fixed,
        reason=f"no single threshold fits: speculation pays at {_list(faster)} but not at {_list(below)}, below "
               f"a level where it pays. Real crossovers are monotonic; measure {_list(involved)} again with more "
               "requests")


def _undetermined(levels: Sequence[LevelVerdict], outcomes: set[int | str], open_: list[int],
                  fixed: dict[str, float]) -> Recommendation:
    cs = [lv.concurrency for lv in levels]
    n = len(levels)
    thresholds = sorted(o for o in outcomes if isinstance(o, int))
    offs = [cs[t] for t in thresholds if t < n]
    never = n in thresholds
    options = [f"off from {c}" for c in offs] + (["on at every level measured"] if never else [])
    if any(isinstance(o, str) for o in outcomes):
        options.append("no single threshold")
    lo = thresholds[0] if thresholds else 0
    hi = thresholds[-1] if thresholds else n
    if len(offs) + never >= 2:
        between: tuple[int, int | None] | None = (offs[0], None if never else offs[-1])
        head = (f"undetermined between {offs[0]} and {offs[-1]}" if not never else
                f"undetermined between off from {offs[0]} and on at every level measured" if len(offs) == 1 else
                f"undetermined between {offs[0]} and beyond {cs[-1]}")
    else:
        between, head = None, "undetermined"
    # A level with no block counted is measured again whatever the range: nothing is known of it.
    again = [cs[i] for i in open_ if math.isnan(levels[i].ratio)]
    more = sorted({cs[i] for i in open_ if max(0, lo - 1) <= i <= min(n - 1, hi)} or {cs[i] for i in open_})
    more = [c for c in more if c not in again]
    # Unmeasured concurrencies inside the range are worth a look too (the midpoint of each gap).
    gaps = [(cs[i] + cs[i + 1]) // 2 for i in range(max(0, lo - 1), min(n - 1, hi)) if cs[i + 1] - cs[i] > 1]
    ratios = ", ".join(_ratio_words(lv) for lv in levels if lv.verdict == "undetermined")
    advice = [f"measure {_list(more)} with more requests (a larger decision budget)"] if more else []
    advice += [f"measure {_list(again)} again, where every block was set aside as disturbed"] if again else []
    advice += [f"also {_list(gaps)}"] if gaps else []
    said = "; ".join(advice)
    reason = (f"{head}: the verdict at {ratios} could go either way, and depending on it speculation should be "
              f"{' or '.join(options)}. {said[:1].upper()}{said[1:]}.")
    return Recommendation(status="undetermined", speculation_off_from=None, between=between,
                          measure_next=sorted({*more, *again, *gaps}), reason=reason, projected_tokens_per_s=fixed)
