"""Plots of a comparison (PNG, matplotlib), small enough to embed in a Prefect artifact.

    throughput.png  output tok/s of both configurations against concurrency, with intervals
    speedup.png     speculative / baseline with its interval, the ±margin band, the verdicts, the threshold
    latency.png     TTFT and TPOT, p50 and p99, of both
    pareto.png      tok/s per user (1000 / TPOT p50) against total output tok/s, one point per level

and of a speculative-parameter grid (``tuning_plot``): each setting's speedup, the best per level; and of the history
of one kind of comparison (``history_plot``): the threshold and each level's ratio over time, by engine version.

Concurrency is on a log-2 axis labelled at the measured levels.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402

from specsweep.analysis.compare import Comparison  # noqa: E402
from specsweep.analysis.recommend import level_words  # noqa: E402
from specsweep.analysis.traffic import MIX, CategoryLevel  # noqa: E402
from specsweep.analysis.tuning import Tuning  # noqa: E402
from specsweep.records import HistoryRow  # noqa: E402

DPI = 90
BASE, SPEC, AS_RECOMMENDED = "tab:blue", "tab:orange", "tab:green"
VERDICT_COLOURS = {"faster": "tab:green", "slower": "tab:red", "equivalent": "tab:gray", "no gain": "tab:brown",
                   "undetermined": "gold"}


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, bbox_inches="tight", format="png")
    plt.close(fig)
    return buf.getvalue()


def _concurrency_axis(ax: Axes, levels: Sequence[int | float], mode: str = "concurrency") -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(list(levels), [f"{c:g}" for c in levels])
    ax.set_xlabel("concurrency (requests in flight)" if mode == "concurrency" else "request rate (requests/s)")
    ax.grid(alpha=0.3)


def _error(values: Sequence[float], intervals: Sequence[tuple[float, float] | None]) -> list[list[float]]:
    lows = [v - i[0] if i else 0.0 for v, i in zip(values, intervals, strict=True)]
    highs = [i[1] - v if i else 0.0 for v, i in zip(values, intervals, strict=True)]
    return [lows, highs]


def comparison_plots(comp: Comparison) -> dict[str, bytes]:
    """The plots as PNG bytes, by name."""
    lv = comp.levels
    c = [r.concurrency for r in lv]
    threshold = comp.recommendation.speculation_off_from
    out: dict[str, bytes] = {}

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    base = [r.baseline_tokens_per_s for r in lv]
    spec = [r.speculative_tokens_per_s for r in lv]
    ax.errorbar(c, base, yerr=_error(base, [r.baseline_interval for r in lv]), fmt="o-", color=BASE, capsize=3,
                label=comp.baseline)
    ax.errorbar(c, spec, yerr=_error(spec, [r.speculative_interval for r in lv]), fmt="s-", color=SPEC, capsize=3,
                label=comp.speculative)
    if comp.verification is not None and comp.verification.levels:
        # The verify stage measured its own blocks: its curves are drawn with the recommendation's.
        v = comp.verification.levels
        ax.plot([x.concurrency for x in v], [x.schedule_tokens_per_s for x in v], "D-", color=AS_RECOMMENDED, lw=2,
                label=f"as recommended, run by the engine ({comp.verification.status})")
    _concurrency_axis(ax, c, comp.mode)
    if comp.mode == "rate":  # at a rate both deliver what is sent while they keep up: the speed a request saw
        ax.set(ylabel="output tokens/s per request", title="Speed a request saw (95% interval of each mean)")
    else:
        ax.set(ylabel="output tokens/s", title="Output throughput (95% interval of each mean)")
    ax.legend(loc="upper left")  # a fixed place: finding the "best" took over 1 s on a busy machine
    out["throughput"] = _png(fig)

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ratios = [r.ratio for r in lv]
    lows = [r.ratio_low if r.ratio_low is not None else r.ratio for r in lv]
    highs = [r.ratio_high if r.ratio_high is not None else r.ratio for r in lv]
    ax.axhspan(1 - comp.margin, 1 + comp.margin, color="grey", alpha=0.15, label=f"±{comp.margin:.0%}: equivalent")
    ax.axhline(1.0, color="grey", lw=1)
    ax.errorbar(c, ratios, yerr=[[r - lo for r, lo in zip(ratios, lows, strict=True)],
                                 [hi - r for r, hi in zip(ratios, highs, strict=True)]],
                fmt="-", color="tab:purple", capsize=3, zorder=2)
    for r in lv:
        ax.scatter([r.concurrency], [r.ratio], color=VERDICT_COLOURS[r.verdict], s=50, zorder=3, edgecolors="black",
                   linewidths=0.5)
    for verdict, colour in VERDICT_COLOURS.items():
        if any(r.verdict == verdict for r in lv):
            ax.scatter([], [], color=colour, edgecolors="black", linewidths=0.5, label=verdict)
    if threshold is not None:
        ax.axvline(threshold, color="tab:red", ls="--", label=f"off from {level_words(threshold)}")
    _concurrency_axis(ax, c, comp.mode)
    ax.set(ylabel="speculative / baseline", title="Speedup from speculation (with its interval)")
    ax.legend(fontsize=8, loc="upper right")
    out["speedup"] = _png(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.4, 3.8))
    for ax, key, title in ((a1, "ttft", "Time to first token (ms)"), (a2, "tpot", "Time per output token (ms)")):
        positive = False
        for who, colour, marker in (("baseline", BASE, "o"), ("speculative", SPEC, "s")):
            p50 = [getattr(r, f"{who}_{key}_ms") for r in lv]
            p99 = [getattr(r, f"{who}_{key}_p99_ms") for r in lv]
            name = comp.baseline if who == "baseline" else comp.speculative
            positive = positive or any(x for x in (*p50, *p99))
            ax.plot(c, [float("nan") if x is None else x for x in p50], f"{marker}-", color=colour, label=f"{name} p50")
            ax.plot(c, [float("nan") if x is None else x for x in p99], f"{marker}--", color=colour, alpha=0.6,
                    label=f"{name} p99")
        _concurrency_axis(ax, c, comp.mode)
        if positive:  # latencies span orders of magnitude from one stream to saturation
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set(title=title)
        ax.legend(fontsize=7, loc="lower right")  # latency rises with load: the lower right stays clear
    out["latency"] = _png(fig)

    if comp.mode == "rate":  # the trade-off of per-user speed against total throughput is one of concurrency
        return out
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for who, colour, marker, name in (("baseline", BASE, "o", comp.baseline),
                                      ("speculative", SPEC, "s", comp.speculative)):
        xs = [getattr(r, f"{who}_tokens_per_s") for r in lv]
        ys = [1000.0 / t if (t := getattr(r, f"{who}_tpot_ms")) else float("nan") for r in lv]
        ax.plot(xs, ys, f"{marker}-", color=colour, label=name)
        for x, y, conc in zip(xs, ys, c, strict=True):
            ax.annotate(f"C={conc}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=colour)
    ax.set(xlabel="total output tokens/s", ylabel="tokens/s per user (1000 / TPOT p50)",
           title="Per-user speed against total throughput")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")  # the curves run from the upper left (one stream) down to the right
    out["pareto"] = _png(fig)
    if (by_category := category_plot(comp)) is not None:
        out["categories"] = by_category
    return out


def category_plot(comp: Comparison) -> bytes | None:
    """Acceptance and speedup by category of prompt (None where the prompts had no categories)."""
    view = comp.traffic
    if view is None or not any(lv.category not in (MIX, "(none)") for lv in view.levels):
        return None
    cats = view.categories
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11.0, 4.0))
    cs = sorted({lv.concurrency for lv in view.levels})
    width = 0.8 / max(1, len(cs))
    colours = plt.get_cmap("viridis")
    # Acceptance as the engine reports it per request: tokens per verify step, else the share of drafted tokens
    # accepted.
    rate = not any(lv.accept_length is not None for lv in view.levels)

    def figure(lv: CategoryLevel) -> float | None:
        return lv.acceptance_rate if rate else lv.accept_length

    for j, c in enumerate(cs):
        accept = [next((figure(lv) for lv in view.levels if lv.category == cat and lv.concurrency == c), None)
                  for cat in cats]
        a1.bar([i + (j - (len(cs) - 1) / 2) * width for i in range(len(cats))],
               [float("nan") if a is None else a for a in accept], width, label=f"C={c}",
               color=colours(j / max(1, len(cs) - 1)))
    a1.set_xticks(range(len(cats)), [c.replace("(mix as sent)", "mix") for c in cats], rotation=30, ha="right",
                  fontsize=8)
    a1.set(ylabel="drafted tokens accepted (share)" if rate else "output tokens per verify step",
           title=f"Acceptance by category ({comp.speculative})")
    top = max((figure(lv) or 0.0 for lv in view.levels), default=1.0)
    a1.set_ylim(0, max(1.0, top) * 1.25)  # room for the legend above the bars
    a1.legend(fontsize=7, ncol=len(cs), loc="upper center")
    for cat in cats:
        levels = sorted((lv for lv in view.levels if lv.category == cat), key=lambda lv: lv.concurrency)
        mix = cat == MIX
        a2.plot([lv.concurrency for lv in levels], [lv.ratio for lv in levels], "o-" if not mix else "s-",
                color="black" if mix else None, lw=2.5 if mix else 1, alpha=1 if mix else 0.75,
                label="mix as sent" if mix else cat)
    a2.axhspan(1 - comp.margin, 1 + comp.margin, color="grey", alpha=0.15)
    a2.axhline(1.0, color="grey", lw=1)
    _concurrency_axis(a2, cs)
    a2.set(ylabel="speculative / baseline per-request speed", title="Speedup by category")
    a2.legend(fontsize=7, ncol=2, loc="lower left")
    fig.tight_layout()
    return _png(fig)


def tuning_plot(tuning: Tuning) -> bytes:
    """Each grid point's speedup over the baseline against concurrency, each nudged sideways so that the
    intervals do not hide one another; the best point per level ringed; the legend beside the axes."""
    lv = tuning.levels
    c = [r.concurrency for r in lv]
    fig, ax = plt.subplots(figsize=(8.0, 4.0))
    ax.axhspan(1 - tuning.margin, 1 + tuning.margin, color="grey", alpha=0.15, label=f"±{tuning.margin:.0%}: equivalent")
    ax.axhline(1.0, color="grey", lw=1)
    colours = plt.get_cmap("viridis")
    n = len(tuning.points)

    def nudged(i: int) -> list[float]:  # on the log-2 axis: a few percent of an octave apart
        return [x * 2 ** ((i - (n - 1) / 2) * 0.07) for x in c]

    for i, point in enumerate(tuning.points):
        ratios = [r.points[point.label].ratio for r in lv]
        lows = [r.points[point.label].ratio_low for r in lv]
        highs = [r.points[point.label].ratio_high for r in lv]
        yerr = [[x - lo if lo is not None else 0.0 for x, lo in zip(ratios, lows, strict=True)],
                [hi - x if hi is not None else 0.0 for x, hi in zip(ratios, highs, strict=True)]]
        ax.errorbar(nudged(i), ratios, yerr=yerr, fmt="o-", color=colours(0.85 * i / max(1, n - 1)), capsize=3,
                    label=point.label)
    off = tuning.recommendation.speculation_off_from
    index = {p.label: i for i, p in enumerate(tuning.points)}
    on = [(k, r) for k, r in enumerate(lv) if off is None or r.concurrency < off]  # from the threshold on: baseline
    ax.scatter([nudged(index[r.best])[k] for k, r in on], [r.ratio for _, r in on], s=160, facecolors="none",
               edgecolors="black", linewidths=1.2, zorder=4,
               label="best per level" + ("" if tuning.recommendation.status == "decided" else " (best available)"))
    if off is not None:
        ax.axvline(off, color="tab:red", ls="--", label=f"off from {off}")
    _concurrency_axis(ax, c)
    ax.set(ylabel="setting / baseline (output tok/s)", title="Speedup of each speculative setting (with its interval)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return _png(fig)


def history_plot(rows: Sequence[HistoryRow]) -> bytes:
    """One identity's comparisons over time: above, the threshold (the range within the margin as a bar, the answer
    as a point; past the last level drawn at the top); below, each level's ratio with its interval. Points are
    coloured by engine version, and a change of version is marked."""
    import json

    rows = sorted(rows, key=lambda r: r.date)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [1, 1.4]})
    versions = list(dict.fromkeys(r.engine_version or r.engine for r in rows))
    colours = {v: plt.get_cmap("tab10")(i % 10) for i, v in enumerate(versions)}
    levels = sorted({lv["concurrency"] for r in rows for lv in json.loads(r.levels_json)})
    top_y = (max(levels) * 2) if levels else 2
    x = list(range(len(rows)))
    for i, r in enumerate(rows):
        colour = colours[r.engine_version or r.engine]
        low = r.threshold_low if r.threshold_low is not None else top_y
        high = r.threshold_high if r.threshold_high is not None else top_y
        top.plot([i, i], [low, high], color=colour, lw=6, alpha=0.35, solid_capstyle="butt")
        top.plot(i, r.off_from if r.off_from is not None else top_y, "o", color=colour,
                 mfc=colour if r.status == "decided" else "white")
        for lv in json.loads(r.levels_json):
            err = [[lv["ratio"] - lv["low"]], [lv["high"] - lv["ratio"]]] if lv.get("low") is not None and \
                lv.get("high") is not None else None
            bottom.errorbar(i + 0.04 * levels.index(lv["concurrency"]), lv["ratio"], yerr=err, fmt="o", ms=3,
                            color=colour, capsize=2)
    for i in range(1, len(rows)):
        if (rows[i].engine_version or rows[i].engine) != (rows[i - 1].engine_version or rows[i - 1].engine):
            for ax in (top, bottom):
                ax.axvline(i - 0.5, color="gray", ls="--", lw=0.8)
    top.set_yscale("log", base=2)
    top.yaxis.set_minor_locator(NullLocator())
    top.yaxis.set_minor_formatter(NullFormatter())
    top.set_yticks([*levels, top_y], [*map(str, levels), "on"])
    top.set_ylabel("off from (concurrency)")
    top.set_title("threshold: the answer (filled: decided) and its range within the margin", fontsize=9)
    bottom.axhline(1.0, color="black", lw=0.8)
    if rows:
        bottom.axhspan(1 - rows[-1].margin, 1 + rows[-1].margin, color="gray", alpha=0.15)
    bottom.set_ylabel("speculative / baseline")
    bottom.set_title("ratio per level (left to right within a run: " + ", ".join(f"C={c}" for c in levels) + ")",
                     fontsize=9)
    bottom.set_xticks(x, [r.date[5:10] for r in rows], rotation=45, fontsize=8)
    for v, colour in colours.items():
        bottom.plot([], [], "o", color=colour, label=v)
    bottom.legend(fontsize=7, loc="best")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return _png(fig)


def data_uri(png: bytes) -> str:
    """A PNG embedded in markdown (the Prefect UI renders it in an artifact)."""
    return "data:image/png;base64," + base64.b64encode(png).decode()
