"""The speculative-parameter grid: which setting pays best at each concurrency, and the answer in
the engines' own per-batch forms.

A grid names speculation fields of an engine's settings (each engine's module lists the fields
a grid may vary, and which is its K) with the values to try; its points are every combination.
Where the engine names how it speculates in a field (its ``method_field``: n-gram, a draft model,
EAGLE-3, ...), a grid may span methods too, and its answer is then the best method and setting per
batch range; a single launch carries it only where the ranges share one method.

Each point is compared with the baseline level by level exactly as one comparison is
(``specsweep.analysis.compare``: the same intervals and verdicts). At each level the best point is
the one whose verdict is best (faster, then undetermined, equivalent, no gain, slower),
then whose throughput is highest. "From which concurrency is speculation off" is
``specsweep.analysis.recommend`` over those best points, the same rule as a comparison's; below
that threshold each concurrency range gets its best point, and the ranges (the best K per range,
0 from the threshold on) become the per-batch setting the engine loads, where it has one; else
the ranges themselves, for a router.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specsweep import engines
from specsweep.acceptance import is_chain
from specsweep.analysis.compare import Comparison, carrying, compare_runs
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.recommend import LevelVerdict, Recommendation, batch_above, recommend
from specsweep.analysis.stats import Verdict
from specsweep.engines import EngineSettings, PerBatchSetting, SpeculationSettings
from specsweep.engines.base import MAX_BATCH
from specsweep.errors import ConfigError
from specsweep.records import BlockRow
from specsweep.results import ResultsStore

#: Each point restarts the server and measures every level: a larger grid is a mistake more often than not.
MAX_POINTS = 24
_RANK: dict[str, int] = {"faster": 0, "undetermined": 1, "equivalent": 2, "no gain": 3, "slower": 4}
SEQUENTIAL_NOTE = "The blocks were not taken alternately"


class GridPoint(BaseModel):
    """One setting of the grid: the fields it sets, and the K it drafts."""

    model_config = ConfigDict(frozen=True)

    label: str = Field(description="Short name, e.g. k3, steps3-topk1 or ngram-k3 (the profile's name ends with it).")
    values: dict[str, int | float | str]
    k: int = Field(ge=1, description="Tokens drafted per step: the value of the engine's K field.")
    method: str | None = Field(None, description="How it speculates (the engine's method field), where the engine "
                               "names it in one.")


GridValue = int | float | str


def _label(engine: str, values: Mapping[str, GridValue]) -> str:
    short = engines.get(engine).grid_fields
    return "-".join(f"{short[k]}{v:g}" if isinstance(v, float) else f"{short[k]}{v}" for k, v in values.items())


def grid_points(settings: EngineSettings, grid: Mapping[str, Sequence[GridValue]] | None) -> list[GridPoint]:
    """The grid's points, each checked against the engine's settings. Errors name the field and the fix."""
    engine = engines.of_settings(settings)
    fields = engine.grid_fields
    grid = dict(grid) if grid else dict(engine.default_grid)
    for key, listed in grid.items():
        if key not in fields:
            raise ConfigError(f"grid.{key} is not a {engine.label} speculation setting: the grid takes "
                              f"{', '.join(fields)}")
        if not isinstance(listed, list | tuple) or not listed:
            raise ConfigError(f"grid.{key} must be a non-empty list of values, e.g. {dict(engine.default_grid)}")
        if len(set(listed)) != len(listed):
            raise ConfigError(f"grid.{key} lists a value twice ({list(listed)}): each point is measured once")
    keys = [k for k in fields if k in grid]
    count = 1
    for k in keys:
        count *= len(grid[k])
    if count > MAX_POINTS:
        raise ConfigError(f"the grid has {count} points ({' x '.join(str(len(grid[k])) for k in keys)}); at most "
                          f"{MAX_POINTS}: each point restarts the server and measures every level. Narrow a list.")
    points = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        values = dict(zip(keys, combo, strict=True))
        label = _label(engine.name, values)
        variant = point_settings(settings, values, label)
        method = str(getattr(variant, engine.method_field)) if engine.method_field else None
        points.append(GridPoint(label=label, values=values, k=int(getattr(variant, engine.k_field)), method=method))
    return points


def point_settings(settings: EngineSettings, values: Mapping[str, GridValue], label: str) -> EngineSettings:
    """The engine settings with one point's values in place; refused, naming the point and field, where invalid."""
    try:
        variant = type(settings).model_validate({**settings.model_dump(), **values})
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["loc"]:
            where = ".".join(str(x) for x in first["loc"])
            raise ConfigError(f"grid point {label}: {where}: {first['msg']} (got {first.get('input')!r})") from None
        raise ConfigError(f"grid point {label}: {first['msg'].removeprefix('Value error, ')}") from None
    return variant


# -- the answer ----------------------------------------------------------------------------------


class PointLevel(BaseModel):
    """One grid point at one level, against the baseline."""

    ratio: float
    ratio_low: float | None = None
    ratio_high: float | None = None
    verdict: Verdict
    tokens_per_s: float
    blocks: int
    accept_length: float | None = None
    batch_mean: float | None = Field(None, description="The running batch the engine reported at this level, mean.")
    batch_max: float | None = Field(None, description="The largest running batch it reported at this level.")


class LevelChoice(BaseModel):
    concurrency: int
    baseline_tokens_per_s: float
    best: str = Field(description="The grid point that does best at this level.")
    verdict: Verdict = Field(description="The best point's verdict against the baseline.")
    ratio: float
    points: dict[str, PointLevel]


class SettingRange(BaseModel):
    """Batch sizes (running requests) from ``batch_from`` to ``batch_to`` and the setting for them."""

    batch_from: int
    batch_to: int
    point: str | None = Field(description="The grid point; None: speculation off.")
    k: int = Field(description="Tokens drafted per step; 0: off.")
    values: dict[str, int | float | str] = Field(default_factory=dict)
    method: str | None = Field(None, description="How the point speculates, where the engine names it.")


class Tuning(BaseModel):
    engine: str
    baseline: str
    baseline_run_id: str
    points: list[GridPoint]
    run_ids: dict[str, str] = Field(description="Each point's run id, by label.")
    levels: list[LevelChoice]
    recommendation: Recommendation
    ranges: list[SettingRange] = Field(default_factory=list, description="The setting per batch-size range (decided "
                                       "or the best available).")
    setting: PerBatchSetting | None = Field(None, description="The ranges in the form the engine loads.")
    skipped: dict[str, str] = Field(default_factory=dict, description="Grid points not measured, each with why: a "
                                    "PREDICTION from a larger K's acceptance profile that it cannot win at any level.")
    margin: float
    host: str | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def summary(self) -> str:
        return "; ".join(_range_words(r) for r in self.ranges) + ". " + self.recommendation.reason


def _range_words(r: SettingRange) -> str:
    batches = (f"{r.batch_from} and more" if r.batch_to >= MAX_BATCH else f"{r.batch_from}-{r.batch_to}"
               if r.batch_to > r.batch_from else f"{r.batch_from}")
    return f"{batches} in flight: " + (f"{r.point}" if r.point else "off")


def best_per_level(comparisons: Mapping[str, Comparison]) -> list[LevelChoice]:
    """At each level measured by every point, the point that does best there."""
    by_point = {label: {int(lv.concurrency): lv for lv in comp.levels}  # concurrency: a grid measures no rates
                for label, comp in comparisons.items()}
    common = sorted(set.intersection(*(set(levels) for levels in by_point.values()))) if by_point else []
    choices = []
    for c in common:
        points = {label: PointLevel(ratio=lv.ratio, ratio_low=lv.ratio_low, ratio_high=lv.ratio_high,
                                    verdict=lv.verdict, tokens_per_s=lv.speculative_tokens_per_s, blocks=lv.blocks[1],
                                    accept_length=lv.speculative_accept_length, batch_mean=lv.speculative_batch,
                                    batch_max=lv.speculative_batch_max)
                  for label, levels in by_point.items() for lv in [levels[c]]}
        best = min(points, key=lambda label: (_RANK[points[label].verdict], -points[label].tokens_per_s))
        base = _baseline_at(by_point, c)
        choices.append(LevelChoice(concurrency=c, baseline_tokens_per_s=base, best=best,
                                   verdict=points[best].verdict, ratio=points[best].ratio, points=points))
    return choices


def _baseline_at(by_point: Mapping[str, Mapping[int, Any]], c: int) -> float:
    """The baseline's throughput at a level (the same in every point's comparison)."""
    return float(next(iter(by_point.values()))[c].baseline_tokens_per_s)


def setting_ranges(levels: Sequence[LevelChoice], points: Sequence[GridPoint],
                   off_from: int | None) -> list[SettingRange]:
    """Consecutive levels with the same best point merged into batch-size ranges; off from ``off_from``. Engines
    switch on their running batch, so a level's setting covers the batches above the largest the engine ran at
    the level before it (as measured; the level's concurrency where it was not) up to its own (a closed loop of
    C requests runs batches of fewer than C while requests finish and arrive); the first range starts at 1."""
    by_label = {p.label: p for p in points}
    on = [lv for lv in levels if off_from is None or lv.concurrency < off_from]
    starts: list[tuple[int, GridPoint | None]] = []

    def after(lv: LevelChoice) -> int:
        """The first batch above what the engine ran at this level (with its best point), after the last start."""
        b = batch_above(lv.concurrency, lv.points[lv.best].batch_max)
        return max(b, starts[-1][0] + 1) if starts else b

    for i, lv in enumerate(on):
        if not starts or starts[-1][1] is None or starts[-1][1].label != lv.best:
            starts.append((1 if i == 0 else after(on[i - 1]), by_label[lv.best]))
    if off_from is not None:
        starts.append((1 if not starts else after(on[-1]), None))
    ranges = []
    for i, (start, point) in enumerate(starts):
        end = starts[i + 1][0] - 1 if i + 1 < len(starts) else MAX_BATCH
        ranges.append(SettingRange(batch_from=start, batch_to=end, point=point.label if point else None,
                                   k=point.k if point else 0, values=dict(point.values) if point else {},
                                   method=point.method if point else None))
    return ranges


def tune(engine: str, comparisons: Mapping[str, Comparison], points: Sequence[GridPoint], *, margin: float,
         speculation: SpeculationSettings | None) -> Tuning:
    """The tuning from each point's comparison with the baseline."""
    levels = best_per_level(comparisons)
    envelope = [LevelVerdict(concurrency=lv.concurrency, verdict=lv.verdict, ratio=lv.ratio,
                             low=lv.points[lv.best].ratio_low, high=lv.points[lv.best].ratio_high,
                             rounds=lv.points[lv.best].blocks, baseline_tokens_per_s=lv.baseline_tokens_per_s,
                             speculative_tokens_per_s=lv.points[lv.best].tokens_per_s,
                             batch_mean=lv.points[lv.best].batch_mean, batch_max=lv.points[lv.best].batch_max)
                for lv in levels]
    # A level some setting's comparison could not answer (every block there disturbed) is open.
    unanswered = set().union(*(c.unanswered for c in comparisons.values())) - {lv.concurrency for lv in levels}
    rec = recommend(envelope, margin, sorted(unanswered))
    first = next(iter(comparisons.values()))
    tuning = Tuning(engine=engine, baseline=first.baseline, baseline_run_id=first.baseline_run_id or "",
                    points=list(points), run_ids={label: c.speculative_run_id or "" for label, c in comparisons.items()},
                    levels=levels, recommendation=rec, margin=margin, host=first.host)
    for comp in comparisons.values():
        # A grid has only the sequential design: the comparison's advice to alternate does not apply here.
        tuning.notes.extend(n for n in comp.notes if n not in tuning.notes and not n.startswith(SEQUENTIAL_NOTE))
    if any(n.startswith(SEQUENTIAL_NOTE) for comp in comparisons.values() for n in comp.notes):
        tuning.notes.append("Each setting was measured after the baseline, one server at a time: drift of the machine "
                            "between them is not cancelled out. Check a close call with compare-speculation "
                            "(alternate design) on the two settings concerned.")
    if levels:  # a setting from every grid, decided or the best available (its status and bound say which)
        off = rec.speculation_off_from
        tuning.ranges = setting_ranges(levels, points, None if off is None else int(off))
        if len(methods := list(dict.fromkeys(r.method for r in tuning.ranges if r.point and r.method))) > 1:
            # One server speculates by one method: no single launch carries ranges of several.
            tuning.notes.append(
                f"The best method changes with the load ({'; '.join(_range_words(r) for r in tuning.ranges)}): one "
                f"server speculates by one method, so no single launch carries this answer. Deploy one server per "
                f"method ({', '.join(methods)}) behind a router that sends each load to its own, or the method of the "
                "range that carries most of your traffic; the grid's report gives each method's ratio per level.")
            return tuning
        k_max = max((r.k for r in tuning.ranges), default=0) or max(p.k for p in points)
        # The setting takes the drafting of the points it uses (one with more candidates per step than the
        # engine's per-batch switch allows is named by the engine).
        used = [s for r in tuning.ranges if r.point and (s := comparisons[r.point].speculation) is not None]
        speculation = max(used, key=lambda s: s.eagle_topk or 1, default=speculation)
        if speculation is not None:
            tuning.setting = carrying(engines.per_batch_setting(speculation, [(r.batch_from, r.k) for r in tuning.ranges],
                                                                k_max), rec)
            if tuning.setting is not None:
                tuning.notes.extend(n for n in tuning.setting.notes if n not in tuning.notes)
    return tuning


def tune_runs(store: ResultsStore, engine: str, baseline_run_id: str, point_runs: Mapping[str, str],
              points: Sequence[GridPoint], decision: DecisionConfig,
              skipped: Mapping[str, str] | None = None) -> Tuning:
    """The tuning from the store: the baseline's run and each measured point's (by label); ``skipped``: the points
    not measured, with why."""
    comparisons = {label: compare_runs(store, baseline_run_id, run_id, decision=decision)
                   for label, run_id in point_runs.items()}
    speculation = next((c.speculation for c in comparisons.values() if c.speculation is not None), None)
    tuning = tune(engine, comparisons, [p for p in points if p.label in point_runs], margin=decision.margin,
                  speculation=speculation)
    tuning.skipped = dict(skipped or {})
    tuning.notes.extend(f"{label} not measured: {why}" for label, why in tuning.skipped.items())
    return tuning


# -- skipping what cannot win ----------------------------------------------------------------------


def chains(engine: str, points: Sequence[GridPoint], method: str | None = None,
           eagle_topk: int | None = None) -> list[list[GridPoint]]:
    """The grid's chain-drafter points that differ only in K, in groups of two or more, the largest K first
    (``method`` and ``eagle_topk``: the speculative configuration's, for points that do not set them)."""
    eng = engines.get(engine)
    groups: dict[str, list[GridPoint]] = {}
    for p in points:
        topk = p.values.get("eagle_topk", eagle_topk)
        named = eng.method_names.get(p.method, p.method) if p.method else method
        if not is_chain(named, int(topk) if isinstance(topk, int | float) else None):
            continue
        key = repr(sorted((k, v) for k, v in p.values.items() if k != eng.k_field))
        groups.setdefault(key, []).append(p)
    return [sorted(g, key=lambda p: -p.k) for g in groups.values() if len(g) > 1]


def measure_first(engine: str, points: Sequence[GridPoint], method: str | None = None,
                  eagle_topk: int | None = None) -> list[GridPoint]:
    """The points to measure before any is skipped: all but the smaller Ks of each chain group."""
    later = {p.label for g in chains(engine, points, method, eagle_topk) for p in g[1:]}
    return [p for p in points if p.label not in later]


def marginal_per_position(rows: Sequence[BlockRow]) -> list[float]:
    """The marginal acceptance per draft position from the engine's per-position counters (accepted at position i
    per draft), over the blocks that count, each weighted alike; [] where none has them."""
    found = [r.spec_acceptance_per_position for r in rows if r.disturbed is None and r.spec_acceptance_per_position]
    if not found:
        return []
    k = min(len(f) for f in found)
    return [sum(f[i] for f in found) / len(found) for i in range(k)]


def predicted_to_lose(measured: GridPoint, comp: Comparison, marginal: Sequence[float],
                      smaller: Sequence[GridPoint]) -> dict[str, str]:
    """The points of ``smaller`` (the same drafter at a smaller K) that cannot win at any level, by the prediction of
    the module docstring from ``measured`` (its comparison with the baseline and its marginal acceptance per
    position), each with why. Nothing where a level's interval is unbounded or the profile is shorter than K."""
    if len(marginal) < measured.k or not comp.levels:
        return {}
    al_k = 1 + sum(marginal[:measured.k])
    fits: list[tuple[int, float, float]] = []  # (level, c, the measured K's low)
    for lv in comp.levels:
        if lv.ratio_high is None or lv.ratio_low is None or lv.ratio_high <= 0:
            return {}
        fits.append((int(lv.concurrency), max(0.0, (al_k / lv.ratio_high - 1) / measured.k), lv.ratio_low))
    out = {}
    for p in smaller:
        al = 1 + sum(marginal[:p.k])
        best = {c: al / (1 + cost * p.k) for c, cost, _ in fits}
        if all(best[c] < max(1.0, low) for c, _, low in fits):
            shown = ", ".join(f"{c}: at most x{best[c]:.2f}" for c, _, _ in fits)
            out[p.label] = (f"PREDICTION, not measured: from {measured.label}'s acceptance profile, {p.label} accepts "
                            f"{al:.2f} tokens a step against {al_k:.2f}, and even at the cheapest drafting that "
                            f"{measured.label}'s intervals allow it beats neither the baseline nor {measured.label} "
                            f"at any level ({shown})")
    return out
