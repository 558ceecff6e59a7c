"""The speculative-parameter grid: which setting pays best at each concurrency, and the answer in
the engines' own per-batch forms.

A grid names speculation fields of an engine's settings (``specsweep.settings``) with the
values to try; its points are every combination:

    vLLM       num_speculative_tokens (K)
    SGLang     num_steps, eagle_topk, num_draft_tokens
    llama.cpp  draft_max, draft_min, draft_p_min

Each point is compared with the baseline level by level exactly as one comparison is
(``specsweep.compare``: the same intervals and verdicts). At each level the best point is
the one whose verdict is best (faster, then undetermined, then equivalent, then slower),
then whose throughput is highest. "From which concurrency is speculation off" is
``specsweep.recommend`` over those best points, the same rule as a comparison's; below
that threshold each concurrency range gets its best point, and the ranges become vLLM's
``num_speculative_tokens_per_batch_size`` (the best K per range, 0 from the threshold on)
and SGLang's adaptive file (candidate steps per batch tier). llama.cpp has no per-batch
switch: its answer is the ranges themselves, for a router.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specsweep import engine_configs
from specsweep.compare import Comparison, compare_runs
from specsweep.decision import DecisionConfig
from specsweep.engine_configs import MAX_BATCH, SpeculationSettings
from specsweep.errors import ConfigError
from specsweep.recommend import LevelVerdict, Recommendation, recommend
from specsweep.stats import Verdict
from specsweep.store import ResultsStore

Engine = Literal["vllm", "sglang", "llamacpp"]
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp"}
#: The speculation fields a grid may vary, per engine, and each one's short name in point labels.
GRID_FIELDS: dict[str, dict[str, str]] = {
    "vllm": {"num_speculative_tokens": "k"},
    "sglang": {"num_steps": "steps", "eagle_topk": "topk", "num_draft_tokens": "draft"},
    "llamacpp": {"draft_max": "dmax", "draft_min": "dmin", "draft_p_min": "pmin"},
}
#: The field that is the engine's K (tokens drafted per step): what the per-batch forms carry.
K_FIELD = {"vllm": "num_speculative_tokens", "sglang": "num_steps", "llamacpp": "draft_max"}
DEFAULT_GRIDS: dict[str, dict[str, list[int | float]]] = {
    "vllm": {"num_speculative_tokens": [1, 3, 5]},
    "sglang": {"num_steps": [1, 3, 5]},
    "llamacpp": {"draft_max": [2, 4, 8]},
}
#: Each point restarts the server and measures every level: a larger grid is a mistake more often than not.
MAX_POINTS = 24
_RANK: dict[str, int] = {"faster": 0, "undetermined": 1, "equivalent": 2, "slower": 3}
SEQUENTIAL_NOTE = "The blocks were not taken alternately"


class GridPoint(BaseModel):
    """One setting of the grid: the fields it sets, and the K it drafts."""

    model_config = ConfigDict(frozen=True)

    label: str = Field(description="Short name, e.g. k3 or steps3-topk1 (the profile's name ends with it).")
    values: dict[str, int | float]
    k: int = Field(ge=1, description="Tokens drafted per step (K, SGLang's steps, llama.cpp's draft-max).")


def _label(engine: str, values: Mapping[str, int | float]) -> str:
    short = GRID_FIELDS[engine]
    return "-".join(f"{short[k]}{v:g}" if isinstance(v, float) else f"{short[k]}{v}" for k, v in values.items())


def grid_points(engine: Engine, grid: Mapping[str, Sequence[int | float]] | None,
                settings: BaseModel) -> list[GridPoint]:
    """The grid's points, each checked against the engine's settings. Errors name the field and the fix."""
    fields = GRID_FIELDS[engine]
    grid = dict(grid) if grid else dict(DEFAULT_GRIDS[engine])
    for key, listed in grid.items():
        if key not in fields:
            raise ConfigError(f"grid.{key} is not a {ENGINE_NAMES[engine]} speculation setting: the grid takes "
                              f"{', '.join(fields)}")
        if not isinstance(listed, list | tuple) or not listed:
            raise ConfigError(f"grid.{key} must be a non-empty list of values, e.g. {DEFAULT_GRIDS[engine]}")
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
        label = _label(engine, values)
        variant = point_settings(settings, values, label)
        points.append(GridPoint(label=label, values=values, k=int(getattr(variant, K_FIELD[engine]))))
    return points


def point_settings(settings: BaseModel, values: Mapping[str, int | float], label: str) -> Any:
    """The engine settings with one point's values in place; refused, naming the point and field, where invalid."""
    try:
        variant = type(settings).model_validate({**settings.model_dump(), **values})
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["loc"]:
            where = ".".join(str(x) for x in first["loc"])
            raise ConfigError(f"grid point {label}: {where}: {first['msg']} (got {first.get('input')!r})") from None
        raise ConfigError(f"grid point {label}: {first['msg'].removeprefix('Value error, ')}") from None
    topk, steps, draft = (getattr(variant, f, None) for f in ("eagle_topk", "num_steps", "num_draft_tokens"))
    if topk == 1 and draft is not None and steps is not None and draft != steps + 1:
        raise ConfigError(f"grid point {label}: with eagle_topk 1, SGLang needs num_draft_tokens = num_steps + 1 "
                          f"({steps + 1}, not {draft}): leave num_draft_tokens out of the grid and the settings")
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
    values: dict[str, int | float] = Field(default_factory=dict)


class Tuning(BaseModel):
    engine: Engine
    baseline: str
    baseline_run_id: str
    points: list[GridPoint]
    run_ids: dict[str, str] = Field(description="Each point's run id, by label.")
    levels: list[LevelChoice]
    recommendation: Recommendation
    ranges: list[SettingRange] = Field(default_factory=list, description="Decided: the setting per batch-size range.")
    vllm_speculative_config: dict[str, Any] | None = None
    sglang_adaptive_config: dict[str, Any] | None = None
    sglang_flags: str | None = None
    margin: float
    host: str | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def summary(self) -> str:
        if self.recommendation.status != "decided":
            return self.recommendation.reason
        return "; ".join(_range_words(r) for r in self.ranges) + ". " + self.recommendation.reason


def _range_words(r: SettingRange) -> str:
    batches = f"{r.batch_from}-{r.batch_to}" if r.batch_to < MAX_BATCH else f"{r.batch_from} and more"
    return f"{batches} in flight: " + (f"{r.point}" if r.point else "off")


def best_per_level(comparisons: Mapping[str, Comparison]) -> list[LevelChoice]:
    """At each level measured by every point, the point that does best there."""
    by_point = {label: {lv.concurrency: lv for lv in comp.levels} for label, comp in comparisons.items()}
    common = sorted(set.intersection(*(set(levels) for levels in by_point.values()))) if by_point else []
    choices = []
    for c in common:
        points = {label: PointLevel(ratio=lv.ratio, ratio_low=lv.ratio_low, ratio_high=lv.ratio_high,
                                    verdict=lv.verdict, tokens_per_s=lv.speculative_tokens_per_s, blocks=lv.blocks[1],
                                    accept_length=lv.speculative_accept_length)
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
    """Consecutive levels with the same best point merged into batch-size ranges; off from ``off_from``.
    A range runs from its first level to just below the next range's (the first from 1)."""
    by_label = {p.label: p for p in points}
    on = [lv for lv in levels if off_from is None or lv.concurrency < off_from]
    starts: list[tuple[int, GridPoint | None]] = []
    for i, lv in enumerate(on):
        if not starts or starts[-1][1] is None or starts[-1][1].label != lv.best:
            starts.append((1 if i == 0 else lv.concurrency, by_label[lv.best]))
    if off_from is not None:
        starts.append((1 if not starts else off_from, None))
    ranges = []
    for i, (start, point) in enumerate(starts):
        end = starts[i + 1][0] - 1 if i + 1 < len(starts) else MAX_BATCH
        ranges.append(SettingRange(batch_from=start, batch_to=end, point=point.label if point else None,
                                   k=point.k if point else 0, values=dict(point.values) if point else {}))
    return ranges


def tune(engine: Engine, comparisons: Mapping[str, Comparison], points: Sequence[GridPoint], *, margin: float,
         speculation: SpeculationSettings | None) -> Tuning:
    """The tuning from each point's comparison with the baseline."""
    levels = best_per_level(comparisons)
    envelope = [LevelVerdict(concurrency=lv.concurrency, verdict=lv.verdict, ratio=lv.ratio,
                             baseline_tokens_per_s=lv.baseline_tokens_per_s,
                             speculative_tokens_per_s=lv.points[lv.best].tokens_per_s) for lv in levels]
    rec = recommend(envelope, margin)
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
    if rec.status == "decided":
        tuning.ranges = setting_ranges(levels, points, rec.speculation_off_from)
        _engine_forms(tuning, speculation)
    return tuning


def _engine_forms(tuning: Tuning, speculation: SpeculationSettings | None) -> None:
    starts = [(r.batch_from, r.k) for r in tuning.ranges]
    k_max = max((r.k for r in tuning.ranges), default=0) or max(p.k for p in tuning.points)
    if tuning.engine == "vllm" and speculation is not None:
        tuning.vllm_speculative_config = engine_configs.vllm_ranges_config(speculation, starts, k_max)
    elif tuning.engine == "sglang":
        topk = {r.point: r.values.get("eagle_topk") for r in tuning.ranges if r.point}
        wide = sorted(label for label, t in topk.items() if t not in (None, 1))
        if wide or (speculation is not None and (speculation.eagle_topk or 1) != 1 and not topk):
            tuning.notes.append(f"SGLang's adaptive speculation needs --speculative-eagle-topk 1; the best setting "
                                f"({', '.join(wide) or 'the settings'}) uses more: no adaptive file is given. Run "
                                "the best setting as a fixed one, or tune with eagle_topk [1].")
        else:
            tuning.sglang_adaptive_config = engine_configs.sglang_ranges_config(starts)
            if speculation is not None:
                tuning.sglang_flags = engine_configs.sglang_flags(
                    speculation.model_copy(update={"num_speculative_tokens": k_max}))
    elif tuning.engine == "llamacpp":
        tuning.notes.append("llama.cpp has no per-batch speculation switch: run one server per setting and route "
                            "each request by the requests in flight, as the ranges say.")


def tune_runs(store: ResultsStore, engine: Engine, baseline_run_id: str, point_runs: Mapping[str, str],
              points: Sequence[GridPoint], decision: DecisionConfig) -> Tuning:
    """The tuning from the store: the baseline's run and each point's (by label)."""
    comparisons = {label: compare_runs(store, baseline_run_id, run_id, decision=decision)
                   for label, run_id in point_runs.items()}
    speculation = next((c.speculation for c in comparisons.values() if c.speculation is not None), None)
    return tune(engine, comparisons, points, margin=decision.margin, speculation=speculation)


# -- the report folder ---------------------------------------------------------------------------


def report_folder(tuning: Tuning) -> str:
    return f"reports/tune-{tuning.baseline_run_id}"


def tuning_json(tuning: Tuning) -> dict[str, Any]:
    return {
        "engine": tuning.engine, "status": tuning.recommendation.status,
        "speculation_off_from": tuning.recommendation.speculation_off_from, "reason": tuning.recommendation.reason,
        "measure_next": tuning.recommendation.measure_next, "margin": tuning.margin,
        "baseline": {"name": tuning.baseline, "run_id": tuning.baseline_run_id},
        "points": [{"label": p.label, "values": p.values, "k": p.k, "run_id": tuning.run_ids.get(p.label)}
                   for p in tuning.points],
        "ranges": [r.model_dump() for r in tuning.ranges],
        "levels": [{"concurrency": lv.concurrency, "best": lv.best, "verdict": lv.verdict, "ratio": round(lv.ratio, 4),
                    "points": {k: {"ratio": round(p.ratio, 4), "verdict": p.verdict,
                                   "tokens_per_s": round(p.tokens_per_s, 2)} for k, p in lv.points.items()}}
                   for lv in tuning.levels],
    }


def tuning_markdown(tuning: Tuning) -> str:
    from specsweep.report import markdown_table

    labels = [p.label for p in tuning.points]
    rows = []
    for lv in tuning.levels:
        cells = []
        for label in labels:
            p = lv.points[label]
            ci = f" [{p.ratio_low:.2f}, {p.ratio_high:.2f}]" if p.ratio_low is not None and p.ratio_high is not None \
                else ""
            mark = "**" if label == lv.best else ""
            cells.append(f"{mark}×{p.ratio:.2f}{ci} {p.verdict}{mark}")
        rows.append([str(lv.concurrency), f"{lv.baseline_tokens_per_s:,.1f}", *cells, lv.best])
    table = markdown_table(["concurrency", "baseline tok/s", *labels, "best"], rows)
    rec = tuning.recommendation
    parts = [f"## Speculation grid on {ENGINE_NAMES[tuning.engine]}: {', '.join(labels)} vs {tuning.baseline}",
             f"**{'Decided' if rec.status == 'decided' else 'Undetermined'}: {tuning.summary}**",
             table,
             f"Each cell: the point's throughput / the baseline's, with its interval, and its verdict (±{tuning.margin:.0%}"
             " counts as equivalent). The best point per level is in bold: the best verdict, then the highest "
             "throughput."]
    if tuning.ranges:
        parts.append("### Setting per batch size\n\n" + markdown_table(
            ["running requests", "setting", "K"],
            [[f"{r.batch_from}-{r.batch_to}" if r.batch_to < MAX_BATCH else f"{r.batch_from}+",
              r.point or "off (baseline)", str(r.k)] for r in tuning.ranges]))
    parts.append("### What to configure")
    if tuning.vllm_speculative_config is not None:
        parts.append("vLLM (`vllm-speculative-config.json`):\n\n```\n"
                     + engine_configs.vllm_flags(tuning.vllm_speculative_config) + "\n```")
    if tuning.sglang_adaptive_config is not None:
        parts.append("SGLang (`sglang-adaptive-config.json`):\n\n```\n"
                     + (tuning.sglang_flags or "--speculative-adaptive --speculative-adaptive-config "
                        "sglang-adaptive-config.json") + "\n```")
    if rec.status != "decided":
        parts.append("No engine setting is given while the answer is undetermined: measure the levels named above "
                     "first (a larger decision budget).")
    if tuning.notes:
        parts.append("### Notes\n" + "\n".join(f"- {n}" for n in tuning.notes))
    return "\n\n".join(parts)


def write_tuning_report(tuning: Tuning, store: ResultsStore) -> dict[str, str]:
    """The tuning's report folder: report.md, tuning.json, the engine's file, the plot. Each file's URL by name."""
    from specsweep.plots import tuning_plot

    folder = report_folder(tuning)
    files: dict[str, Any] = {"tuning": tuning_json(tuning)}
    if tuning.vllm_speculative_config is not None:
        files["vllm-speculative-config"] = tuning.vllm_speculative_config
    if tuning.sglang_adaptive_config is not None:
        files["sglang-adaptive-config"] = tuning.sglang_adaptive_config
    urls = {name: store.write_file(f"{folder}/{name}.json", (json.dumps(data, indent=2) + "\n").encode())
            for name, data in files.items()}
    urls["speedup"] = store.write_file(f"{folder}/speedup.png", tuning_plot(tuning))
    urls["report"] = store.write_file(f"{folder}/report.md", (tuning_markdown(tuning) + "\n").encode())
    return urls
