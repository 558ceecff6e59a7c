"""From per-level intervals to one setting, from every run: from which concurrency should speculation be off?

The policies: "off from t" (speculation on below the measured level t, off from it), "keep it on", "turn it
off". At a level, the loss of a policy is the throughput it may give up there against the better of the two
fixed policies, worst case over the level's simultaneous interval [low, high] of speculative / baseline:

    speculation on there:  max(0, 1 - low)       (the ratio may be as low as ``low``)
    off there:             max(0, 1 - 1 / high)  (speculation may be ``high`` times as fast)

and its worst-case loss is the largest over the levels. The setting is the policy with the least worst-case
loss (ties broken by the next-largest loss, then by the throughput the point estimates project, then the
earlier threshold). Because every interval holds together with probability at least 1 - alpha
(``DecisionConfig.interval_confidence``), the setting's true loss is within its stated bound with that
probability too, whatever the verdicts say. ``status`` is "decided" when the bound is within the margin; else
"best available", with the level where the bound lies and the measurement that would shrink it there (rounds,
and minutes from the level's measured rounds). An unbounded interval (too few rounds) or a level with no
block counted (every block set aside as disturbed) leaves every policy's bound unbounded there: the setting
is still given, from the other levels and the point estimates.

Each level's verdict (``stats.verdict``: faster, slower, equivalent, no gain, undetermined) is reported beside
it, under the same error control; the setting does not wait for them: a level where both policies give the
same throughput costs nothing whichever side of it the threshold falls.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from specsweep.analysis.stats import Verdict

Status = Literal["decided", "best available", "refuted"]


class LevelVerdict(BaseModel):
    """What the recommendation needs of one level."""

    concurrency: int | float = Field(description="The level: requests in flight, or requests a second (a float) in a "
                                     "request-rate comparison.")
    verdict: Verdict
    ratio: float
    baseline_tokens_per_s: float
    speculative_tokens_per_s: float
    low: float | None = Field(None, description="The ratio's simultaneous interval (None: unbounded).")
    high: float | None = None
    rounds: int = Field(0, description="Rounds (blocks of each configuration) that count at this level.")
    round_seconds: float | None = Field(None, description="Measured seconds of one round (both configurations), "
                                        "mean: what another round costs.")
    rounds_to_settle: float | None = Field(None, description="Rounds in all that would settle the level (one "
                                           "policy within the margin there), estimated from its spread so far.")
    max_rounds: int | None = Field(None, description="The rounds the run allowed a level (decision."
                                   "max_requests_per_level); None: not known.")
    batch_mean: float | None = Field(None, description="The running batch the speculative engine reported at this "
                                     "level (its /metrics gauge), mean; None: not measured.")
    batch_max: float | None = Field(None, description="The largest running batch it reported at this level.")

    def losses(self) -> tuple[float, float]:
        """(speculation on, off): the throughput each may give up here, worst case (inf: unbounded)."""
        if self.low is None or self.high is None or math.isnan(self.ratio):
            return math.inf, math.inf
        return max(0.0, 1.0 - self.low), max(0.0, 1.0 - 1.0 / self.high)


class Recommendation(BaseModel):
    status: Status
    speculation_off_from: int | float | None = Field(
        description="The level (concurrency, or request rate a second) from which to turn speculation off; None: keep "
        "it on.")
    decision: str = Field("", description="The answer in one sentence: the setting, its worst case, and what would "
                          "settle it (the report's first line).")
    reason: str
    worst_case_loss: float | None = Field(
        None, description="The throughput the setting may give up at some level against the better fixed policy, "
        "worst case over the simultaneous intervals (0.04: 4 %); None: not bounded (too few rounds somewhere).")
    worst_case_level: int | float | None = Field(None, description="The level where that worst case lies.")
    more_rounds: int | None = Field(None, description="Best available: about how many more rounds (a block of each "
                                    "configuration) at worst_case_level would bring the bound within the margin.")
    more_minutes: float | None = Field(None, description="About how many minutes those rounds take, from the "
                                       "level's measured rounds.")
    off_from_batch: int | None = Field(
        None, description="Off somewhere: the running batch size from which an engine's per-batch setting "
        "turns speculation off: just above the largest batch the engine ran at the last level where it is on, as "
        "measured (a closed loop of C requests runs batches of fewer than C while requests finish and arrive, and an "
        "engine may cap its batch below C).")
    batch_measured: bool = Field(False, description="off_from_batch comes from the running batch the engine "
                                 "reported; False: it was not measured and the batch is taken as the concurrency.")
    measure_next: list[int | float] = Field(default_factory=list, description="Levels to measure (more) to shrink the bound.")
    unanswered: list[int | float] = Field(default_factory=list, description="Levels measured but not answered (every block of "
                                  "a configuration there set aside as disturbed): unbounded, and among measure_next.")
    projected_tokens_per_s: dict[str, float] = Field(
        default_factory=dict, description="Mean output tok/s over the measured levels: always_off, always_on and "
        "as_recommended.")


def unanswered_level(concurrency: int | float) -> LevelVerdict:
    """A level measured but not answered: every block of a configuration there was set aside as disturbed."""
    nan = float("nan")
    return LevelVerdict(concurrency=concurrency, verdict="undetermined", ratio=nan, baseline_tokens_per_s=nan,
                        speculative_tokens_per_s=nan)


def policy_losses(levels: Sequence[LevelVerdict], t: int) -> list[float]:
    """Each level's worst-case loss under "on below index t, off from it"."""
    return [lv.losses()[0] if i < t else lv.losses()[1] for i, lv in enumerate(levels)]


def _gain(levels: Sequence[LevelVerdict], t: int) -> float:
    """What the point estimates say policy t gains over always off (sum of the log ratios where it is on)."""
    return sum(math.log(lv.ratio) for lv in levels[:t] if not math.isnan(lv.ratio))


def choose(levels: Sequence[LevelVerdict]) -> int:
    """The threshold index t (0: turn it off, len: keep it on) with the least worst-case loss (module docstring)."""
    return min(range(len(levels) + 1),
               key=lambda t: (sorted(policy_losses(levels, t), reverse=True), -_gain(levels, t), t))


def _projection(levels: Sequence[LevelVerdict], t: int) -> float:
    """Mean output tok/s over the answered levels with speculation on below index t and off from it."""
    xs = [x for i, lv in enumerate(levels)
          if not math.isnan(x := lv.speculative_tokens_per_s if i < t else lv.baseline_tokens_per_s)]
    return statistics.fmean(xs) if xs else float("nan")


def pct(x: float) -> str:
    """A share as people read it (6 %, 2.5 %, 21 %), rounded up: a bound is never shown below itself."""
    if x * 100 > 9.5:
        return f"{math.ceil(x * 100 - 1e-9)} %"
    return f"{math.ceil(x * 1000 - 1e-9) / 10:.1f}".removesuffix(".0") + " %"


def level_words(level: int | float) -> str:
    """A level as the sentences name it: a concurrency as it is (8), a request rate with its unit (2.5 requests/s)."""
    return f"{level:g} requests/s" if isinstance(level, float) else str(level)


def level_label(level: int | float) -> str:
    """A level as a column or point is labelled: C=8, or 2.5 requests/s."""
    return level_words(level) if isinstance(level, float) else f"C={level}"


def _list(cs: Sequence[int | float]) -> str:
    return ", ".join(level_words(c) for c in cs)


def _head(levels: Sequence[LevelVerdict], t: int) -> str:
    return "Keep it on." if t == len(levels) else "Turn it off." if t == 0 else \
        f"Off from {level_words(levels[t].concurrency)}."


def recommend(levels: Sequence[LevelVerdict], margin: float, unanswered: Sequence[int | float] = ()) -> Recommendation:
    """The setting, from the measured levels (in concurrency order) and the levels measured but not answered
    (module docstring)."""
    missing = sorted(set(unanswered) - {lv.concurrency for lv in levels})
    if not levels:
        why = (f"every block at {_list(missing)} was set aside as disturbed" if missing else "no level was measured")
        return Recommendation(status="best available", speculation_off_from=None, measure_next=missing,
                              unanswered=missing, decision=f"No setting: {why}. Measure again.",
                              reason=f"No setting: {why}.")
    every = sorted([*levels, *map(unanswered_level, missing)], key=lambda lv: lv.concurrency)
    rec = _answer(every, margin)
    rec.unanswered = missing
    return rec


def _answer(levels: Sequence[LevelVerdict], margin: float) -> Recommendation:
    cs = [lv.concurrency for lv in levels]
    n = len(levels)
    t = choose(levels)
    losses = policy_losses(levels, t)
    worst = max(losses)
    at = losses.index(worst)
    bounded = math.isfinite(worst)
    status: Status = "decided" if bounded and worst <= margin else "best available"
    more_rounds, more_minutes = _to_settle(levels[at]) if status != "decided" else (None, None)
    rec = Recommendation(
        status=status, speculation_off_from=None if t == n else cs[t], reason="",
        worst_case_loss=worst if bounded else None, worst_case_level=cs[at],
        more_rounds=more_rounds, more_minutes=more_minutes,
        measure_next=[c for c, x in zip(cs, losses, strict=True) if x > margin],
        projected_tokens_per_s={"always_off": _projection(levels, 0), "always_on": _projection(levels, n),
                                "as_recommended": _projection(levels, t)})
    rec.decision = _sentence(levels, t, at, worst, margin, more_rounds, more_minutes)
    words = ""
    if 0 < t < n:
        rec.off_from_batch, rec.batch_measured, words = switch_batch(levels[t - 1], levels[t])
    elif t == 0:
        rec.off_from_batch = 1
    rec.reason = " ".join(x for x in (rec.decision, _verdicts(levels, margin), _gap(levels, t), words) if x)
    return rec


def _to_settle(lv: LevelVerdict) -> tuple[int | None, float | None]:
    """More rounds at a level that would settle it, and about how many minutes they take."""
    if lv.rounds_to_settle is None or not math.isfinite(lv.rounds_to_settle):
        return None, None
    more = max(1, math.ceil(lv.rounds_to_settle) - lv.rounds)
    return more, (more * lv.round_seconds / 60.0 if lv.round_seconds is not None else None)


def _sentence(levels: Sequence[LevelVerdict], t: int, at: int, worst: float, margin: float,
              more_rounds: int | None, more_minutes: float | None) -> str:
    """The decision in one sentence: "Off from 8. Worst case: at 4, keeping it on may cost up to 6 %; about 3 more
    minutes at 4 would settle it." """
    c = level_words(levels[at].concurrency)
    head = _head(levels, t)
    doing = "keeping it on" if at < t else "turning it off"
    if math.isnan(levels[at].ratio):
        return (f"{head} Worst case: not bounded: at {c} no block counted (every one set aside as disturbed); "
                f"measure {c} again.")
    if worst <= margin:
        if worst == 0.0:
            return f"{head} Worst case: it gives up nothing at any level measured."
        return f"{head} Worst case: at {c}, {doing} may cost up to {pct(worst)} (within the {pct(margin)} margin)."
    cost = f"{doing} may cost up to {pct(worst)}" if math.isfinite(worst) else \
        "the interval is not bounded yet (too few rounds)"
    if more_minutes is not None and more_rounds is not None:
        more = (f"about {max(1, round(more_minutes))} more minute{'s' if round(more_minutes) > 1 else ''} "
                f"({more_rounds} more rounds) at {c} would {'settle' if math.isfinite(worst) else 'bound'} it")
    elif more_rounds is not None:
        more = f"about {more_rounds} more rounds at {c} would {'settle' if math.isfinite(worst) else 'bound'} it"
    elif levels[at].rounds_to_settle is None:
        more = f"more rounds at {c} would {'shrink' if math.isfinite(worst) else 'bound'} it"
    else:
        more = f"at this noise, no budget within reach settles {c}: quieten the machine or accept the bound"
    if more_rounds is not None and (cap := levels[at].max_rounds) is not None and levels[at].rounds + more_rounds > cap:
        more += (f", beyond the {cap} rounds this run allowed a level (raise decision.max_requests_per_level, "
                 "--max-requests-per-level)")
    return f"{head} Worst case: at {c}, {cost}; {more}."


def _verdicts(levels: Sequence[LevelVerdict], margin: float) -> str:
    """The verdicts in words: faster at 1 (×1.20 [1.10, 1.31]); no gain beyond the margin at 8 (×1.01 ...)."""
    words = {"faster": "faster at", "slower": "slower at", "no gain": "no gain beyond the margin at",
             "equivalent": f"within ±{pct(margin)} at", "undetermined": "undetermined at"}
    parts = []
    for verdict, prefix in words.items():
        at = [_ratio_words(lv) for lv in levels if lv.verdict == verdict]
        if at:
            parts.append(f"{prefix} {', '.join(at)}")
    return "Verdicts: " + "; ".join(parts) + "."


def _ratio_words(lv: LevelVerdict) -> str:
    if math.isnan(lv.ratio):
        return f"{level_words(lv.concurrency)} (no block counted)"
    span = f" [{lv.low:.2f}, {lv.high:.2f}]" if lv.low is not None and lv.high is not None else " [unbounded]"
    return f"{level_words(lv.concurrency)} (×{lv.ratio:.2f}{span})"


def _gap(levels: Sequence[LevelVerdict], t: int) -> str:
    a, b = levels[t - 1].concurrency if 0 < t < len(levels) else 0, levels[t].concurrency if 0 < t < len(levels) else 0
    if not 0 < t < len(levels) or (not isinstance(b, float) and b - a <= 1):
        return ""
    return (f"Levels between {level_words(a)} and {level_words(b)} were not measured: "
            f"{level_words(b)} is the first measured level where it is off.")


def batch_above(concurrency: int, batch_max: float | None) -> int:
    """The first running batch above what the engine ran at a level: the largest it reported, else (not measured)
    the level's concurrency."""
    return (max(1, math.ceil(batch_max - 1e-9)) if batch_max is not None else concurrency) + 1


def switch_batch(last_on: LevelVerdict, first_off: LevelVerdict) -> tuple[int | None, bool, str]:
    """Where an engine's per-batch setting turns speculation off, keyed on its running batch (what engines
    switch on), not on the client's load: just above the largest batch the engine ran at the last level where
    speculation is on, so that level keeps it. Returns (batch, measured, the words for the report); the batch is
    None at request-rate levels whose batch the engine did not report (a rate is no batch size)."""
    at, then = level_words(last_on.concurrency), level_words(first_off.concurrency)
    if last_on.batch_max is None:
        if isinstance(last_on.concurrency, float):
            return None, False, ("The engine's running batch was not measured (no /metrics gauge), and a request rate "
                                 "is no batch size: no per-batch setting is given. Run the setting behind `specsweep "
                                 "route` (by requests in flight), or measure where the engine reports its batch.")
        b = batch_above(int(last_on.concurrency), None)
        return b, False, (f"The engine's running batch was not measured (no /metrics gauge), so the batch is taken as "
                          f"the concurrency: an engine's per-batch setting turns speculation off from a batch of {b}.")
    b = batch_above(1, last_on.batch_max)
    words = (f"In batch sizes, as engines switch: the engine ran batches of up to {last_on.batch_max:g} at "
             f"{at} (mean {last_on.batch_mean or 0:.1f}) and of {first_off.batch_mean or 0:.1f} on "
             f"average at {then}: an engine's per-batch setting turns speculation off from a running "
             f"batch of {b}.")
    if first_off.batch_max is not None and first_off.batch_max < b:
        words += (f" The engine never ran a batch of {b} at {then} (at most {first_off.batch_max:g}): "
                  "the per-batch setting cannot tell these levels apart (the engine caps its batch, or requests wait "
                  "outside it); a router that counts requests in flight can.")
    return b, True, words
