"""Tables for people: the per-level summary, and a comparison's and a grid's answer, on a terminal."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from specsweep.analysis.compare import Comparison
from specsweep.analysis.recommend import level_words
from specsweep.analysis.traffic import MIX, TrafficView
from specsweep.analysis.tuning import Tuning
from specsweep.analysis.verify import Verification
from specsweep.records import BlockRow
from specsweep.reports.markdown import acceptance_words, batch_cell, batch_span, configure_lines, headline, status_line


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


SUMMARY_COLUMNS = [
    ("level", None),
    ("ok/failed", None),
    ("output tok/s", "output_tokens_per_s"),
    ("peak tok/s", "peak_output_tokens_per_s"),
    ("req/s", "request_throughput_per_s"),
    ("TTFT p50 ms", "ttft_ms_median"),
    ("TTFT p99 ms", "ttft_ms_p99"),
    ("ITL p50 ms", "itl_ms_median"),
    ("TPOT p50 ms", "tpot_ms_median"),
    ("E2E p50 ms", "e2e_ms_median"),
    ("accept len", "spec_accept_length"),
    ("accept rate", "spec_acceptance_rate"),
    ("conc.", "achieved_concurrency"),
]


def summary_rows(rows: Sequence[BlockRow]) -> list[list[str]]:
    out = []
    for r in rows:
        cells = []
        for name, key in SUMMARY_COLUMNS:
            if name == "level":
                label = r.label + (f" #{r.repeat}" if r.repeat else "")
                cells.append(label + (" (set aside)" if r.disturbed else " (never reached)" if r.reached_concurrency
                                      is False else " (client-bound)" if r.client_bottleneck else ""))
            elif name == "ok/failed":
                cells.append(f"{r.completed}/{r.failed}")
            else:
                assert key is not None
                cells.append(_fmt(getattr(r, key), 2 if key.startswith("spec") else 1))
        out.append(cells)
    return out


def summary_table(rows: Sequence[BlockRow], title: str = "") -> Table:
    table = Table(title=title)
    for name, _ in SUMMARY_COLUMNS:
        table.add_column(name, justify="left" if name == "level" else "right")
    for cells in summary_rows(rows):
        table.add_row(*cells)
    return table


def console() -> Console:
    """A console for the answer: the terminal's width, or 200 columns when the output is not a terminal."""
    return Console(width=None if sys.stdout.isatty() else 200)


def print_comparison(comp: Comparison, out: Console | None = None) -> None:
    """The comparison on a terminal: the per-level table, the answer, what to configure."""
    table = Table(title=f"speculation: {comp.speculative} vs {comp.baseline}")
    rate = comp.mode == "rate"  # a request rate's figures: the speed a request saw
    for col in ("requests/s" if rate else "concurrency", "batch b/s (max)",
                *(("baseline tok/s/req", "spec. tok/s/req") if rate else ("baseline tok/s", "speculative tok/s")),
                "ratio [interval]", "verdict", "blocks",
                "TTFT p50 ms (base/spec)", "TPOT p50 ms (base/spec)", "accept"):
        table.add_column(col, justify="left" if col == "verdict" else "right")
    for r in comp.levels:
        ci = f" [{r.ratio_low:.2f}-{r.ratio_high:.2f}]" if r.ratio_low is not None and r.ratio_high is not None else ""
        acc = (f"{r.speculative_accept_length:.2f}" if r.speculative_accept_length else
               f"{r.speculative_acceptance_rate:.0%}" if r.speculative_acceptance_rate else "-")
        table.add_row(f"{r.concurrency:g}", batch_cell(r.baseline_batch, r.speculative_batch, r.speculative_batch_max),
                      f"{r.baseline_tokens_per_s:,.1f}", f"{r.speculative_tokens_per_s:,.1f}",
                      f"{r.ratio:.2f}{ci}", r.verdict, f"{r.blocks[0]}/{r.blocks[1]}",
                      f"{r.baseline_ttft_ms or 0:,.1f} / {r.speculative_ttft_ms or 0:,.1f}",
                      f"{r.baseline_tpot_ms or 0:.2f} / {r.speculative_tpot_ms or 0:.2f}", acc)
    out = out or console()
    rec = comp.recommendation
    out.print(headline(rec), style="bold", markup=False, soft_wrap=True)
    out.print(table)
    out.print(status_line(rec, comp.margin), markup=False)
    _configure(out, configure_lines(rec, comp.setting))
    pol = rec.projected_tokens_per_s
    what = "mean tok/s per request" if comp.mode == "rate" else "mean output tok/s"
    out.print(f"{what} over the levels: always off {pol.get('always_off', 0):,.1f}, always on "
              f"{pol.get('always_on', 0):,.1f}"
              + (f", as recommended {pol['as_recommended']:,.1f}" if "as_recommended" in pol else ""))
    if comp.slo is not None:
        out.print(comp.slo.summary, markup=False)
        out.print("goodput tok/s within the targets (base/spec): " + ", ".join(
            f"{lv.concurrency}: {lv.baseline.goodput_tokens_per_s:,.0f}/{lv.speculative.goodput_tokens_per_s:,.0f}"
            for lv in comp.slo.levels), markup=False)
    if comp.traffic is not None and any(lv.category not in (MIX, "(none)") for lv in comp.traffic.levels):
        _print_categories(out, comp.traffic)
    if comp.verification is not None:
        _print_verification(out, comp.verification)
    for note in comp.notes:
        out.print(f"note: {note}", markup=False)


def _print_categories(out: Console, view: TrafficView) -> None:
    cs = sorted({lv.concurrency for lv in view.levels})
    table = Table(title=f"by category ({view.source} prompts): speculative / baseline per-request speed, verdict")
    for col in ("category", *(f"C={c}" for c in cs), "answer"):
        table.add_column(col, justify="left")
    cells = {(lv.category, lv.concurrency): lv for lv in view.levels}
    for cat in view.categories:
        row = []
        for c in cs:
            lv = cells.get((cat, c))
            row.append("-" if lv is None else f"{lv.ratio:.2f} {lv.verdict}"
                       + (f" ({words})" if (words := acceptance_words(lv, "")) else ""))
        rec = view.recommendations.get(cat)
        table.add_row(cat, *row, headline(rec) if rec is not None else "-")
    out.print(table)


def _print_verification(out: Console, v: Verification) -> None:
    table = Table(title="verify: the recommended setting, run by the engine, against both fixed policies")
    for col in ("level", "recommended", "always off tok/s", "always on tok/s", "as recommended tok/s",
                "vs better fixed", "result"):
        table.add_column(col, justify="left" if col in ("recommended", "result") else "right")
    for lv in v.levels:
        ci = f" [{lv.ratio_low:.2f}-{lv.ratio_high:.2f}]" if lv.ratio_low is not None and lv.ratio_high is not None \
            else ""
        table.add_row(level_words(lv.concurrency), "on" if lv.speculates else "off", f"{lv.off_tokens_per_s:,.1f}",
                      f"{lv.on_tokens_per_s:,.1f}", f"{lv.schedule_tokens_per_s:,.1f}",
                      f"{lv.ratio:.2f}{ci} of {lv.better_fixed}", lv.result)
    out.print(table)
    out.print(v.summary, style="bold", markup=False)
    if v.against_controller is not None:
        own = Table(title="verify: the measured schedule against the engine's own controller")
        for col in ("level", "as recommended tok/s", "controller tok/s", "recommended / controller", "result"):
            own.add_column(col, justify="left" if col == "result" else "right")
        for lv in v.levels:
            if (c := lv.controller) is not None:
                ci = f" [{c.ratio_low:.2f}-{c.ratio_high:.2f}]" if c.ratio_low is not None and c.ratio_high is not None \
                    else ""
                own.add_row(level_words(lv.concurrency), f"{lv.schedule_tokens_per_s:,.1f}",
                            f"{c.controller_tokens_per_s:,.1f}", f"{c.ratio:.2f}{ci}", c.result)
        out.print(own)
        out.print(v.controller_summary, style="bold", markup=False)


def _configure(out: Console, lines: list[str]) -> None:
    for line in lines:
        # Never wrapped: flags are copied from here.
        out.print(line.replace("```\n", "").replace("\n```", "").replace(":\n\n", ":\n  "), markup=False,
                  soft_wrap=True)


def print_tuning(tuning: Tuning, out: Console | None = None) -> None:
    """A grid's answer on a terminal: each setting's ratio per level, the best, the setting per range."""
    labels = [p.label for p in tuning.points]
    table = Table(title=f"speculation grid: {', '.join(labels)} vs {tuning.baseline}")
    for col in ("concurrency", "batch (max)", "baseline tok/s", *labels, "best"):
        table.add_column(col, justify="left" if col == "best" else "right")
    for lv in tuning.levels:
        cells = [f"{'[bold]' if k == lv.best else ''}x{p.ratio:.2f} {p.verdict}{'[/bold]' if k == lv.best else ''}"
                 for k, p in ((label, lv.points[label]) for label in labels)]
        best = lv.points[lv.best]
        table.add_row(str(lv.concurrency), batch_cell(None, best.batch_mean, best.batch_max),
                      f"{lv.baseline_tokens_per_s:,.1f}", *cells, lv.best)
    out = out or console()
    rec = tuning.recommendation
    out.print(headline(rec), style="bold", markup=False, soft_wrap=True)
    out.print(table)
    for r in tuning.ranges:
        out.print(f"  {batch_span(r.batch_from, r.batch_to)} running requests: {r.point or 'off (baseline)'} (K={r.k})")
    if tuning.setting is not None and tuning.setting.file_name is not None:
        out.print(f"{tuning.setting.file_name}: {json.dumps(tuning.setting.content)}", markup=False)
        _configure(out, [f"flags: {tuning.setting.flags}"])
    for note in tuning.notes:
        out.print(f"note: {note}", markup=False)
