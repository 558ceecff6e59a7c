"""Does the recommended setting do what the comparison promised? The verify stage's judgement.

After a decided comparison the engine runs the recommendation itself (its per-batch setting, in the
form its engine loads: ``specsweep.engines``), measured at the compared levels in
turn with the two fixed policies: always off (the baseline) and always on (the speculative
configuration), a block of each per round, paired. At each level the schedule is held against the
better of the two fixed policies there (by this stage's own blocks): it **reaches** it when the
interval of schedule / better lies wholly above 1 - margin, **falls short** when it lies wholly
below, and is **undetermined** otherwise. The recommendation is verified when every level reaches,
failed when any falls short, undetermined otherwise.

Where the engine has its own speculation controller (``Engine.controller``: adaptive tiers, adaptive
verification), a fourth arm runs it, in the same rounds. At each level the schedule is then held against it
too, by the interval of schedule / controller (``stats.verdict`` with the margin): the schedule **beats** it
(the interval wholly above 1), **matches** it (wholly within 1 ± margin), **loses** to it (wholly below 1), is
**no better** (below 1 + margin: the controller does as well within the margin, or better), or is undetermined.
The level's two intervals share its share of alpha (Bonferroni over the two comparisons:
``DecisionConfig.look_confidence``). Over the levels (``overall_standing``): mixed where it beats at one level
and loses at another, undetermined where any level is, beats (or loses) where it does at some level, matches
where every level matches, no better otherwise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, Field

from specsweep.analysis.decision import DecisionConfig, budget_spent, throughputs
from specsweep.analysis.recommend import level_words
from specsweep.analysis.stats import ratio_interval, verdict
from specsweep.records import BlockRow

Result = Literal["reaches", "falls short", "undetermined"]
Status = Literal["verified", "failed", "undetermined"]
#: The schedule against the engine's own controller, at a level.
Standing = Literal["beats", "matches", "no better", "loses", "undetermined"]
#: ... and over the levels.
Overall = Literal["beats", "matches", "no better", "loses", "mixed", "undetermined"]
#: The arms of the verify stage, in the order their blocks are measured in the first round.
ARMS = ("off", "on", "schedule")
#: The fourth arm: the engine's own controller, where it has one.
CONTROLLER = "controller"
_STANDING: dict[str, Standing] = {"faster": "beats", "equivalent": "matches", "no gain": "no better",
                                  "slower": "loses", "undetermined": "undetermined"}


class ControllerCheck(BaseModel):
    """The schedule at one level against the engine's own controller."""

    controller_tokens_per_s: float = Field(description="Geometric mean over the stage's blocks.")
    ratio: float = Field(description="schedule / the engine's controller")
    ratio_low: float | None = None
    ratio_high: float | None = None
    result: Standing
    drafted_per_step: float | None = Field(None, description="The controller arm's draft tokens per verify step "
                                           "(median over the blocks): the depth it chose.")
    tier_mean: float | None = Field(None, description="The controller's active tier (draft steps) sampled "
                                    "from /server_info, mean over the blocks.")


class SettingCost(BaseModel):
    """The per-batch setting against always-on at the lowest level where it speculates (the same K): what the
    setting itself costs there (an engine's known cost: Engine.per_batch_cost), on its own."""

    concurrency: int | float
    why: str = Field(description="The engine's known reason for a cost.")
    ratio: float = Field(description="as recommended / always on")
    ratio_low: float | None = None
    ratio_high: float | None = None
    verdict: str = Field(description="stats.verdict of the ratio with the margin: slower is a cost beyond noise.")


class LevelCheck(BaseModel):
    """The schedule at one level against the better fixed policy."""

    concurrency: int | float = Field(description="The level: requests in flight, or requests a second.")
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
    controller: ControllerCheck | None = Field(None, description="Against the engine's own controller, where the "
                                               "fourth arm ran.")


class Verification(BaseModel):
    """The verify stage's answer: the setting that ran, and how it did at each level."""

    status: Status
    setting: str = Field(description="How the engine was started with the recommendation (its flags).")
    levels: list[LevelCheck]
    margin: float
    runs: dict[str, str] = Field(default_factory=dict, description="Run id of each arm: off, on, schedule "
                                 "(and controller).")
    mean_tokens_per_s: dict[str, float] = Field(default_factory=dict, description="Mean over the levels, per arm.")
    summary: str = ""
    controller: str | None = Field(None, description="How the engine was started with its own controller (its "
                                   "flags), where the fourth arm ran.")
    against_controller: Overall | None = Field(None, description="The schedule against the engine's own controller "
                                               "over the levels (None: the fourth arm did not run).")
    controller_summary: str = ""
    setting_cost: SettingCost | None = Field(None, description="The per-batch setting against always-on at the "
                                             "lowest level where it speculates, where its engine has a known cost.")


def _geomean(rows: Sequence[BlockRow]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in throughputs(rows)))


def _median(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def check_controller(schedule: Sequence[BlockRow], controller: Sequence[BlockRow], *, margin: float,
                     confidence: float) -> ControllerCheck:
    """The schedule against the engine's own controller at one level, from their paired blocks."""
    iv = ratio_interval(throughputs(controller), throughputs(schedule), paired=True, confidence=confidence)
    return ControllerCheck(controller_tokens_per_s=_geomean(controller), ratio=iv.ratio, ratio_low=iv.low,
                           ratio_high=iv.high, result=_STANDING[verdict(iv, margin)],
                           drafted_per_step=_median([r.spec_drafted_per_step for r in controller]),
                           tier_mean=_median([r.controller_tier_mean for r in controller]))


def overall_standing(results: Sequence[Standing]) -> Overall | None:
    """The levels' standings as one: mixed where the schedule beats at one level and loses at another;
    undetermined where any level is; beats where it beats at some level (and loses at none); loses where it loses
    at some (and beats at none); matches where every level matches; no better otherwise (the controller within
    the margin of the schedule, or ahead, at every level)."""
    found = set(results)
    if not found:
        return None
    if {"beats", "loses"} <= found:
        return "mixed"
    if "undetermined" in found:
        return "undetermined"
    if found == {"matches"}:
        return "matches"
    if "beats" in found:
        return "beats"
    if "loses" in found:
        return "loses"
    return "no better"


def check_level(concurrency: int | float, speculates: bool, off: Sequence[BlockRow], on: Sequence[BlockRow],
                schedule: Sequence[BlockRow], controller: Sequence[BlockRow] | None = None, *, margin: float,
                confidence: float) -> LevelCheck:
    """One level's check from its paired blocks (round i of each arm measured back to back); ``confidence``
    each interval's (the level's two comparisons share its alpha where the controller ran)."""
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
                      blocks=min(len(off), len(on), len(schedule), *([len(controller)] if controller else [])),
                      result=result,
                      controller=check_controller(schedule, controller, margin=margin, confidence=confidence)
                      if controller else None)


def _by_level(rows: Sequence[BlockRow]) -> dict[int | float, list[BlockRow]]:
    """The blocks that count, by level (the arms measure the comparison's levels: concurrency or request rates)."""
    out: dict[int | float, list[BlockRow]] = {}
    for r in sorted(rows, key=lambda r: (r.level_index, r.repeat)):
        if r.disturbed is None and r.load is not None:
            out.setdefault(r.load, []).append(r)
    return out


def verify_levels(off: Sequence[BlockRow], on: Sequence[BlockRow], schedule: Sequence[BlockRow],
                  controller: Sequence[BlockRow] | None = None, *, off_from: int | float | None, setting: str,
                  decision: DecisionConfig, num_requests: int, controller_setting: str | None = None,
                  setting_cost: str | None = None) -> Verification:
    """The verification from the arms' blocks (``controller``: the engine's own controller's, where the fourth arm
    ran). ``off_from``: the recommendation's threshold (None: on everywhere)."""
    arms = [_by_level(rows) for rows in (off, on, schedule, *([controller] if controller is not None else []))]
    common = sorted(set.intersection(*(set(a) for a in arms)))
    confidence = decision.look_confidence(num_requests, comparisons=2 if controller is not None else 1)
    levels = [check_level(c, off_from is None or c < off_from, *(a[c] for a in arms), margin=decision.margin,
                          confidence=confidence) for c in common]
    results = {lv.result for lv in levels}
    status: Status = ("failed" if "falls short" in results else
                      "verified" if levels and results == {"reaches"} else "undetermined")
    means = {name: statistics.fmean(getattr(lv, f"{name}_tokens_per_s") for lv in levels) for name in ARMS} \
        if levels else {}
    v = Verification(status=status, setting=setting, levels=levels, margin=decision.margin,
                     mean_tokens_per_s=means, summary=_summary(status, levels, decision.margin))
    lowest = next((lv for lv in levels if lv.speculates), None)
    if setting_cost is not None and lowest is not None:  # same K as always-on there: a difference is the setting's
        c = lowest.concurrency
        iv = ratio_interval(throughputs(arms[1][c]), throughputs(arms[2][c]), paired=True, confidence=confidence)
        v.setting_cost = SettingCost(concurrency=c, why=setting_cost, ratio=iv.ratio, ratio_low=iv.low,
                                     ratio_high=iv.high, verdict=verdict(iv, decision.margin))
    if controller is None:
        return v
    checks = [lv.controller for lv in levels if lv.controller is not None]
    if checks:
        means[CONTROLLER] = statistics.fmean(c.controller_tokens_per_s for c in checks)
    overall = overall_standing([c.result for c in checks])
    return v.model_copy(update={"controller": controller_setting, "against_controller": overall,
                                "mean_tokens_per_s": means,
                                "controller_summary": controller_summary(overall, levels, decision.margin)})


def controller_summary(overall: Overall | None, levels: Sequence[LevelCheck], margin: float) -> str:
    """One sentence: does the engine's own controller already do as well as the measured schedule?"""
    if overall is None:
        return "The engine's own controller was not measured at any level."
    pct = f"{margin:.0%}"
    words = {"beats": "The measured schedule beats the engine's own controller at some level and loses to it at none",
             "matches": f"The measured schedule matches the engine's own controller (within {pct}) at every level",
             "no better": f"The measured schedule is no better than the engine's own controller: within {pct} of it "
                          "or behind it at every level",
             "loses": "The measured schedule loses to the engine's own controller at some level and beats it at none",
             "mixed": "The measured schedule beats the engine's own controller at some levels and loses to it at "
                      "others",
             "undetermined": "Against the engine's own controller, undetermined: at some level the measured schedule "
                             f"may be ahead or behind by more than {pct}"}
    detail = "; ".join(f"{level_words(lv.concurrency)}: ×{lv.controller.ratio:.2f} of the controller ({lv.controller.result})"
                       for lv in levels if lv.controller is not None)
    return f"{words[overall]} ({detail})."


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
    detail = "; ".join(f"{level_words(lv.concurrency)}: ×{lv.ratio:.2f} of always {lv.better_fixed} ({lv.result})"
                       for lv in levels)
    return f"{words[status]} ({detail})."


def needs_more(decision: DecisionConfig, num_requests: int,
               off_from: int | float | None) -> Callable[[list[list[BlockRow]]], bool]:
    """Another round of the arms (off, on, schedule, and the engine's controller where it runs) at a level? Until
    its checks are decided or its budget is spent (``decision.min_blocks`` rounds at least)."""

    def more(clean: list[list[BlockRow]]) -> bool:
        n = min(len(rows) for rows in clean)
        if n < decision.min_blocks:
            return True
        if budget_spent([r for rows in clean for r in rows], decision, num_requests, n):
            return False
        concurrency = clean[0][0].load or 1
        check = check_level(concurrency, off_from is None or concurrency < off_from, *clean, margin=decision.margin,
                            confidence=decision.look_confidence(num_requests, comparisons=len(clean) - 2))
        return check.result == "undetermined" or (check.controller is not None
                                                  and check.controller.result == "undetermined")

    return more
