"""Compare a baseline run with a speculative run: where does speculation stop paying?

Pure functions over the store's level rows. Per concurrency level: output throughput
and latency of both, their ratio, and whether the difference is beyond the noise (a
bootstrap interval over repeats; with one repeat each, a single sample, and said so).
Then the crossover (the lowest level from which speculation is not clearly faster, at
that level and every level above it; "clearly" is beyond the noise where repeats give a
noise estimate), a recommendation in words, in a form engines take
(vLLM V1 ``num_speculative_tokens_per_batch_size``; for SGLang, which has no such switch,
a router threshold), and the projected throughput of switching per level against always
on and always off.
"""

from __future__ import annotations

import json
import random
import statistics
from typing import Any

import pandas as pd
from pydantic import BaseModel, Field

from specsweep.errors import ConfigError
from specsweep.records import RunRow
from specsweep.store import ResultsStore

FINGERPRINT_KEYS = ("gpu", "gpu_count", "driver", "engine_version", "model")
MAX_BATCH = 4096


class LevelComparison(BaseModel):
    concurrency: int
    baseline_tokens_per_s: float
    speculative_tokens_per_s: float
    ratio: float = Field(description="speculative / baseline output throughput")
    ratio_low: float | None = Field(None, description="95 % bootstrap interval of the ratio (None: single sample)")
    ratio_high: float | None = None
    repeats: tuple[int, int]
    verdict: str = Field(description="speculation faster | baseline faster | within noise | single sample: ...")
    baseline_ttft_ms: float | None = None
    speculative_ttft_ms: float | None = None
    baseline_itl_ms: float | None = None
    speculative_itl_ms: float | None = None
    speculative_accept_length: float | None = None
    speculative_acceptance_rate: float | None = None
    switching_tokens_per_s: float = Field(
        description="Throughput following the recommendation: speculation on where it clearly pays, off elsewhere.")


class Comparison(BaseModel):
    baseline: str
    speculative: str
    levels: list[LevelComparison]
    crossover: int | None = Field(description="Lowest level from which speculation is not clearly faster; None: never.")
    recommendation: str
    vllm_num_speculative_tokens_per_batch_size: dict[str, int]
    router: dict[str, Any]
    policy_mean_tokens_per_s: dict[str, float]
    notes: list[str] = Field(default_factory=list)
    baseline_run_id: str | None = None
    speculative_run_id: str | None = None
    host: str | None = None

    def table_rows(self) -> list[dict[str, Any]]:
        return [lv.model_dump() for lv in self.levels]


def _bootstrap_ratio(base: list[float], spec: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    ratios = []
    for _ in range(n):
        b = statistics.fmean(rng.choice(base) for _ in base)
        s = statistics.fmean(rng.choice(spec) for _ in spec)
        ratios.append(s / b if b > 0 else float("inf"))
    ratios.sort()
    return ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]


def check_fingerprints(base_run: RunRow, spec_run: RunRow, allow_mismatch: bool) -> list[str]:
    """Differences between the two runs' environments; raises unless allow_mismatch."""
    diffs = []
    for key in FINGERPRINT_KEYS:
        a, b = getattr(base_run, key), getattr(spec_run, key)
        if a is None or b is None:
            continue
        if str(a) != str(b):
            diffs.append(f"{key}: {a!r} vs {b!r}")
    if diffs and not allow_mismatch:
        raise ConfigError(
            "the two runs were measured in different environments (" + "; ".join(diffs) + "). Comparing them would "
            "mix hardware or software differences into the result; rerun on the same host, or pass "
            "allow_mismatch (--allow-mismatch) if you know the difference does not matter."
        )
    return diffs


def _per_level(levels: pd.DataFrame) -> dict[int, pd.DataFrame]:
    df = levels[levels["mode"] == "concurrency"] if "mode" in levels else levels
    return {int(str(c)): g for c, g in df.groupby("concurrency")}


def _median(g: pd.DataFrame, col: str) -> float | None:
    if col not in g:
        return None
    vals = g[col].dropna()
    return float(vals.median()) if len(vals) else None


def compare_levels(
    baseline_levels: pd.DataFrame,
    speculative_levels: pd.DataFrame,
    *,
    baseline_name: str = "baseline",
    speculative_name: str = "speculative",
    num_speculative_tokens: int = 3,
) -> Comparison:
    base, spec = _per_level(baseline_levels), _per_level(speculative_levels)
    common = sorted(set(base) & set(spec))
    if not common:
        raise ConfigError(
            f"the runs share no concurrency level (baseline {sorted(base)}, speculative {sorted(spec)}): "
            "measure both with the same concurrency list"
        )
    notes: list[str] = []
    rows: list[LevelComparison] = []
    for c in common:
        b = [float(x) for x in base[c]["output_tokens_per_s"]]
        s = [float(x) for x in spec[c]["output_tokens_per_s"]]
        bm, sm = statistics.median(b), statistics.median(s)
        ratio = sm / bm if bm > 0 else float("inf")
        low = high = None
        if len(b) >= 2 and len(s) >= 2:
            low, high = _bootstrap_ratio(b, s, seed=c)
            verdict = "speculation faster" if low > 1 else "baseline faster" if high < 1 else "within noise"
        else:
            verdict = ("single sample: speculation faster" if ratio > 1 else "single sample: baseline faster"
                       if ratio < 1 else "single sample: equal")
        rows.append(LevelComparison(
            concurrency=c, baseline_tokens_per_s=bm, speculative_tokens_per_s=sm, ratio=ratio, ratio_low=low,
            ratio_high=high, repeats=(len(b), len(s)), verdict=verdict,
            baseline_ttft_ms=_median(base[c], "ttft_ms_median"), speculative_ttft_ms=_median(spec[c], "ttft_ms_median"),
            baseline_itl_ms=_median(base[c], "itl_ms_median"), speculative_itl_ms=_median(spec[c], "itl_ms_median"),
            speculative_accept_length=_median(spec[c], "spec_accept_length"),
            speculative_acceptance_rate=_median(spec[c], "spec_acceptance_rate"),
            switching_tokens_per_s=max(bm, sm),
        ))
    if any(r.repeats == (1, 1) or min(r.repeats) == 1 for r in rows):
        notes.append("Some levels have a single sample per configuration: differences of a few percent may be noise. "
                     "Use repeats ≥ 3 for a noise estimate.")
    # Speculation "pays" at a level when it is faster beyond the noise (with repeats), or
    # faster at all (single samples, said so above). Where it does not clearly pay, it costs
    # GPU work for nothing: the crossover is the lowest level from which it pays nowhere above.
    def pays(r: LevelComparison) -> bool:
        return r.verdict == "speculation faster" if r.ratio_low is not None else r.ratio > 1.0

    crossover = None
    for i, r in enumerate(rows):
        if not any(pays(x) for x in rows[i:]):
            crossover = r.concurrency
            break
    wins = [r for r in rows if pays(r)]
    noisy = [r.concurrency for r in rows if r.verdict == "within noise"]
    if crossover is None and len(wins) == len(rows):
        rec = (f"Speculation pays at every level measured (up to {rows[-1].concurrency} concurrent requests): "
               "keep it on, or measure higher levels to find where it stops paying.")
        vllm = {f"1-{MAX_BATCH}": num_speculative_tokens}
        router: dict[str, Any] = {"speculative_below_concurrency": None, "note": "speculation wins at every measured level"}
    elif crossover is None:
        levels_won = ", ".join(str(r.concurrency) for r in wins)
        rec = (f"Speculation pays at {levels_won} concurrent requests but not at every level below: no single "
               "threshold fits; keep it on, and check the per-level verdicts.")
        vllm = {f"1-{MAX_BATCH}": num_speculative_tokens}
        router = {"speculative_below_concurrency": None, "note": "no single threshold: see the per-level verdicts"}
        notes.append("Speculation's advantage is not monotonic across levels; check the per-level verdicts.")
    elif crossover == rows[0].concurrency:
        if noisy and not any(r.verdict == "baseline faster" or (r.ratio_low is None and r.ratio < 1) for r in rows):
            rec = ("Speculation makes no difference beyond the noise at any level measured: it does not pay here; "
                   "turn it off (or measure more requests or repeats).")
        else:
            rec = (f"Speculation does not pay at any level measured (from {crossover} concurrent request"
                   f"{'s' if crossover > 1 else ''} up): turn it off.")
        vllm = {f"1-{MAX_BATCH}": 0}
        router = {"speculative_below_concurrency": 0, "note": "send all traffic to the baseline deployment"}
    else:
        below = [r.concurrency for r in rows if r.concurrency < crossover]
        last_win = max(r.concurrency for r in wins)
        rec = (f"Speculation pays up to {last_win} concurrent request{'s' if last_win > 1 else ''}; "
               f"disable it at {crossover} and above.")
        vllm = {f"1-{crossover - 1}": num_speculative_tokens, f"{crossover}-{MAX_BATCH}": 0}
        router = {"speculative_below_concurrency": crossover,
                  "rule": f"route to the speculative deployment while fewer than {crossover} requests are in flight; "
                          f"to the baseline deployment at {crossover} and above"}
        if len(wins) != len(below):
            notes.append("Speculation's advantage is not monotonic across levels; check the per-level verdicts.")
    for r in rows:
        r.switching_tokens_per_s = r.speculative_tokens_per_s if pays(r) else r.baseline_tokens_per_s
    if noisy:
        notes.append(f"Within the noise at concurrency {', '.join(map(str, noisy))}: counted as not paying there "
                     "(speculation costs GPU work for no clear gain).")
    policies = {
        "always_off": statistics.fmean(r.baseline_tokens_per_s for r in rows),
        "always_on": statistics.fmean(r.speculative_tokens_per_s for r in rows),
        "switch_per_level": statistics.fmean(r.switching_tokens_per_s for r in rows),
    }
    return Comparison(baseline=baseline_name, speculative=speculative_name, levels=rows, crossover=crossover,
                      recommendation=rec, vllm_num_speculative_tokens_per_batch_size=vllm, router=router,
                      policy_mean_tokens_per_s=policies, notes=notes)


def speculative_tokens_from_command(command: str | None, default: int = 3) -> int:
    """How many tokens the speculative configuration drafts, from its launch command."""
    if not command:
        return default
    parts = command.split()
    for flag in ("--speculative-num-steps", "--spec-draft-n-max", "--num-speculative-tokens"):
        if flag in parts:
            i = parts.index(flag)
            if i + 1 < len(parts) and parts[i + 1].isdigit():
                return int(parts[i + 1])
    return default


def compare_runs(store: ResultsStore, baseline_run_id: str, speculative_run_id: str, *,
                 allow_mismatch: bool = False) -> Comparison:
    """Compare two runs from the store (the CLI's ``compare`` and the flows' comparison task)."""
    base_run, spec_run = store.run(baseline_run_id), store.run(speculative_run_id)
    diffs = check_fingerprints(base_run, spec_run, allow_mismatch)
    comp = compare_levels(
        store.levels([baseline_run_id]), store.levels([speculative_run_id]),
        baseline_name=base_run.config_name, speculative_name=spec_run.config_name,
        num_speculative_tokens=speculative_tokens_from_command(spec_run.command),
    )
    comp.baseline_run_id, comp.speculative_run_id, comp.host = baseline_run_id, speculative_run_id, base_run.host
    if diffs:
        comp.notes.append("Compared despite different environments: " + "; ".join(diffs))
    return comp


def report_folder(comp: Comparison) -> str:
    """Where a comparison's report lies under the results root."""
    return f"reports/{comp.baseline_run_id}--{comp.speculative_run_id}"


def write_report(comp: Comparison, store: ResultsStore) -> dict[str, str]:
    """The comparison's report folder: report.md and the plots. Returns each file's URL by name."""
    from specsweep.plots import comparison_plots

    folder = report_folder(comp)
    urls = {name: store.write_file(f"{folder}/{name}.png", png) for name, png in comparison_plots(comp).items()}
    urls["report"] = store.write_file(f"{folder}/report.md", (comparison_markdown(comp) + "\n").encode())
    return urls


def comparison_markdown(comp: Comparison) -> str:
    from specsweep.report import markdown_table

    def f(x: float | None, d: int = 1) -> str:
        return "-" if x is None else f"{x:,.{d}f}"

    rows = []
    for r in comp.levels:
        ci = f" [{r.ratio_low:.2f}, {r.ratio_high:.2f}]" if r.ratio_low is not None else ""
        rows.append([str(r.concurrency), f(r.baseline_tokens_per_s), f(r.speculative_tokens_per_s), f"{r.ratio:.2f}{ci}",
                     r.verdict, f(r.baseline_ttft_ms), f(r.speculative_ttft_ms), f(r.baseline_itl_ms, 2),
                     f(r.speculative_itl_ms, 2), f(r.speculative_accept_length, 2), f(r.speculative_acceptance_rate, 2)])
    table = markdown_table(
        ["concurrency", "baseline tok/s", "speculative tok/s", "ratio [95% CI]", "verdict", "baseline TTFT p50 ms",
         "spec. TTFT p50 ms", "baseline ITL p50 ms", "spec. ITL p50 ms", "accept length", "acceptance rate"], rows)
    pol = comp.policy_mean_tokens_per_s
    policies = markdown_table(["policy", "mean output tok/s over the levels"], [
        ["always off (baseline)", f(pol["always_off"])], ["always on (speculative)", f(pol["always_on"])],
        ["as recommended (on only where it clearly pays)", f(pol["switch_per_level"])]])
    parts = [
        f"## Speculation: {comp.speculative} vs {comp.baseline}",
        f"**{comp.recommendation}**",
        f"Crossover: {comp.crossover if comp.crossover is not None else 'none within the measured levels'}",
        table,
        "### What to configure",
        "vLLM V1 (`--speculative-config`): `\"num_speculative_tokens_per_batch_size\": "
        + json.dumps(comp.vllm_num_speculative_tokens_per_batch_size) + "`",
        "SGLang has no per-batch switch; for a router in front of a speculative and a baseline deployment: `"
        + json.dumps(comp.router) + "`",
        "### Projected throughput",
        policies,
    ]
    if comp.notes:
        parts.append("### Notes\n" + "\n".join(f"- {n}" for n in comp.notes))
    return "\n\n".join(parts)
