"""A comparison's and a grid's answer as markdown: the report a user reads (report.md, the artifact)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from specsweep import engines
from specsweep.analysis.compare import Comparison
from specsweep.analysis.recommend import Recommendation, level_label, level_words, pct
from specsweep.analysis.slo import Side, SLOView
from specsweep.analysis.traffic import CategoryLevel, TrafficView
from specsweep.analysis.tuning import Tuning
from specsweep.analysis.verify import Verification
from specsweep.engines import PerBatchSetting
from specsweep.engines.base import MAX_BATCH
from specsweep.records import BlockRow


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def headline(rec: Recommendation) -> str:
    """The answer's first line: the decision in one sentence (the setting, its worst case, what would settle it)."""
    return rec.decision


def status_line(rec: Recommendation, margin: float) -> str:
    """The status and bound in words, under the first line."""
    bound = pct(rec.worst_case_loss) if rec.worst_case_loss is not None else "not bounded"
    what = (f"within the {pct(margin)} margin" if rec.status == "decided" else
            f"beyond the {pct(margin)} margin: the best setting the measurements allow, deployable, with its bound")
    at = level_words(rec.worst_case_level) if rec.worst_case_level is not None else "-"
    return f"Status: {rec.status} (worst-case loss {bound} at {at}, {what})" \
        + (f"; measure next: {', '.join(map(level_words, rec.measure_next))}" if rec.measure_next else "") + "."


def configure_lines(rec: Recommendation, setting: PerBatchSetting | None) -> list[str]:
    """What to give the engine, in words and flags (decided or the best available: it says which)."""
    lines = [] if rec.status == "decided" else [
        f"Best available, not decided: this setting may give up {pct(rec.worst_case_loss)} at "
        f"{level_words(rec.worst_case_level or 0)} (worst case); it is still the one with the least worst-case loss."
        if rec.worst_case_loss is not None else
        "Best available, not decided: its worst-case loss is not bounded yet (too few rounds somewhere); it is "
        "chosen by the levels that are bounded and the point estimates."]
    if setting is not None and setting.file_name is not None:
        label = engines.get(setting.engine).label
        lines.append(f"{label} (`{setting.file_name}`):\n\n```\n{setting.flags or ''}\n```")
    if setting is not None:
        lines += list(setting.notes)
    # The router counts requests in flight, as the client's concurrency does; at request rates, as the engine counts
    # its batch. Not said again where the setting is itself the router's (its command says it).
    off = rec.speculation_off_from
    if isinstance(off, float):
        off = rec.off_from_batch
        if off is None:
            lines.append("No per-batch setting and no router threshold: a request rate is no batch size, and the engine "
                         "reported no running batch (no /metrics gauge). Measure where the engine reports it, or at "
                         "concurrency levels.")
    if off is not None and (setting is None or setting.route_off_from is None):
        lines.append(f"Engines without a per-batch switch: route to the baseline deployment once {off} or more requests "
                     "are in flight, to the speculative one below.")
    return lines


def _f(x: float | None, d: int = 1) -> str:
    return "-" if x is None else f"{x:,.{d}f}"


def batch_cell(baseline: float | None, speculative: float | None, speculative_max: float | None) -> str:
    """The running batch the engines reported at a level: mean of each, and the speculative one's largest."""
    if baseline is None and speculative is None:
        return "-"
    spec = _f(speculative) + (f" ({speculative_max:g})" if speculative_max is not None else "")
    return spec if baseline is None else f"{_f(baseline)} / {spec}"


def comparison_markdown(comp: Comparison) -> str:
    rows = []
    for r in comp.levels:
        ci = f" [{r.ratio_low:.2f}, {r.ratio_high:.2f}]" if r.ratio_low is not None and r.ratio_high is not None else ""
        rows.append([f"{r.concurrency:g}", batch_cell(r.baseline_batch, r.speculative_batch, r.speculative_batch_max),
                     _f(r.baseline_tokens_per_s), _f(r.speculative_tokens_per_s), f"{r.ratio:.2f}{ci}", r.verdict,
                     f"{r.blocks[0]}/{r.blocks[1]}", _f(r.baseline_ttft_ms), _f(r.speculative_ttft_ms),
                     _f(r.baseline_tpot_ms, 2), _f(r.speculative_tpot_ms, 2),
                     _f(r.speculative_accept_length, 2), _f(r.speculative_acceptance_rate, 2)])
    rate = comp.mode == "rate"
    table = markdown_table(
        ["requests/s" if rate else "concurrency", "running batch b/s (max)",
         *(["baseline tok/s per request", "spec. tok/s per request"] if rate else ["baseline tok/s", "speculative tok/s"]),
         "ratio [interval]", "verdict",
         "blocks b/s",
         "baseline TTFT p50 ms", "spec. TTFT p50 ms", "baseline TPOT p50 ms", "spec. TPOT p50 ms", "accept length",
         "acceptance rate"], rows)
    rec = comp.recommendation
    pol = rec.projected_tokens_per_s
    policies = markdown_table(["policy", "mean tok/s per request over the levels" if rate else
                               "mean output tok/s over the levels"], [
        ["always off (baseline)", _f(pol.get("always_off"))], ["always on (speculative)", _f(pol.get("always_on"))],
        ["as recommended", _f(pol.get("as_recommended"))]])
    parts = [
        f"**{headline(rec)}**",
        f"## Speculation: {comp.speculative} vs {comp.baseline}",
        status_line(rec, comp.margin),
        f"Speculation off from: {level_words(rec.speculation_off_from) if rec.speculation_off_from is not None else '-'}",
        table,
        *([("At request-rate levels both configurations are sent the same requests at the same moments and deliver "
            "the same tokens while they keep up: what is compared is the speed a request saw, its output tokens over "
            "its time from its scheduled send to its end (a server that falls behind the arrivals queues them and "
            "reads slower).")] if rate else []),
        f"Verdicts: faster / slower when the interval of the ratio lies above / below 1; equivalent when it lies within "
        f"±{comp.margin:.0%}; no gain when it lies below 1 + {comp.margin:.0%} (a gain beyond the margin is ruled out); "
        "undetermined otherwise (a gain is still possible, or too few rounds for a bounded interval). The setting is "
        "the policy (off from a level, keep it on, turn it off) with the least worst-case loss against the better "
        "fixed policy over these intervals. Intervals: the median of the rounds' ratios with its distribution-free "
        f"interval, simultaneous over the levels, looks and categories so that the answer as a whole holds at "
        f"{1 - comp.alpha:.0%} ({comp.levels[0].confidence:.2%} each); blocks were "
        f"{'paired (alternate design)' if comp.levels[0].paired else 'not paired (sequential design)'}. "
        "Running batch: the requests each engine reported running at once (its /metrics gauge, sampled while the "
        "level ran), mean for the baseline / the speculative engine, with the speculative engine's largest in "
        "brackets; engines switch speculation on this batch, not on the client's concurrency.",
        "### What to configure",
        *configure_lines(rec, comp.setting),
        "### Projected throughput",
        policies,
    ]
    if comp.speculation is not None and comp.speculation.lossy_verifier:
        parts.insert(1, f"**Lossy verifier ({comp.speculation.lossy_verifier})**: the speculative configuration does not "
                        "keep the target model's outputs; its speed is not that of lossless speculation.")
    parts += traffic_markdown(comp.traffic)
    parts += slo_markdown(comp.slo)
    parts += verification_markdown(comp.verification)
    if comp.notes:
        parts.append("### Notes\n" + "\n".join(f"- {n}" for n in comp.notes))
    return "\n\n".join(parts)


def _median(rows: Sequence[BlockRow], name: str) -> float | None:
    values = [v for r in rows if (v := getattr(r, name)) is not None]
    return statistics.median(values) if values else None


def energy_levels(baseline: Sequence[BlockRow], speculative: Sequence[BlockRow]) -> list[dict[str, float | int | None]]:
    """Per concurrency level, the GPU energy of each configuration (median over the blocks that count): joules
    per output token, the speculative one's per accepted draft token, and the mean power. Empty where no block
    had power readings."""
    def counted(rows: Sequence[BlockRow], c: int) -> list[BlockRow]:
        return [r for r in rows if r.concurrency == c and r.disturbed is None]

    levels = sorted({r.concurrency for r in [*baseline, *speculative] if r.concurrency is not None})
    out: list[dict[str, float | int | None]] = []
    for c in levels:
        b, sp = counted(baseline, c), counted(speculative, c)
        row: dict[str, float | int | None] = {
            "concurrency": c,
            "baseline_j_per_token": _median(b, "joules_per_output_token"),
            "speculative_j_per_token": _median(sp, "joules_per_output_token"),
            "speculative_j_per_accepted_token": _median(sp, "joules_per_accepted_token"),
            "baseline_power_w": _median(b, "gpu_power_mean_w"),
            "speculative_power_w": _median(sp, "gpu_power_mean_w"),
        }
        if row["baseline_j_per_token"] is not None or row["speculative_j_per_token"] is not None:
            out.append(row)
    return out


def energy_markdown(levels: Sequence[dict[str, float | int | None]]) -> list[str]:
    """The energy table of a comparison's report (nothing where no level had power readings)."""
    if not levels:
        return []
    rows = []
    for lv in levels:
        b, sp = lv["baseline_j_per_token"], lv["speculative_j_per_token"]
        ratio = f"{sp / b:.2f}" if isinstance(b, float) and isinstance(sp, float) and b > 0 else "-"
        rows.append([str(lv["concurrency"]), _f(b, 3), _f(sp, 3), ratio, _f(lv["speculative_j_per_accepted_token"], 3),
                     f"{_f(lv['baseline_power_w'])} / {_f(lv['speculative_power_w'])}"])
    return ["### Energy (GPU)",
            markdown_table(["concurrency", "baseline J/token", "speculative J/token", "speculative / baseline",
                            "spec. J/accepted draft token", "mean power W b/s"], rows),
            "Energy: the server's GPUs' power as nvidia-smi sampled it while each block ran (their sum, mean over "
            "the readings) times the block's measured span, per output token; median over the blocks that count. "
            "Per accepted draft token: the same energy over the drafts the target accepted. Sampled power, not "
            "metered energy: readings a second apart miss short peaks."]


#: The request columns the phases table reads.
PHASE_COLUMNS = ("warmup", "level_value", "repeat", "prompt_index", "phase", "category", "tpot_ms", "spec_draft_tokens",
                 "spec_verify_ct", "spec_accept_length", "output_tokens", "error_type")


Request = Mapping[str, Any]


def _drafts_per_step(rows: Sequence[Request]) -> float | None:
    pairs = [(int(r["spec_draft_tokens"]), int(r["spec_verify_ct"])) for r in rows
             if r.get("spec_draft_tokens") is not None and r.get("spec_verify_ct") is not None]
    steps = sum(v for _, v in pairs)
    return sum(d for d, _ in pairs) / steps if steps else None


def _accept_length(r: Request) -> float | None:
    """A request's accept length: the engine's own, else its output tokens per verify step."""
    if isinstance(x := r.get("spec_accept_length"), (int, float)) and x == x:  # not NaN
        return float(x)
    steps, out = r.get("spec_verify_ct"), r.get("output_tokens")
    return float(out) / float(steps) if steps and out else None


def phases_markdown(baseline: Sequence[Request], speculative: Sequence[Request]) -> list[str]:
    """Traffic that shifts (workload.phases): per level and phase, each configuration's per-request speed and the
    speculative engine's drafting in the phase's first half and its second (a controller that reacts to the
    shift changes between them). Nothing where the requests had no phases."""
    def measured(rows: Sequence[Request]) -> list[Request]:
        return [r for r in rows if not r.get("warmup") and r.get("phase") is not None and r.get("error_type") is None]

    base, spec = measured(baseline), measured(speculative)
    if not spec:
        return []
    keys = sorted({(float(r["level_value"]), int(r["phase"])) for r in spec})
    table = []
    for value, phase in keys:
        def of(rows: list[Request], value: float = value, phase: int = phase) -> list[Request]:
            return [r for r in rows if r["level_value"] == value and r["phase"] == phase]

        s_rows = sorted(of(spec), key=lambda r: (r["repeat"], r["prompt_index"]))
        blocks: dict[Any, list[Request]] = {}
        for r in s_rows:
            blocks.setdefault(r["repeat"], []).append(r)
        # Each block's phase in two halves, in the order its requests were sent.
        first = [r for rows in blocks.values() for r in rows[:len(rows) // 2]]
        second = [r for rows in blocks.values() for r in rows[len(rows) // 2:]]
        tpot = [[float(t) for r in rows if isinstance(t := r.get("tpot_ms"), (int, float))] for rows in (of(base), s_rows)]
        lengths = [x for r in s_rows if (x := _accept_length(r)) is not None]
        table.append([f"{value:g}", str(phase), str(s_rows[0].get("category") or "-"), str(len(s_rows)),
                      _f(statistics.median(tpot[0]), 2) if tpot[0] else "-",
                      _f(statistics.median(tpot[1]), 2) if tpot[1] else "-",
                      f"{_f(_drafts_per_step(first), 2)} -> {_f(_drafts_per_step(second), 2)}",
                      _f(statistics.fmean(lengths), 2) if lengths else "-"])
    return ["### Traffic that shifts (phases)",
            markdown_table(["level", "phase", "category", "requests", "baseline TPOT p50 ms", "spec. TPOT p50 ms",
                            "spec. drafts per step (first half -> second)", "spec. accept length"], table),
            "Each phase sends one category of prompt, the next another, in turn. Drafts per step in a phase's first "
            "half against its second: an engine's own controller that reacts to the shift changes its depth between "
            "them (a fixed setting does not)."]


#: How the verify stage's arms are named in its tables.
ARM_LABELS = {"off": "always off", "on": "always on", "schedule": "as recommended", "controller": "engine's controller"}


def _halves(rows: Sequence[Request]) -> tuple[list[Request], list[Request]]:
    """Each block's requests of a phase in two halves, in the order they were sent: (first halves, second halves)."""
    blocks: dict[Any, list[Request]] = {}
    for r in sorted(rows, key=lambda r: (r["repeat"], r["prompt_index"])):
        blocks.setdefault(r["repeat"], []).append(r)
    return ([r for b in blocks.values() for r in b[:len(b) // 2]], [r for b in blocks.values() for r in b[len(b) // 2:]])


def _tpot_p50(rows: Sequence[Request]) -> float | None:
    values = [float(t) for r in rows if isinstance(t := r.get("tpot_ms"), (int, float)) and t == t]
    return statistics.median(values) if values else None


def recovery_markdown(arms: Mapping[str, Sequence[Request]]) -> list[str]:
    """How fast each of the verify stage's arms recovers after a shift: per level, phase and arm, TPOT p50 and
    drafts per verify step in each block's first half of the phase against its second. An arm that has settled
    by the first half shows the same figures in both; a controller still moving shows them change. Nothing where
    the arms' requests had no phases."""
    measured = {arm: [r for r in rows if not r.get("warmup") and r.get("phase") is not None
                      and r.get("error_type") is None] for arm, rows in arms.items()}
    if not any(measured.values()):
        return []
    keys = sorted({(float(r["level_value"]), int(r["phase"])) for rows in measured.values() for r in rows})
    table = []
    for value, phase in keys:
        for arm, rows in sorted(measured.items(), key=lambda kv: list(ARM_LABELS).index(kv[0])
                                if kv[0] in ARM_LABELS else len(ARM_LABELS)):
            of = [r for r in rows if r["level_value"] == value and r["phase"] == phase]
            if not of:
                continue
            first, second = _halves(of)
            table.append([f"{value:g}", str(phase), str(of[0].get("category") or "-"), ARM_LABELS.get(arm, arm),
                          f"{_f(_tpot_p50(first), 2)} -> {_f(_tpot_p50(second), 2)}",
                          f"{_f(_drafts_per_step(first), 2)} -> {_f(_drafts_per_step(second), 2)}"])
    return ["### Recovery after a shift (verify stage)",
            markdown_table(["level", "phase", "category", "arm", "TPOT p50 ms (first half -> second)",
                            "drafts per step (first half -> second)"], table),
            "Each arm's requests of a phase, in each block's first half against its second: an arm that adapts to the "
            "new traffic at once shows the same figures in both halves; one still catching up after the shift (an "
            "engine's own controller warming up its average) shows them move between them."]


def temperatures_markdown(comparisons: dict[str, Comparison]) -> str:
    """The answer at each temperature: the verdict per level and the recommendation, side by side."""
    cs = sorted({lv.concurrency for comp in comparisons.values() for lv in comp.levels})
    rows = []
    for t, comp in comparisons.items():
        cells = {lv.concurrency: lv for lv in comp.levels}
        accept = [lv.speculative_accept_length for lv in comp.levels if lv.speculative_accept_length]
        rows.append([t, *(f"x{cells[c].ratio:.2f} {cells[c].verdict}" if c in cells else "-" for c in cs),
                     f"{sum(accept) / len(accept):.2f}" if accept else "-", headline(comp.recommendation)])
    first = next(iter(comparisons.values()))
    return "\n\n".join([f"## Speculation by temperature: {first.speculative} vs {first.baseline}",
                         markdown_table(["temperature", *(level_label(c) for c in cs), "accept length", "answer"],
                                        rows),
                         "Each temperature is a comparison of its own (its runs and report named with it). Exact-match "
                         "verification accepts fewer drafted tokens as sampling spreads: measure at the temperature "
                         "you serve with."])


def acceptance_words(lv: CategoryLevel, lead: str) -> str:
    """A category's acceptance as its engine reports it per request: tokens per verify step, or the share of
    drafted tokens accepted."""
    if lv.accept_length is not None:
        return f"{lead}accept {lv.accept_length:.2f}"
    return f"{lead}accepted {lv.acceptance_rate:.0%}" if lv.acceptance_rate is not None else ""


def traffic_markdown(view: TrafficView | None) -> list[str]:
    """Per category of prompt: the ratio by level, the acceptance, an answer each; output lengths; lossless."""
    if view is None or not view.levels:
        return []
    cs = sorted({lv.concurrency for lv in view.levels})
    cells = {(lv.category, lv.concurrency): lv for lv in view.levels}

    def cell(lv: CategoryLevel | None) -> str:
        if lv is None:
            return "-"
        ci = f" [{lv.ratio_low:.2f}, {lv.ratio_high:.2f}]" if lv.ratio_low is not None and lv.ratio_high is not None else ""
        return f"x{lv.ratio:.2f}{ci} {lv.verdict}{acceptance_words(lv, ', ')}"

    rows = [[cat, *(cell(cells.get((cat, c))) for c in cs),
             headline(view.recommendations[cat]) if cat in view.recommendations else "-"] for cat in view.categories]
    lengths = markdown_table(["configuration", "concurrency", "requests", "output tokens p10 / p50 / p90",
                              "ended naturally"],
                             [[o.config, str(o.concurrency), str(o.requests), f"{o.p10:.0f} / {o.p50:.0f} / {o.p90:.0f}",
                               f"{o.stop_share:.0%}" if o.stop_share is not None else "-"] for o in view.lengths])
    parts = [f"### By category of prompt ({view.source or 'unknown'} prompts)",
             markdown_table(["category", *(f"C={c}" for c in cs), "answer"], rows),
             "Each cell: the speculative configuration's per-request speed over the baseline's, paired by prompt "
             f"(median over the rounds, with its {view.confidence:.2%} interval: simultaneous with the levels' own, "
             "under the comparison's alpha), the "
             "verdict, and the speculative engine's output tokens per verify "
             "step where its answers say. The interval is taken over the level's rounds, not its requests: requests "
             "measured together share the machine's state, so a category needs rounds, not only prompts, to be "
             "decided.",
             "### Output lengths", lengths]
    if view.lossless or view.lossless_check == "failed":
        check = {"passed": "**Output check at temperature 0: passed.** ",
                 "failed": "**Output check at temperature 0: failed" + (f" (lossy verifier: {view.lossy_verifier})"
                                                                        if view.lossy_verifier else "") + ".** ",
                 "not run": ""}[view.lossless_check]
        parts.append("### Same outputs at temperature 0\n\n" + check + ", ".join(
            f"C={lv.concurrency}: {lv.same} of {lv.pairs} prompts ({lv.share:.0%})" for lv in view.lossless)
            + ". Speculative decoding verifies every token against the target: greedy outputs should match but for "
              "numerical noise.")
    return parts


def slo_markdown(view: SLOView | None) -> list[str]:
    """Capacity and goodput within the latency targets, where the run gave targets."""
    if view is None:
        return []

    def cell(side: Side) -> str:
        return f"{'yes' if side.meets else 'no'} ({_f(side.ttft_p99_ms)} / {_f(side.tpot_p99_ms, 2)})"

    rows = [[str(lv.concurrency), cell(lv.baseline), cell(lv.speculative), _f(lv.baseline.goodput_tokens_per_s),
             _f(lv.speculative.goodput_tokens_per_s)] for lv in view.levels]
    table = markdown_table(["concurrency", "baseline meets (TTFT / TPOT p99 ms)",
                            "speculative meets (TTFT / TPOT p99 ms)", "baseline goodput tok/s",
                            "speculative goodput tok/s"], rows)
    return ["### Within the latency targets", f"**{view.summary}**", table,
            "Goodput: output tokens per second of the requests that met both targets themselves. Capacity: the "
            "highest measured concurrency up to which every level's p99s are within the targets."]


def verification_markdown(v: Verification | None) -> list[str]:
    """The verify stage: the recommended setting as the engine ran it, against both fixed policies."""
    if v is None:
        return ["### Verified?\n\nNot run: the recommendation has not been run by the engine (decision.verify, "
                "`--verify`)."]
    rows = [[level_words(lv.concurrency), "on" if lv.speculates else "off", _f(lv.off_tokens_per_s), _f(lv.on_tokens_per_s),
             _f(lv.schedule_tokens_per_s), f"always {lv.better_fixed}",
             f"{lv.ratio:.2f}" + (f" [{lv.ratio_low:.2f}, {lv.ratio_high:.2f}]" if lv.ratio_low is not None
                                  and lv.ratio_high is not None else ""), lv.result, str(lv.blocks)] for lv in v.levels]
    table = markdown_table(["level", "recommended", "always off tok/s", "always on tok/s", "as recommended tok/s",
                            "better fixed", "recommended / better [interval]", "result", "blocks each"], rows)
    parts = ["### Verified?", f"**{v.summary}**", f"The engine ran: `{v.setting}`", table,
             f"Each level: the recommended setting against the better of the two fixed policies, blocks of the "
             f"{'four' if v.against_controller is not None else 'three'} arms in turn (paired). It reaches the better "
             f"one when the interval lies above 1 - {v.margin:.0%}."]
    if (cost := v.setting_cost) is not None:
        ci = f" [{cost.ratio_low:.2f}, {cost.ratio_high:.2f}]" if cost.ratio_low is not None \
            and cost.ratio_high is not None else ""
        parts.append(f"**The setting's own cost at {level_label(cost.concurrency)}** (as recommended against always on, "
                     f"the same K: reported on its own): ×{cost.ratio:.2f}{ci} ({cost.verdict}). Why it may cost: {cost.why}.")
    return parts + controller_markdown(v)


def controller_markdown(v: Verification) -> list[str]:
    """The measured schedule against the engine's own controller (the verify stage's fourth arm), per level."""
    if v.against_controller is None:
        return []
    rows = [[level_words(lv.concurrency), _f(lv.schedule_tokens_per_s), _f(lv.controller.controller_tokens_per_s),
             f"{lv.controller.ratio:.2f}" + (f" [{lv.controller.ratio_low:.2f}, {lv.controller.ratio_high:.2f}]"
                                             if lv.controller.ratio_low is not None
                                             and lv.controller.ratio_high is not None else ""),
             lv.controller.result, _f(lv.controller.drafted_per_step, 2), _f(lv.controller.tier_mean, 2)]
            for lv in v.levels if lv.controller is not None]
    table = markdown_table(["level", "as recommended tok/s", "engine's controller tok/s",
                            "recommended / controller [interval]", "the schedule", "controller drafts per step",
                            "controller tier (mean)"], rows)
    return ["### Against the engine's own controller", f"**{v.controller_summary}**",
            f"The engine's controller ran: `{v.controller}`", table,
            f"Each level: the measured schedule against the engine's own controller, blocks in the same rounds "
            f"(paired). It beats the controller when the interval lies above 1, matches it within ±{v.margin:.0%}, "
            f"loses when below 1, and is no better when it cannot gain more than {v.margin:.0%}. The level's two "
            "intervals (against the better fixed policy, against the controller) share its error budget."]


def batch_span(batch_from: int, batch_to: int) -> str:
    if batch_to >= MAX_BATCH:
        return f"{batch_from}+"
    return f"{batch_from}-{batch_to}" if batch_to > batch_from else f"{batch_from}"


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
        best = lv.points[lv.best]
        rows.append([str(lv.concurrency), batch_cell(None, best.batch_mean, best.batch_max),
                     f"{lv.baseline_tokens_per_s:,.1f}", *cells, lv.best])
    table = markdown_table(["concurrency", "running batch, best point (max)", "baseline tok/s", *labels, "best"], rows)
    rec = tuning.recommendation
    parts = [f"**{headline(rec)}**",
             f"## Speculation grid on {engines.get(tuning.engine).label}: {', '.join(labels)} vs {tuning.baseline}",
             status_line(rec, tuning.margin),
             tuning.summary,
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
