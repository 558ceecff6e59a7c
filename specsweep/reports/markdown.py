"""A comparison's and a grid's answer as markdown: the report a user reads (report.md, the artifact)."""

from __future__ import annotations

from collections.abc import Sequence

from specsweep import engines
from specsweep.analysis.compare import Comparison
from specsweep.analysis.recommend import Recommendation
from specsweep.analysis.tuning import Tuning
from specsweep.engines import PerBatchSetting
from specsweep.engines.base import MAX_BATCH


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def headline(rec: Recommendation, summary: str | None = None) -> str:
    """The answer's first line: "Decided: ..." or "Undetermined: ..." (the reason says the rest)."""
    return f"{'Decided' if rec.status == 'decided' else 'Undetermined'}: {summary or rec.reason}"


def configure_lines(rec: Recommendation, setting: PerBatchSetting | None) -> list[str]:
    """What to give the engine, in words and flags."""
    if rec.status != "decided":
        return ["No engine setting is given while the answer is undetermined: measure the levels named above first "
                "(a larger decision budget)."]
    lines = []
    if setting is not None and setting.file_name is not None:
        label = engines.get(setting.engine).label
        lines.append(f"{label} (`{setting.file_name}`):\n\n```\n{setting.flags or ''}\n```")
    if setting is not None:
        lines += list(setting.notes)
    off = rec.speculation_off_from
    if off is not None:
        lines.append(f"Engines without a per-batch switch: route to the baseline deployment once {off} or more requests "
                     "are in flight, to the speculative one below.")
    return lines


def _f(x: float | None, d: int = 1) -> str:
    return "-" if x is None else f"{x:,.{d}f}"


def comparison_markdown(comp: Comparison) -> str:
    rows = []
    for r in comp.levels:
        ci = f" [{r.ratio_low:.2f}, {r.ratio_high:.2f}]" if r.ratio_low is not None and r.ratio_high is not None else ""
        rows.append([str(r.concurrency), _f(r.baseline_tokens_per_s), _f(r.speculative_tokens_per_s),
                     f"{r.ratio:.2f}{ci}", r.verdict, f"{r.blocks[0]}/{r.blocks[1]}", _f(r.baseline_ttft_ms),
                     _f(r.speculative_ttft_ms), _f(r.baseline_tpot_ms, 2), _f(r.speculative_tpot_ms, 2),
                     _f(r.speculative_accept_length, 2), _f(r.speculative_acceptance_rate, 2)])
    table = markdown_table(
        ["concurrency", "baseline tok/s", "speculative tok/s", "ratio [interval]", "verdict", "blocks b/s",
         "baseline TTFT p50 ms", "spec. TTFT p50 ms", "baseline TPOT p50 ms", "spec. TPOT p50 ms", "accept length",
         "acceptance rate"], rows)
    rec = comp.recommendation
    pol = rec.projected_tokens_per_s
    policies = markdown_table(["policy", "mean output tok/s over the levels"], [
        ["always off (baseline)", _f(pol.get("always_off"))], ["always on (speculative)", _f(pol.get("always_on"))],
        ["as recommended", _f(pol.get("as_recommended")) if "as_recommended" in pol else "- (undetermined)"]])
    parts = [
        f"## Speculation: {comp.speculative} vs {comp.baseline}",
        f"**{headline(rec)}**",
        f"Speculation off from: {rec.speculation_off_from if rec.speculation_off_from is not None else '-'}"
        + (f"; measure next: {', '.join(map(str, rec.measure_next))}" if rec.measure_next else ""),
        table,
        f"Verdicts: faster / slower when the interval of the ratio lies above / below 1; equivalent when it lies within "
        f"±{comp.margin:.0%}; undetermined otherwise. Intervals are simultaneous over each level's looks "
        f"({comp.levels[0].confidence:.1%} per look); blocks were "
        f"{'paired (alternate design)' if comp.levels[0].paired else 'not paired (sequential design)'}.",
        "### What to configure",
        *configure_lines(rec, comp.setting),
        "### Projected throughput",
        policies,
    ]
    if comp.notes:
        parts.append("### Notes\n" + "\n".join(f"- {n}" for n in comp.notes))
    return "\n\n".join(parts)


def batch_span(batch_from: int, batch_to: int) -> str:
    return f"{batch_from}-{batch_to}" if batch_to < MAX_BATCH else f"{batch_from}+"


def tuning_markdown(tuning: Tuning) -> str:
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
    parts = [f"## Speculation grid on {engines.get(tuning.engine).label}: {', '.join(labels)} vs {tuning.baseline}",
             f"**{headline(rec, tuning.summary)}**",
             table,
             f"Each cell: the point's throughput / the baseline's, with its interval, and its verdict (±{tuning.margin:.0%}"
             " counts as equivalent). The best point per level is in bold: the best verdict, then the highest "
             "throughput."]
    if tuning.ranges:
        parts.append("### Setting per batch size\n\n" + markdown_table(
            ["running requests", "setting", "K"],
            [[batch_span(r.batch_from, r.batch_to), r.point or "off (baseline)", str(r.k)] for r in tuning.ranges]))
    parts.append("### What to configure")
    setting = tuning.setting.model_copy(update={"notes": ()}) if tuning.setting is not None else None
    parts += [line for line in configure_lines(rec, setting) if not line.startswith("Engines without")]
    if tuning.notes:
        parts.append("### Notes\n" + "\n".join(f"- {n}" for n in tuning.notes))
    return "\n\n".join(parts)
