"""Plots of a comparison (PNG, matplotlib): throughput, latency and speedup against concurrency."""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from specsweep.compare import Comparison  # noqa: E402

DPI = 90


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, bbox_inches="tight", format="png")
    plt.close(fig)
    return buf.getvalue()


def comparison_plots(comp: Comparison) -> dict[str, bytes]:
    """The plots as PNG bytes, by name."""
    c = [r.concurrency for r in comp.levels]
    paths: dict[str, bytes] = {}

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot(c, [r.baseline_tokens_per_s for r in comp.levels], "o-", label="baseline")
    ax.plot(c, [r.speculative_tokens_per_s for r in comp.levels], "s-", label="speculative")
    ax.set(xscale="log", xlabel="concurrency", ylabel="output tokens/s", title="Output throughput")
    ax.set_xticks(c, [str(x) for x in c])
    ax.grid(alpha=0.3)
    ax.legend()
    paths["throughput"] = _png(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.6, 3.6))
    for ax, key, title in ((a1, "ttft_ms", "TTFT median (ms)"), (a2, "itl_ms", "ITL median (ms)")):
        ax.plot(c, [getattr(r, f"baseline_{key}") for r in comp.levels], "o-", label="baseline")
        ax.plot(c, [getattr(r, f"speculative_{key}") for r in comp.levels], "s-", label="speculative")
        ax.set(xscale="log", xlabel="concurrency", title=title)
        ax.set_xticks(c, [str(x) for x in c])
        ax.grid(alpha=0.3)
        ax.legend()
    paths["latency"] = _png(fig)

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ratios = [r.ratio for r in comp.levels]
    ax.plot(c, ratios, "o-", color="tab:purple", label="speculative / baseline")
    lows = [r.ratio_low for r in comp.levels if r.ratio_low is not None]
    highs = [r.ratio_high for r in comp.levels if r.ratio_high is not None]
    if len(lows) == len(highs) == len(c):
        ax.fill_between(c, lows, highs, color="tab:purple", alpha=0.15, label="95% interval")
    ax.axhline(1.0, color="grey", lw=1)
    if comp.crossover is not None:
        ax.axvline(comp.crossover, color="tab:red", ls="--", label=f"crossover: {comp.crossover}")
    ax.set(xscale="log", xlabel="concurrency", ylabel="speedup", title="Speedup from speculation")
    ax.set_xticks(c, [str(x) for x in c])
    ax.grid(alpha=0.3)
    ax.legend()
    paths["speedup"] = _png(fig)
    return paths


def data_uri(png: bytes) -> str:
    """A PNG embedded in markdown (the Prefect UI renders it in an artifact)."""
    return "data:image/png;base64," + base64.b64encode(png).decode()
