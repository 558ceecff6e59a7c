"""The report folders under the results root, written beside the data:

    reports/<baseline run>--<speculative run>/   a comparison: report.md, recommendation.json, the
                                                 the engine's own file, where it has a per-batch switch, plots,
                                                 speculation_profile.json where the engine answered
                                                 per-request acceptance histograms
    reports/tune-<baseline run>/                 a grid: report.md, tuning.json, the engine's file, speedup.png
"""

from __future__ import annotations

import json
from typing import Any

from specsweep.acceptance import speculation_profile
from specsweep.analysis.compare import Comparison
from specsweep.analysis.tuning import Tuning
from specsweep.analysis.verify import ControllerCheck
from specsweep.reports.markdown import (
    PHASE_COLUMNS,
    comparison_markdown,
    energy_levels,
    energy_markdown,
    phases_markdown,
    recovery_markdown,
    tuning_markdown,
)
from specsweep.reports.plots import comparison_plots, tuning_plot
from specsweep.results import ResultsStore, comparison_folder, tuning_folder


def recommendation_json(comp: Comparison) -> dict[str, Any]:
    rec = comp.recommendation
    return {
        "decision": rec.decision,
        "status": rec.status,
        "speculation_off_from": rec.speculation_off_from,
        "worst_case_loss": round(rec.worst_case_loss, 4) if rec.worst_case_loss is not None else None,
        "worst_case_level": rec.worst_case_level,
        "more_rounds": rec.more_rounds,
        "more_minutes": round(rec.more_minutes, 1) if rec.more_minutes is not None else None,
        "alpha": comp.alpha,
        "off_from_batch": rec.off_from_batch,
        "batch_measured": rec.batch_measured,
        "reason": rec.reason,
        "measure_next": rec.measure_next,
        "unanswered": rec.unanswered,
        "margin": comp.margin,
        "design": comp.design,
        "mode": comp.mode,  # concurrency: levels in requests in flight; rate: requests a second (speeds per request)
        "baseline": {"name": comp.baseline, "run_id": comp.baseline_run_id},
        "speculative": {"name": comp.speculative, "run_id": comp.speculative_run_id},
        "levels": [{"concurrency": lv.concurrency, "verdict": lv.verdict, "ratio": round(lv.ratio, 4),
                    "interval": [round(lv.ratio_low, 4), round(lv.ratio_high, 4)] if lv.ratio_low and lv.ratio_high
                    else None, "confidence": round(lv.confidence, 4),
                    "requests": {"baseline": lv.requests[0], "speculative": lv.requests[1]},
                    "blocks": {"baseline": lv.blocks[0], "speculative": lv.blocks[1]},
                    "running_batch": {"baseline": lv.baseline_batch, "speculative": lv.speculative_batch,
                                      "speculative_max": lv.speculative_batch_max}} for lv in comp.levels],
        "projected_tokens_per_s": {k: round(v, 2) for k, v in rec.projected_tokens_per_s.items()},
        "engine_setting": comp.setting.model_dump(mode="json") if comp.setting is not None else None,
        "verified": verification_json(comp),
        "lossless_check": {"result": comp.traffic.lossless_check, "lossy_verifier": comp.traffic.lossy_verifier,
                           "levels": [lv.model_dump() for lv in comp.traffic.lossless]}
        if comp.traffic is not None else None,
        "slo": comp.slo.model_dump(mode="json") if comp.slo is not None else None,
    }


def verification_json(comp: Comparison) -> dict[str, Any]:
    """Whether the engine ran the recommendation, and how it did against the better fixed policy per level."""
    v = comp.verification
    if v is None:
        return {"status": "not run"}
    return {"status": v.status, "summary": v.summary, "setting": v.setting, "runs": v.runs,
            "mean_tokens_per_s": {k: round(x, 2) for k, x in v.mean_tokens_per_s.items()},
            "levels": [{"concurrency": lv.concurrency, "speculates": lv.speculates, "result": lv.result,
                        "better_fixed": lv.better_fixed, "ratio": round(lv.ratio, 4),
                        "interval": [round(lv.ratio_low, 4), round(lv.ratio_high, 4)]
                        if lv.ratio_low is not None and lv.ratio_high is not None else None,
                        "tokens_per_s": {"off": round(lv.off_tokens_per_s, 2), "on": round(lv.on_tokens_per_s, 2),
                                         "schedule": round(lv.schedule_tokens_per_s, 2),
                                         **({"controller": round(lv.controller.controller_tokens_per_s, 2)}
                                            if lv.controller is not None else {})}, "blocks": lv.blocks,
                        **({"against_controller": _against(lv.controller)} if lv.controller is not None else {})}
                       for lv in v.levels],
            "setting_cost": v.setting_cost.model_dump(mode="json") if v.setting_cost is not None else None,
            "against_controller": None if v.against_controller is None else {
                "result": v.against_controller, "summary": v.controller_summary, "setting": v.controller}}


def _against(c: ControllerCheck) -> dict[str, Any]:
    """The schedule against the engine's own controller at one level."""
    return {"result": c.result, "ratio": round(c.ratio, 4),
            "interval": [round(c.ratio_low, 4), round(c.ratio_high, 4)]
            if c.ratio_low is not None and c.ratio_high is not None else None,
            "controller_drafted_per_step": None if c.drafted_per_step is None else round(c.drafted_per_step, 3),
            "controller_tier_mean": None if c.tier_mean is None else round(c.tier_mean, 3)}


def tuning_json(tuning: Tuning) -> dict[str, Any]:
    return {
        "decision": tuning.recommendation.decision, "engine": tuning.engine, "status": tuning.recommendation.status,
        "worst_case_loss": tuning.recommendation.worst_case_loss,
        "worst_case_level": tuning.recommendation.worst_case_level,
        "speculation_off_from": tuning.recommendation.speculation_off_from, "reason": tuning.recommendation.reason,
        "measure_next": tuning.recommendation.measure_next, "unanswered": tuning.recommendation.unanswered,
        "margin": tuning.margin,
        "baseline": {"name": tuning.baseline, "run_id": tuning.baseline_run_id},
        "points": [{"label": p.label, "values": p.values, "k": p.k, "run_id": tuning.run_ids.get(p.label)}
                   for p in tuning.points],
        "ranges": [r.model_dump() for r in tuning.ranges],
        "levels": [{"concurrency": lv.concurrency, "best": lv.best, "verdict": lv.verdict, "ratio": round(lv.ratio, 4),
                    "points": {k: {"ratio": round(p.ratio, 4), "verdict": p.verdict,
                                   "tokens_per_s": round(p.tokens_per_s, 2)} for k, p in lv.points.items()}}
                   for lv in tuning.levels],
        "engine_setting": tuning.setting.model_dump(mode="json") if tuning.setting is not None else None,
    }


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode()


def _engine_file(store: ResultsStore, folder: str, urls: dict[str, str], setting: Any) -> None:
    if setting is not None and setting.file_name is not None:
        urls[setting.file_name.removesuffix(".json")] = store.write_file(f"{folder}/{setting.file_name}",
                                                                         _json(setting.content))


def write_comparison_report(comp: Comparison, store: ResultsStore, plots: dict[str, bytes] | None = None) -> dict[str, str]:
    """The comparison's report folder. Returns each file's URL by name."""
    folder = comparison_folder(comp.baseline_run_id, comp.speculative_run_id)
    plots = comparison_plots(comp) if plots is None else plots
    urls = {name: store.write_file(f"{folder}/{name}.png", png) for name, png in plots.items()}
    energy = _energy(comp, store)
    urls["recommendation"] = store.write_file(f"{folder}/recommendation.json", _json(
        recommendation_json(comp) | ({"energy": energy} if energy else {})))
    _engine_file(store, folder, urls, comp.setting)
    if (profile := _profile(comp, store)) is not None:
        urls["speculation_profile"] = store.write_file(f"{folder}/speculation_profile.json", _json(profile))
    text = "\n\n".join([comparison_markdown(comp), *energy_markdown(energy), *_phases(comp, store)])
    urls["report"] = store.write_file(f"{folder}/report.md", (text + "\n").encode())
    return urls


#: The request columns the acceptance profile reads.
PROFILE_COLUMNS = ("warmup", "category", "spec_accept_histogram", "spec_accept_length", "spec_verify_ct")


def _profile(comp: Comparison, store: ResultsStore) -> dict[str, Any] | None:
    """The speculative configuration's acceptance profile, where its engine answered per-request histograms."""
    if not comp.speculative_run_id:
        return None
    try:
        rows = store.request_fields(comp.speculative_run_id, PROFILE_COLUMNS)
    except OSError:
        return None
    spec = comp.speculation
    return speculation_profile(rows, configuration=comp.speculative, method=spec.method if spec else None,
                               eagle_topk=spec.eagle_topk if spec else None)


def _phases(comp: Comparison, store: ResultsStore) -> list[str]:
    """The phases table, where the runs' requests were sent in phases."""
    if not comp.baseline_run_id or not comp.speculative_run_id:
        return []
    try:
        parts = phases_markdown(store.request_fields(comp.baseline_run_id, PHASE_COLUMNS),
                                store.request_fields(comp.speculative_run_id, PHASE_COLUMNS))
        v = comp.verification
        if parts and v is not None and v.runs:  # the verify stage's arms after each shift, too
            parts += recovery_markdown({arm: store.request_fields(rid, PHASE_COLUMNS) for arm, rid in v.runs.items()})
        return parts
    except OSError:
        return []


def _energy(comp: Comparison, store: ResultsStore) -> list[dict[str, float | int | None]]:
    """Each level's GPU energy from the two runs' stored rows (nothing where a run is not in the store)."""
    if not comp.baseline_run_id or not comp.speculative_run_id:
        return []
    try:
        return energy_levels(store.level_rows(comp.baseline_run_id), store.level_rows(comp.speculative_run_id))
    except OSError:
        return []


def write_tuning_report(tuning: Tuning, store: ResultsStore, plot: bytes | None = None) -> dict[str, str]:
    """The tuning's report folder: report.md, tuning.json, the engine's file, the plot. Each file's URL by name."""
    folder = tuning_folder(tuning.baseline_run_id)
    urls = {"tuning": store.write_file(f"{folder}/tuning.json", _json(tuning_json(tuning)))}
    _engine_file(store, folder, urls, tuning.setting)
    urls["speedup"] = store.write_file(f"{folder}/speedup.png", tuning_plot(tuning) if plot is None else plot)
    urls["report"] = store.write_file(f"{folder}/report.md", (tuning_markdown(tuning) + "\n").encode())
    return urls
