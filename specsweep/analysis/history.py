"""A comparison's answer kept over time, and read against the last one of the same kind (drift).

Every comparison appends one row to the ``history`` dataset (``HistoryRow``), keyed by what must not change for
two answers to be comparable: the hardware kind (GPU model and count, driver), the engine and its version, the
model, the draft (method, model, K), the workload (source and categories), the temperature and the speculative
configuration's launch settings. Only the key's *identity* (``key``) leaves out the engine version and driver: two
nights on one kind of machine with one model and settings are compared even across an engine upgrade, which is the
drift a team most wants to see, and the change is named.

Drift (``drift``) between the last row and this one is flagged when:
- the threshold moved beyond both bounds: each run's threshold lies outside the other's range of thresholds whose
  worst-case loss is within the margin (or within the setting's own bound, when that is wider);
- a level's ratio moved outside the earlier run's interval;
- acceptance of a category fell by more than its noise (twice the larger of the two runs' spreads over levels, and
  at least 5 %).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from specsweep.analysis.compare import Comparison
from specsweep.records import HistoryRow, RunRow

#: The smallest fall of acceptance flagged, as a fraction (below it: the run-to-run noise of a small sample).
ACCEPTANCE_FLOOR = 0.05
#: What two comparable runs may differ in (named when they do); the rest of the key must match.
CHANGEABLE = ("engine_version", "driver")


def _workload(run: RunRow) -> str:
    """The prompt set and what of it was sent: 'mt-bench', 'file:prompts.jsonl', 'synthetic:128->64'."""
    w = json.loads(run.workload_json or "{}")
    source = str(w.get("source") or "synthetic")
    if source == "synthetic":
        return f"synthetic:{w.get('input_len')}->{w.get('output_len')}"
    if source in ("file", "sharegpt") and w.get("prompts_file"):
        return f"{source}:{str(w['prompts_file']).rsplit('/', 1)[-1]}"
    phases = w.get("phases")
    return source + (f":{'/'.join(map(str, phases))}" if phases else "")


def _settings(run: RunRow) -> str:
    """The launch command with what differs between two starts of one configuration taken out: its port, and the
    simulator's own knobs (``--sim-*``, ``--startup-s``: they play the hardware and the engine's build, which a
    comparison reads against the last, not the configuration)."""
    words = (run.command or "").split()
    out: list[str] = []
    skip = False
    for i, w in enumerate(words):
        if skip:
            skip = False
            continue
        if w.startswith("--sim-") or w == "--startup-s":
            skip = "=" not in w
            continue
        out.append("PORT" if i and words[i - 1] in ("--port", "-p") else w)
    return " ".join(out)


def identity(row: HistoryRow) -> str:
    """The key two comparable rows share: everything of the key but the engine version and the driver."""
    parts = [row.gpu or "", str(row.gpu_count or ""), row.engine, row.model or "", row.draft, row.workload,
             f"{row.temperature:g}", row.settings]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def _thresholds(comp: Comparison) -> tuple[int | None, int | None, bool]:
    """The lowest and highest thresholds (a level's concurrency; None past the last level: keep it on) whose
    worst-case loss over the comparison's intervals is within the margin, or within the setting's own bound; and
    whether there is such a range at all (False: no interval was bounded, or none fits)."""
    levels = [lv for lv in comp.levels if lv.ratio_low is not None and lv.ratio_high is not None]
    if not levels:
        return None, None, False
    on = [max(0.0, 1 - (lv.ratio_low or 0.0)) for lv in levels]
    off = [max(0.0, 1 - 1 / (lv.ratio_high or math.inf)) for lv in levels]
    bound = getattr(comp.recommendation, "worst_case_loss", None)
    limit = max(comp.margin, bound if isinstance(bound, float) else 0.0) + 1e-9
    fits = [t for t in range(len(levels) + 1) if max([*on[:t], *off[t:]], default=0.0) <= limit]
    if not fits:
        return None, None, False

    def at(t: int) -> int | None:
        return int(levels[t].concurrency) if t < len(levels) else None  # concurrency comparisons only
    return at(min(fits)), at(max(fits)), True


def history_row(comp: Comparison, base: RunRow, spec: RunRow, *, date: str, temperature: float = 0.0) -> HistoryRow:
    """The comparison's row of the history dataset."""
    draft = "none"
    if comp.speculation is not None:
        s = comp.speculation
        draft = f"{s.method} {s.model or ''} K={s.num_speculative_tokens}".replace("  ", " ")
    low, high, ranged = _thresholds(comp)
    acceptance = {}
    if comp.traffic is not None:
        by_category: dict[str, list[float]] = {}
        for lv in comp.traffic.levels:
            if lv.accept_length is not None:
                by_category.setdefault(lv.category, []).append(lv.accept_length)
        acceptance = {c: {"mean": statistics.fmean(v), "spread": statistics.pstdev(v) if len(v) > 1 else 0.0}
                      for c, v in by_category.items()}
    elif any(lv.speculative_accept_length is not None for lv in comp.levels):
        values = [lv.speculative_accept_length for lv in comp.levels if lv.speculative_accept_length is not None]
        acceptance = {"all": {"mean": statistics.fmean(values),
                              "spread": statistics.pstdev(values) if len(values) > 1 else 0.0}}
    rec = comp.recommendation
    row = HistoryRow(
        key="", date=date, baseline_run_id=comp.baseline_run_id or base.config_name,
        speculative_run_id=comp.speculative_run_id or spec.config_name, flow_run_id=spec.flow_run_id,
        host=spec.host, gpu=spec.gpu, gpu_count=spec.gpu_count, driver=spec.driver, engine=spec.engine,
        engine_version=spec.engine_version, model=spec.model, draft=draft,
        workload=_workload(spec), temperature=temperature, settings=_settings(spec),
        status=rec.status, off_from=None if rec.speculation_off_from is None else int(rec.speculation_off_from),
        worst_case_loss=getattr(rec, "worst_case_loss", None), threshold_low=low, threshold_high=high,
        threshold_ranged=ranged,
        margin=comp.margin,
        levels_json=json.dumps([{"concurrency": lv.concurrency, "ratio": lv.ratio, "low": lv.ratio_low,
                                 "high": lv.ratio_high, "verdict": lv.verdict} for lv in comp.levels]),
        acceptance_json=json.dumps(acceptance, sort_keys=True))
    return row.model_copy(update={"key": identity(row)})


class Drift(BaseModel):
    """What moved between the last comparable run and this one, and what differs between them."""

    previous: str = Field(description="The earlier run: '<baseline run id>--<speculative run id>' (its date).")
    threshold: str | None = Field(None, description="The threshold moved beyond both runs' bounds.")
    levels: list[str] = Field(default_factory=list, description="Levels whose ratio left the earlier interval.")
    acceptance: list[str] = Field(default_factory=list, description="Categories whose acceptance fell beyond noise.")
    changed: list[str] = Field(default_factory=list, description="What differs between the two runs.")

    @property
    def flagged(self) -> bool:
        return bool(self.threshold or self.levels or self.acceptance)

    def summary(self) -> str:
        what = [x for x in ([self.threshold] if self.threshold else []) + self.levels + self.acceptance]
        since = f"since {self.previous}" + (f" ({'; '.join(self.changed)})" if self.changed else " (nothing in the key "
                                                                                                 "changed)")
        return ("Drift " + since + ": " + "; ".join(what)) if what else "No drift " + since


def _inside(t: int | None, low: int | None, high: int | None) -> bool:
    """Whether threshold ``t`` (None: past the last level) lies in [low, high] (None: past the last level)."""
    big = math.inf
    value, lo, hi = big if t is None else t, big if low is None else low, big if high is None else high
    return lo <= value <= hi


def _label(t: int | None) -> str:
    return "keep it on" if t is None else f"off from {t}"


def drift(previous: HistoryRow, current: HistoryRow) -> Drift:
    """``current`` read against ``previous`` (the last row of the same identity)."""
    out = Drift(previous=f"{previous.baseline_run_id}--{previous.speculative_run_id} ({previous.date[:10]})")
    # A run whose intervals bound no range of thresholds says nothing about where the threshold may lie.
    if previous.threshold_ranged and current.threshold_ranged and \
            not _inside(current.off_from, previous.threshold_low, previous.threshold_high) and \
            not _inside(previous.off_from, current.threshold_low, current.threshold_high):
        out.threshold = (f"threshold {_label(previous.off_from)} -> {_label(current.off_from)}, beyond both runs' "
                         f"bounds ({_range(previous)} then {_range(current)})")
    before = {lv["concurrency"]: lv for lv in json.loads(previous.levels_json)}
    for lv in json.loads(current.levels_json):
        was = before.get(lv["concurrency"])
        if was is None or was.get("low") is None or was.get("high") is None:
            continue
        if not was["low"] <= lv["ratio"] <= was["high"]:
            out.levels.append(f"C={lv['concurrency']}: x{lv['ratio']:.2f}, outside the last run's "
                              f"[{was['low']:.2f}, {was['high']:.2f}]")
    accepted_before, accepted_now = json.loads(previous.acceptance_json), json.loads(current.acceptance_json)
    for category, now in sorted(accepted_now.items()):
        was = accepted_before.get(category)
        if not was or not was["mean"]:
            continue
        noise = max(ACCEPTANCE_FLOOR, 2 * max(was["spread"], now["spread"]) / was["mean"])
        if now["mean"] < was["mean"] * (1 - noise):
            out.acceptance.append(f"acceptance of {category}: {now['mean']:.2f} tokens per step, down from "
                                  f"{was['mean']:.2f} (more than its noise, {noise:.0%})")
    out.changed = [f"{name}: {getattr(previous, name)} -> {getattr(current, name)}" for name in CHANGEABLE
                   if getattr(previous, name) != getattr(current, name)]
    return out


def _range(row: HistoryRow) -> str:
    if not row.threshold_ranged:
        return "unbounded"
    return f"{_label(row.threshold_low)} to {_label(row.threshold_high)}"


def last_comparable(rows: Sequence[HistoryRow], current: HistoryRow) -> HistoryRow | None:
    """The latest row of ``current``'s identity before it (by date), else None."""
    earlier = [r for r in rows if r.key == current.key and r.date < current.date
               and (r.baseline_run_id, r.speculative_run_id) != (current.baseline_run_id, current.speculative_run_id)]
    return max(earlier, key=lambda r: r.date) if earlier else None


def history_table(rows: Sequence[HistoryRow]) -> list[dict[str, Any]]:
    """The history as a table for people: one line per comparison, oldest first."""
    out = []
    for r in sorted(rows, key=lambda r: r.date):
        levels = json.loads(r.levels_json)
        out.append({"date": r.date[:16], "kind": kind_label(r), "engine": r.engine_version or r.engine,
                    "model": r.model or "", "answer": _label(r.off_from), "status": r.status,
                    "worst case": "" if r.worst_case_loss is None else f"{r.worst_case_loss:.1%}",
                    "ratios": " ".join(f"{lv['concurrency']}:x{lv['ratio']:.2f}" for lv in levels)})
    return out


def kind_label(row: HistoryRow) -> str:
    """The hardware kind in words: '8x NVIDIA H100 (driver 550.54)'; 'CPU' where no GPU was seen."""
    if not row.gpu or row.gpu.startswith("none"):
        return "CPU"
    return f"{row.gpu_count or 1}x {row.gpu}" + (f" (driver {row.driver})" if row.driver else "")
