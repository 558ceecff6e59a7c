"""From per-level verdicts to one answer: from which concurrency should speculation be off?

A threshold "off from level t" is supported by the verdicts when every level below it is
faster or equivalent and every level from it on is slower or equivalent (t may be the first
level: off everywhere; or past the last: never off). Among the supported thresholds the
earliest is taken whose projected throughput (speculation on below t, off from t, at the
measured levels) is not below always on or always off: speculation that ties costs work
for nothing, and no advice may lose to a fixed choice on its own numbers. Where no level is
slower (it pays or ties everywhere measured), speculation stays on.

An undetermined level could go either way: the answer is decided only if every way it could
go (faster or slower, for each undetermined level) leads to the same threshold; otherwise
it is "undetermined between A and B", naming the levels to measure next.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from specsweep.analysis.stats import Verdict

Status = Literal["decided", "undetermined"]
_ON_OK = {"faster", "equivalent"}
_OFF_OK = {"slower", "equivalent"}
_MAX_UNDETERMINED = 12  # 2**12 resolutions at most


class LevelVerdict(BaseModel):
    """What the recommendation needs of one level."""

    concurrency: int
    verdict: Verdict
    ratio: float
    baseline_tokens_per_s: float
    speculative_tokens_per_s: float


class Recommendation(BaseModel):
    status: Status
    speculation_off_from: int | None = Field(
        description="The concurrency from which to turn speculation off; None: keep it on (it pays or ties everywhere "
        "measured), or the answer is undetermined.")
    reason: str
    between: tuple[int, int | None] | None = Field(
        None, description="Undetermined: the threshold lies from the first to the second level (None: maybe never).")
    measure_next: list[int] = Field(default_factory=list, description="Levels to measure (more) to decide it.")
    projected_tokens_per_s: dict[str, float] = Field(
        default_factory=dict, description="Mean output tok/s over the measured levels: always_off, always_on and, "
        "when decided, as_recommended.")


def supported_thresholds(verdicts: Sequence[Verdict]) -> list[int]:
    """Indexes t (0..n) such that levels [:t] are faster-or-equivalent and [t:] slower-or-equivalent."""
    n = len(verdicts)
    return [t for t in range(n + 1) if all(v in _ON_OK for v in verdicts[:t]) and all(v in _OFF_OK for v in verdicts[t:])]


def _projection(levels: Sequence[LevelVerdict], t: int) -> float:
    return statistics.fmean(lv.speculative_tokens_per_s if i < t else lv.baseline_tokens_per_s
                            for i, lv in enumerate(levels))


def _choose(levels: Sequence[LevelVerdict], verdicts: Sequence[Verdict], *, project: bool = True) -> int | str:
    """The threshold index, or "no-threshold" (verdicts not monotonic) / "loses" (no supported threshold
    projects at least always on and always off). ``project``: check the projection (not for a
    hypothetical resolution of undetermined levels, whose measured ratios say neither)."""
    supported = supported_thresholds(verdicts)
    if not supported:
        return "no-threshold"
    if "slower" not in verdicts:
        return len(levels)  # pays or ties everywhere: keep it on
    if not project:
        return supported[0]
    best_fixed = max(_projection(levels, 0), _projection(levels, len(levels)))
    for t in supported:
        if _projection(levels, t) >= best_fixed * (1 - 1e-9):
            return t
    return "loses"


def _names(levels: Sequence[LevelVerdict], verdict: Verdict) -> list[int]:
    return [lv.concurrency for lv in levels if lv.verdict == verdict]


def _list(cs: Sequence[int]) -> str:
    return ", ".join(str(c) for c in cs)


def _ratios(levels: Sequence[LevelVerdict], cs: Sequence[int]) -> str:
    by = {lv.concurrency: lv.ratio for lv in levels}
    return ", ".join(f"{c} (×{by[c]:.2f})" for c in cs)


def recommend(levels: Sequence[LevelVerdict], margin: float) -> Recommendation:
    """The answer, from the verdicts of the measured levels (in concurrency order)."""
    if not levels:
        return Recommendation(status="undetermined", speculation_off_from=None, reason="no level was measured")
    cs = [lv.concurrency for lv in levels]
    fixed = {"always_off": _projection(levels, 0), "always_on": _projection(levels, len(levels))}
    verdicts = [lv.verdict for lv in levels]
    open_ = [i for i, v in enumerate(verdicts) if v == "undetermined"]
    if len(open_) > _MAX_UNDETERMINED:
        return Recommendation(status="undetermined", speculation_off_from=None, measure_next=[cs[i] for i in open_],
                              reason=f"{len(open_)} levels are undetermined: measure them with more requests",
                              projected_tokens_per_s=fixed)
    outcomes: set[int | str] = set()
    for resolution in itertools.product(("faster", "slower"), repeat=len(open_)):
        trial = list(verdicts)
        for i, v in zip(open_, resolution, strict=True):
            trial[i] = v  # type: ignore[call-overload]
        outcomes.add(_choose(levels, trial, project=not open_))
    pct = f"±{margin:.0%}"
    if open_ and len(outcomes) == 1 and isinstance(t := next(iter(outcomes)), int):
        # Every way the open levels could go gives this threshold: check it on the measured numbers.
        outcomes = {t if t == len(levels) or _projection(levels, t) >= max(fixed.values()) * (1 - 1e-9) else "loses"}
    if len(outcomes) == 1 and isinstance(t := next(iter(outcomes)), int):
        return _decided(levels, t, pct, fixed)
    if "no-threshold" in outcomes and not open_:
        return _no_threshold(levels, fixed)
    if outcomes == {"loses"}:
        ties = [c for c in _names(levels, "equivalent")]
        return Recommendation(
            status="undetermined", speculation_off_from=None, measure_next=ties, projected_tokens_per_s=fixed,
            reason=f"the verdicts allow turning speculation off, but the levels within {pct} ({_list(ties)}) lean "
                   "towards speculation enough that doing so would project less throughput than a fixed choice: "
                   "measure them with more requests to narrow them")
    return _undetermined(levels, outcomes, open_, fixed)


def _decided(levels: Sequence[LevelVerdict], t: int, pct: str, fixed: dict[str, float]) -> Recommendation:
    cs = [lv.concurrency for lv in levels]
    faster, slower, ties = _names(levels, "faster"), _names(levels, "slower"), _names(levels, "equivalent")
    projected = {**fixed, "as_recommended": _projection(levels, t)}
    tie_words = f"; within {pct} at {_list(ties)}" if ties else ""
    if t == len(levels):
        if faster:
            reason = (f"Speculation pays at {_ratios(levels, faster)} concurrent requests and costs nothing at any "
                      f"level measured (up to {cs[-1]}){tie_words}: keep it on.")
        else:
            reason = (f"Speculation makes no difference beyond {pct} at any level measured ({_list(cs)}): it neither "
                      "pays nor costs throughput here.")
        return Recommendation(status="decided", speculation_off_from=None, reason=reason, projected_tokens_per_s=projected)
    if t == 0:
        reason = f"Speculation does not pay at any level measured: slower at {_ratios(levels, slower)}{tie_words}. Turn it off."
        return Recommendation(status="decided", speculation_off_from=cs[0], reason=reason, projected_tokens_per_s=projected)
    on_ties = [c for c in ties if c < cs[t]]
    off_ties = [c for c in ties if c >= cs[t]]
    pays = f"faster at {_ratios(levels, faster)}" if faster else f"within {pct}"
    reason = (f"Speculation pays up to {cs[t - 1]} concurrent request{'s' if cs[t - 1] > 1 else ''} ({pays}"
              f"{f'; within {pct} at {_list(on_ties)}' if on_ties and faster else ''}) and not from {cs[t]} on "
              f"({f'slower at {_ratios(levels, slower)}' if slower else f'within {pct}'}"
              f"{f'; within {pct} at {_list(off_ties)}' if off_ties and slower else ''}): turn it off from {cs[t]}.")
    if cs[t] - cs[t - 1] > 1:
        reason += f" (Levels between {cs[t - 1]} and {cs[t]} were not measured: {cs[t]} is the first measured level "
        reason += "where it does not pay.)"
    return Recommendation(status="decided", speculation_off_from=cs[t], reason=reason, projected_tokens_per_s=projected)


def _no_threshold(levels: Sequence[LevelVerdict], fixed: dict[str, float]) -> Recommendation:
    cs = [lv.concurrency for lv in levels]
    verdicts = [lv.verdict for lv in levels]
    # The levels that break the order: a slower one below a faster one, and that faster one.
    involved = sorted({cs[i] for i, v in enumerate(verdicts) if v == "slower" and "faster" in verdicts[i + 1:]}
                      | {cs[j] for j, v in enumerate(verdicts) if v == "faster" and "slower" in verdicts[:j]})
    faster, slower = _names(levels, "faster"), _names(levels, "slower")
    return Recommendation(
        status="undetermined", speculation_off_from=None, measure_next=involved, projected_tokens_per_s=fixed,
        reason=f"no single threshold fits: speculation is faster at {_list(faster)} but slower at {_list(slower)}, "
               "and a slower level lies below a faster one. Real crossovers are monotonic; measure "
               f"{_list(involved)} again with more requests")


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
        head = f"undetermined between {offs[0]} and {'beyond ' + str(cs[-1]) if never else offs[-1]}"
    else:
        between, head = None, "undetermined"
    next_levels = sorted({cs[i] for i in open_ if max(0, lo - 1) <= i <= min(n - 1, hi)} or {cs[i] for i in open_})
    # Unmeasured concurrencies inside the range are worth a look too (the midpoint of each gap).
    gaps = [(cs[i] + cs[i + 1]) // 2 for i in range(max(0, lo - 1), min(n - 1, hi)) if cs[i + 1] - cs[i] > 1]
    ratios = ", ".join(f"{lv.concurrency} (×{lv.ratio:.2f})" for lv in levels if lv.verdict == "undetermined")
    reason = (f"{head}: the verdict at {ratios} could go either way, and depending on it speculation should be "
              f"{' or '.join(options)}. Measure {_list(next_levels)} with more requests (a larger decision budget)"
              + (f", and also {_list(gaps)}" if gaps else "") + ".")
    return Recommendation(status="undetermined", speculation_off_from=None, between=between,
                          measure_next=sorted(set(next_levels) | set(gaps)), reason=reason, projected_tokens_per_s=fixed)
