"""Does the recommended setting do what the comparison promised? The verify stage's judgement.

After a decided comparison the engine runs the recommendation itself (its per-batch setting, in the
form its engine loads: ``specsweep.engines``), measured at the compared levels in
turn with the two fixed policies: always off (the baseline) and always on (the speculative
configuration), a block of each per round, paired. At each level the schedule is held against the
better of the two fixed policies there (by this stage's own blocks): it **reaches** it when the
interval of schedule / better lies wholly above 1 - margin, **falls short** when it lies wholly
below, and is **undetermined** otherwise. The recommendation is verified when every level reaches,
failed when any falls short, undetermined otherwise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, Field

from specsweep.analysis.decision import DecisionConfig, budget_spent, throughputs
from specsweep.analysis.stats import ratio_interval
from specsweep.records import BlockRow

Result = Literal["reaches", "falls short", "undetermined"]
Status = Literal["verified", "failed", "undetermined"]
#: The arms of the verify stage, in the order their blocks are measured in the first round.
ARMS = ("off", "on", "schedule")


class LevelCheck(BaseModel):
    """The schedule at one level against the better fixed policy."""

    concurrency: int
    speculates: bool = Field(description="Whether the recommendation speculates at this level.")
    off_tokens_per_s: float = Field(description="Geometric mean over the stage's blocks.")
    on_tokens_per_s: float
    schedule_tokens_per_s: float
    better_fixed: Literal["off", "on"]
    ratio: float = Field(description="schedule / the better fixed policy")
    ratio_low: float | None = None
    ratio_high: float | None = None
    blocks: int
    result: Result


class Verification(BaseModel):
    """The verify stage's answer: the setting that ran, and how it did at each level."""

    status: Status
    setting: str = Field(description="How the engine was started with the recommendation (its flags).")
    levels: list[LevelCheck]
    margin: float
    runs: dict[str, str] = Field(default_factory=dict, description="Run id of each arm: off, on, schedule.")
    mean_tokens_per_s: dict[str, float] = Field(default_factory=dict, description="Mean over the levels, per arm.")
    summary: str = ""


def _geomean(rows: Sequence[BlockRow]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in throughputs(rows)))


def check_level(concurrency: int, speculates: bool, off: Sequence[BlockRow], on: Sequence[BlockRow],
                schedule: Sequence[BlockRow], *, margin: float, confidence: float) -> LevelCheck:
    """One level's check from its paired blocks (round i of each arm measured back to back)."""
    means = {"off": _geomean(off), "on": _geomean(on), "schedule": _geomean(schedule)}
    better: Literal["off", "on"] = "on" if means["on"] > means["off"] else "off"
    iv = ratio_interval(throughputs(on if better == "on" else off), throughputs(schedule), paired=True,
                        confidence=confidence)
    floor = 1.0 - margin
    result: Result = ("undetermined" if iv.low is None or iv.high is None else
                      "reaches" if iv.low >= floor else "falls short" if iv.high < floor else "undetermined")
    return LevelCheck(concurrency=concurrency, speculates=speculates, off_tokens_per_s=means["off"],
                      on_tokens_per_s=means["on"], schedule_tokens_per_s=means["schedule"], better_fixed=better,
                      ratio=iv.ratio, ratio_low=iv.low, ratio_high=iv.high,
                      blocks=min(len(off), len(on), len(schedule)), result=result)


def _by_concurrency(rows: Sequence[BlockRow]) -> dict[int, list[BlockRow]]:
    out: dict[int, list[BlockRow]] = {}
    for r in sorted(rows, key=lambda r: (r.level_index, r.repeat)):
        if r.disturbed is None and r.mode == "concurrency" and r.concurrency is not None:
            out.setdefault(r.concurrency, []).append(r)
    return out


def verify_levels(off: Sequence[BlockRow], on: Sequence[BlockRow], schedule: Sequence[BlockRow], *,
                  off_from: int | None, setting: str, decision: DecisionConfig, num_requests: int) -> Verification:
    """The verification from the three arms' blocks. ``off_from``: the recommendation's threshold (None: on
    everywhere)."""
    arms = [_by_concurrency(off), _by_concurrency(on), _by_concurrency(schedule)]
    common = sorted(set(arms[0]) & set(arms[1]) & set(arms[2]))
    confidence = decision.look_confidence(num_requests)
    levels = [check_level(c, off_from is None or c < off_from, *(a[c] for a in arms), margin=decision.margin,
                          confidence=confidence) for c in common]
    results = {lv.result for lv in levels}
    status: Status = ("failed" if "falls short" in results else
                      "verified" if levels and results == {"reaches"} else "undetermined")
    means = {name: statistics.fmean(getattr(lv, f"{name}_tokens_per_s") for lv in levels) for name in ARMS} \
        if levels else {}
    return Verification(status=status, setting=setting, levels=levels, margin=decision.margin,
                        mean_tokens_per_s=means, summary=_summary(status, levels, decision.margin))


def _summary(status: Status, levels: Sequence[LevelCheck], margin: float) -> str:
    if not levels:
        return "The recommended setting was not measured at any level."
    pct = f"{margin:.0%}"
    words = {"verified": f"Verified: run by the engine, the recommended setting came within {pct} of the better fixed "
                         "policy (always on or always off) at every level measured",
             "failed": "Not verified: run by the engine, the recommended setting fell short of the better fixed policy "
                       f"by more than {pct} at some level",
             "undetermined": "Verification undetermined: at some level the recommended setting may or may not come "
                             f"within {pct} of the better fixed policy"}
    detail = "; ".join(f"{lv.concurrency}: ×{lv.ratio:.2f} of always {lv.better_fixed} ({lv.result})" for lv in levels)
    return f"{words[status]} ({detail})."


def needs_more(decision: DecisionConfig, num_requests: int,
               off_from: int | None) -> Callable[[list[list[BlockRow]]], bool]:
    """Another round of the three arms (off, on, schedule) at a level? Until its check is decided or its
    budget is spent (``decision.min_blocks`` rounds at least)."""

    def more(clean: list[list[BlockRow]]) -> bool:
        n = min(len(rows) for rows in clean)
        if n < decision.min_blocks:
            return True
        if budget_spent([r for rows in clean for r in rows], decision, num_requests, n):
            return False
        concurrency = int(clean[0][0].concurrency or 1)
        check = check_level(concurrency, off_from is None or concurrency < off_from, *clean, margin=decision.margin,
                            confidence=decision.look_confidence(num_requests))
        return check.result == "undetermined"

    return more
