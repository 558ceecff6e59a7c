"""Compare a baseline run with a speculative run: per level a verdict, then one answer.

Per concurrency level: both configurations' throughput (geometric mean over blocks, with
its interval), latency (TTFT and TPOT, p50 and p99), the ratio speculative / baseline with
its interval and verdict (``specsweep.stats``: paired when the blocks alternated), then
the recommendation (``specsweep.recommend``) and, when decided, the engines' own forms of
it (``specsweep.engine_configs``). ``write_report`` puts all of it in the comparison's report
folder: report.md, recommendation.json, vllm-speculative-config.json,
sglang-adaptive-config.json and the plots.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from specsweep import engine_configs
from specsweep.decision import DecisionConfig, level_verdict
from specsweep.engine_configs import SpeculationSettings, speculation_from_command
from specsweep.errors import ConfigError
from specsweep.recommend import LevelVerdict, Recommendation, recommend
from specsweep.records import LevelRow, RunRow
from specsweep.stats import Verdict, t_quantile
from specsweep.store import ResultsStore

FINGERPRINT_KEYS = ("gpu", "gpu_count", "driver", "engine_version", "model")


class LevelComparison(BaseModel):
    concurrency: int
    blocks: tuple[int, int] = Field(description="Blocks measured (baseline, speculative).")
    requests: tuple[int, int] = Field(description="Measured requests (baseline, speculative).")
    baseline_tokens_per_s: float = Field(description="Geometric mean over the blocks.")
    speculative_tokens_per_s: float
    baseline_interval: tuple[float, float] | None = Field(None, description="95 % interval of the baseline's mean.")
    speculative_interval: tuple[float, float] | None = None
    ratio: float = Field(description="speculative / baseline output throughput")
    ratio_low: float | None = Field(None, description="Interval of the ratio (None: fewer than two blocks).")
    ratio_high: float | None = None
    confidence: float = Field(description="Confidence of each look at the level (simultaneous over the looks).")
    paired: bool
    verdict: Verdict
    baseline_ttft_ms: float | None = None
    speculative_ttft_ms: float | None = None
    baseline_ttft_p99_ms: float | None = None
    speculative_ttft_p99_ms: float | None = None
    baseline_tpot_ms: float | None = None
    speculative_tpot_ms: float | None = None
    baseline_tpot_p99_ms: float | None = None
    speculative_tpot_p99_ms: float | None = None
    speculative_accept_length: float | None = None
    speculative_acceptance_rate: float | None = None

    def as_verdict(self) -> LevelVerdict:
        return LevelVerdict(concurrency=self.concurrency, verdict=self.verdict, ratio=self.ratio,
                            baseline_tokens_per_s=self.baseline_tokens_per_s,
                            speculative_tokens_per_s=self.speculative_tokens_per_s)


class Comparison(BaseModel):
    baseline: str
    speculative: str
    levels: list[LevelComparison]
    recommendation: Recommendation
    margin: float
    design: str | None = None
    speculation: SpeculationSettings | None = Field(None, description="What the speculative configuration drafts.")
    vllm_speculative_config: dict[str, Any] | None = None
    sglang_adaptive_config: dict[str, Any] | None = None
    notes: list[str] = Field(default_factory=list)
    baseline_run_id: str | None = None
    speculative_run_id: str | None = None
    host: str | None = None

    @property
    def summary(self) -> str:
        return self.recommendation.reason


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


def _by_level(rows: Sequence[LevelRow]) -> dict[int, list[LevelRow]]:
    out: dict[int, list[LevelRow]] = {}
    for r in sorted(rows, key=lambda r: (r.level_index, r.repeat)):
        if r.mode == "concurrency" and r.concurrency is not None:
            out.setdefault(r.concurrency, []).append(r)
    return out


def _median(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def _mean_interval(rows: Sequence[LevelRow]) -> tuple[float, tuple[float, float] | None]:
    logs = [math.log(max(r.output_tokens_per_s, 1e-9)) for r in rows]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), None
    half = t_quantile(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half))


def compare_levels(base_rows: Sequence[LevelRow], spec_rows: Sequence[LevelRow], *, decision: DecisionConfig,
                   paired: bool, num_requests: int, baseline_name: str = "baseline",
                   speculative_name: str = "speculative") -> Comparison:
    base, spec = _by_level(base_rows), _by_level(spec_rows)
    common = sorted(set(base) & set(spec))
    if not common:
        raise ConfigError(
            f"the runs share no concurrency level (baseline {sorted(base)}, speculative {sorted(spec)}): "
            "measure both with the same concurrency list"
        )
    levels = []
    for c in common:
        b, s = base[c], spec[c]
        interval, v = level_verdict(b, s, decision, paired=paired, num_requests=num_requests)
        b_mean, b_int = _mean_interval(b)
        s_mean, s_int = _mean_interval(s)
        levels.append(LevelComparison(
            concurrency=c, blocks=(len(b), len(s)), requests=(sum(r.requests for r in b), sum(r.requests for r in s)),
            baseline_tokens_per_s=b_mean, speculative_tokens_per_s=s_mean, baseline_interval=b_int,
            speculative_interval=s_int, ratio=interval.ratio, ratio_low=interval.low, ratio_high=interval.high,
            confidence=interval.confidence, paired=paired, verdict=v,
            baseline_ttft_ms=_median([r.ttft_ms_median for r in b]), speculative_ttft_ms=_median([r.ttft_ms_median for r in s]),
            baseline_ttft_p99_ms=_median([r.ttft_ms_p99 for r in b]),
            speculative_ttft_p99_ms=_median([r.ttft_ms_p99 for r in s]),
            baseline_tpot_ms=_median([r.tpot_ms_median for r in b]), speculative_tpot_ms=_median([r.tpot_ms_median for r in s]),
            baseline_tpot_p99_ms=_median([r.tpot_ms_p99 for r in b]),
            speculative_tpot_p99_ms=_median([r.tpot_ms_p99 for r in s]),
            speculative_accept_length=_median([r.spec_accept_length for r in s]),
            speculative_acceptance_rate=_median([r.spec_acceptance_rate for r in s]),
        ))
    rec = recommend([lv.as_verdict() for lv in levels], decision.margin)
    return Comparison(baseline=baseline_name, speculative=speculative_name, levels=levels, recommendation=rec,
                      margin=decision.margin)


def with_engine_configs(comp: Comparison, speculation: SpeculationSettings | None) -> Comparison:
    """The decided answer as the engines' own settings (vLLM's speculative config; SGLang's adaptive file)."""
    comp.speculation = speculation
    if comp.recommendation.status != "decided" or speculation is None:
        return comp
    off = comp.recommendation.speculation_off_from
    comp.vllm_speculative_config = engine_configs.vllm_speculative_config(speculation, off)
    comp.sglang_adaptive_config = engine_configs.sglang_adaptive_config(speculation.num_speculative_tokens, off)
    if speculation.engine == "sglang" and (speculation.eagle_topk or 1) != 1:
        comp.notes.append(f"SGLang's adaptive speculation needs --speculative-eagle-topk 1; this run used "
                          f"{speculation.eagle_topk}.")
    return comp


def compare_runs(store: ResultsStore, baseline_run_id: str, speculative_run_id: str, *,
                 decision: DecisionConfig | None = None) -> Comparison:
    """Compare two runs from the store (the CLI's ``compare`` and the flows' comparison task). Without
    ``decision``, the speculative run's own decision settings (or the defaults) apply."""
    base_run, spec_run = store.run(baseline_run_id), store.run(speculative_run_id)
    if decision is None:
        decision = DecisionConfig.model_validate_json(spec_run.decision_json) if spec_run.decision_json else DecisionConfig()
    diffs = check_fingerprints(base_run, spec_run, decision.allow_mismatch)
    paired = (base_run.design or "").startswith("alternate") and base_run.design == spec_run.design
    num_requests = int(json.loads(spec_run.sweep_json or "{}").get("num_requests", 32))
    base_rows, spec_rows = store.level_rows(baseline_run_id), store.level_rows(speculative_run_id)
    comp = compare_levels(base_rows, spec_rows, decision=decision, paired=paired, num_requests=num_requests,
                          baseline_name=base_run.config_name, speculative_name=spec_run.config_name)
    comp.baseline_run_id, comp.speculative_run_id, comp.host = baseline_run_id, speculative_run_id, base_run.host
    comp.design = base_run.design if base_run.design == spec_run.design else None
    if not paired:
        comp.notes.append("The blocks were not taken alternately (sequential design): drift of the machine between the "
                          "two configurations is not cancelled out; the alternate design is more robust.")
    if diffs:
        comp.notes.append("Compared despite different environments: " + "; ".join(diffs))
    if differ := prompts_differ(base_rows, spec_rows):
        comp.notes.append("The two configurations were not sent the same prompts at " + ", ".join(differ) +
                          " (their prompt digests differ: another workload, seed or tokenizer): the comparison there is "
                          "not paired by prompt.")
    return with_engine_configs(comp, speculation_from_command(spec_run.command))


def prompts_differ(base: list[LevelRow], spec: list[LevelRow]) -> list[str]:
    """The blocks (level and repeat) whose two configurations were sent different prompts."""
    digests = {(r.concurrency, r.request_rate_per_s, r.repeat): r.prompts_digest for r in base}
    return [f"{r.label} block {r.repeat}" for r in spec
            if r.prompts_digest and digests.get((r.concurrency, r.request_rate_per_s, r.repeat), r.prompts_digest)
            not in (None, r.prompts_digest)]


# -- the report folder ---------------------------------------------------------------------------


def report_folder(comp: Comparison) -> str:
    """Where a comparison's report lies under the results root."""
    return f"reports/{comp.baseline_run_id}--{comp.speculative_run_id}"


def recommendation_json(comp: Comparison) -> dict[str, Any]:
    rec = comp.recommendation
    return {
        "status": rec.status,
        "speculation_off_from": rec.speculation_off_from,
        "reason": rec.reason,
        "between": list(rec.between) if rec.between else None,
        "measure_next": rec.measure_next,
        "margin": comp.margin,
        "design": comp.design,
        "baseline": {"name": comp.baseline, "run_id": comp.baseline_run_id},
        "speculative": {"name": comp.speculative, "run_id": comp.speculative_run_id},
        "levels": [{"concurrency": lv.concurrency, "verdict": lv.verdict, "ratio": round(lv.ratio, 4),
                    "interval": [round(lv.ratio_low, 4), round(lv.ratio_high, 4)] if lv.ratio_low and lv.ratio_high
                    else None, "confidence": round(lv.confidence, 4),
                    "requests": {"baseline": lv.requests[0], "speculative": lv.requests[1]},
                    "blocks": {"baseline": lv.blocks[0], "speculative": lv.blocks[1]}} for lv in comp.levels],
        "projected_tokens_per_s": {k: round(v, 2) for k, v in rec.projected_tokens_per_s.items()},
    }


def write_report(comp: Comparison, store: ResultsStore) -> dict[str, str]:
    """The comparison's report folder. Returns each file's URL by name."""
    from specsweep.plots import comparison_plots

    folder = report_folder(comp)
    urls = {name: store.write_file(f"{folder}/{name}.png", png) for name, png in comparison_plots(comp).items()}
    files: dict[str, Any] = {"recommendation": recommendation_json(comp)}
    if comp.vllm_speculative_config is not None:
        files["vllm-speculative-config"] = comp.vllm_speculative_config
    if comp.sglang_adaptive_config is not None:
        files["sglang-adaptive-config"] = comp.sglang_adaptive_config
    for name, data in files.items():
        urls[name] = store.write_file(f"{folder}/{name}.json", (json.dumps(data, indent=2) + "\n").encode())
    urls["report"] = store.write_file(f"{folder}/report.md", (comparison_markdown(comp) + "\n").encode())
    return urls


def configure_lines(comp: Comparison) -> list[str]:
    """What to paste into the engines, in words and flags."""
    if comp.recommendation.status != "decided":
        return ["No engine setting is given while the answer is undetermined: measure the levels named above first."]
    off = comp.recommendation.speculation_off_from
    lines = []
    if comp.vllm_speculative_config is not None:
        lines.append("vLLM (`vllm-speculative-config.json`):\n\n```\n"
                     + engine_configs.vllm_flags(comp.vllm_speculative_config) + "\n```")
    if comp.sglang_adaptive_config is not None and comp.speculation is not None:
        what = ("" if comp.speculation.method in ("eagle", "eagle3") else
                f", added to an EAGLE/EAGLE3 launch (this run's speculation, {comp.speculation.method}, is not one)")
        lines.append(f"SGLang (`sglang-adaptive-config.json`, EAGLE/EAGLE3 with topk 1{what}):\n\n```\n"
                     + engine_configs.sglang_flags(comp.speculation) + "\n```")
    if off is not None:
        lines.append(f"Engines without a per-batch switch: route to the baseline deployment once {off} or more requests "
                     "are in flight, to the speculative one below.")
    return lines


def comparison_markdown(comp: Comparison) -> str:
    from specsweep.report import markdown_table

    def f(x: float | None, d: int = 1) -> str:
        return "-" if x is None else f"{x:,.{d}f}"

    rows = []
    for r in comp.levels:
        ci = f" [{r.ratio_low:.2f}, {r.ratio_high:.2f}]" if r.ratio_low is not None and r.ratio_high is not None else ""
        rows.append([str(r.concurrency), f(r.baseline_tokens_per_s), f(r.speculative_tokens_per_s), f"{r.ratio:.2f}{ci}",
                     r.verdict, f"{r.blocks[0]}/{r.blocks[1]}", f(r.baseline_ttft_ms), f(r.speculative_ttft_ms),
                     f(r.baseline_tpot_ms, 2), f(r.speculative_tpot_ms, 2), f(r.speculative_accept_length, 2),
                     f(r.speculative_acceptance_rate, 2)])
    table = markdown_table(
        ["concurrency", "baseline tok/s", "speculative tok/s", "ratio [interval]", "verdict", "blocks b/s",
         "baseline TTFT p50 ms", "spec. TTFT p50 ms", "baseline TPOT p50 ms", "spec. TPOT p50 ms", "accept length",
         "acceptance rate"], rows)
    rec = comp.recommendation
    pol = rec.projected_tokens_per_s
    policies = markdown_table(["policy", "mean output tok/s over the levels"], [
        ["always off (baseline)", f(pol.get("always_off"))], ["always on (speculative)", f(pol.get("always_on"))],
        ["as recommended", f(pol.get("as_recommended")) if "as_recommended" in pol else "- (undetermined)"]])
    head = "Decided" if rec.status == "decided" else "Undetermined"
    parts = [
        f"## Speculation: {comp.speculative} vs {comp.baseline}",
        f"**{head}: {rec.reason}**",
        f"Speculation off from: {rec.speculation_off_from if rec.speculation_off_from is not None else '-'}"
        + (f"; measure next: {', '.join(map(str, rec.measure_next))}" if rec.measure_next else ""),
        table,
        f"Verdicts: faster / slower when the interval of the ratio lies above / below 1; equivalent when it lies within "
        f"±{comp.margin:.0%}; undetermined otherwise. Intervals are simultaneous over each level's looks "
        f"({comp.levels[0].confidence:.1%} per look); blocks were "
        f"{'paired (alternate design)' if comp.levels[0].paired else 'not paired (sequential design)'}.",
        "### What to configure",
        *configure_lines(comp),
        "### Projected throughput",
        policies,
    ]
    if comp.notes:
        parts.append("### Notes\n" + "\n".join(f"- {n}" for n in comp.notes))
    return "\n\n".join(parts)
