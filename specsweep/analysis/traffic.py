"""The answer for the traffic that was sent: per category of prompt and level, and whether speculation kept
the outputs.

Both configurations are sent the very same prompts at each level and block (``prompt_index`` in the block
``repeat``), so requests pair up by prompt. Per category and level:
- the ratio of each request's own speed (output tokens over its end-to-end time) between the speculative
  configuration and the baseline, paired by prompt, with its interval and the comparison's verdict rule
  (``stats.verdict``: faster, slower, equivalent, no gain, undetermined). At a fixed concurrency a level's
  throughput is the concurrency times this speed, so the mix's ratio and the categories' agree. The
  interval is taken over the level's rounds (a block of each configuration, back to back), not over the
  requests: requests in flight together share the machine's state, and a shift of it moves them all
  alike, so treating each pair as independent would make the interval several times too narrow (at 8
  streams here, [0.96, 1.02] from 96 pairs where the 4 rounds give [0.90, 1.09]);
- the speculative configuration's acceptance: output tokens per verify step (where its answers say).
Per level, at temperature 0, the share of prompts whose two outputs are the same (by digest): speculative
decoding verifies every token against the target, so greedy outputs should match up to numerical noise
(half-precision kernels that depend on the batch); fewer than ``LOSSLESS_MIN_SHARE`` matching means the
speculative server computes something else, and its speed is not compared like for like.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from specsweep.analysis.recommend import LevelVerdict, Recommendation, recommend
from specsweep.analysis.stats import Verdict, ratio_interval, verdict
from specsweep.records import BlockRow

COLUMNS = ("mode", "level_value", "repeat", "warmup", "prompt_index", "category", "output_tokens", "e2e_ms",
           "error_type", "spec_verify_ct", "spec_draft_tokens", "spec_accepted_tokens", "output_digest", "finish_reason")
#: Below this share of prompts with the same greedy output, the speculative server is flagged.
LOSSLESS_MIN_SHARE = 0.8
#: A category needs this many prompt pairs at a level for a verdict there (and two rounds for an interval).
MIN_PAIRS = 4
MIX = "(mix as sent)"


class CategoryLevel(BaseModel):
    category: str
    concurrency: int
    pairs: int = Field(description="Prompts measured by both configurations at this level.")
    rounds: int = Field(0, description="Rounds (blocks of both configurations) these pairs came from: the interval's "
                        "units.")
    ratio: float = Field(description="Speculative / baseline per-request speed (median over the rounds of "
                         "each round's geometric mean over its pairs).")
    ratio_low: float | None = None
    ratio_high: float | None = None
    verdict: Verdict
    accept_length: float | None = Field(None, description="Speculative output tokens per verify step.")
    acceptance_rate: float | None = Field(None, description="Drafted tokens the target accepted, where the engine "
                                          "says per request (its drafted and accepted tokens).")


class OutputLengths(BaseModel):
    config: str
    concurrency: int
    requests: int
    p10: float
    p50: float
    p90: float
    stop_share: float | None = Field(None, description="Ended at their natural end (finish_reason stop).")


class Lossless(BaseModel):
    concurrency: int
    pairs: int
    same: int

    @property
    def share(self) -> float:
        return self.same / self.pairs if self.pairs else 1.0


class TrafficView(BaseModel):
    source: str | None = Field(None, description="The prompt set the levels were sent.")
    confidence: float = Field(0.95, description="Of each interval: simultaneous over categories, levels and looks.")
    levels: list[CategoryLevel] = Field(default_factory=list)
    recommendations: dict[str, Recommendation] = Field(default_factory=dict, description="Per category.")
    lengths: list[OutputLengths] = Field(default_factory=list)
    lossless: list[Lossless] = Field(default_factory=list, description="At temperature 0 only.")
    lossless_check: Literal["passed", "failed", "not run"] = Field(
        "not run", description="The temperature-0 output check: passed where every level kept at least "
        "LOSSLESS_MIN_SHARE of the outputs; failed where one did not, or where the speculative configuration's "
        "verifier is lossy by its settings (whatever share matched); not run without greedy pairs.")
    lossy_verifier: str | None = Field(None, description="The lossy verifier the speculative configuration's "
                                       "settings name (SpeculationSettings.lossy_verifier, from its launch command).")
    notes: list[str] = Field(default_factory=list)

    @property
    def categories(self) -> list[str]:
        return sorted({lv.category for lv in self.levels if lv.category != MIX}) + [MIX]


def _counted(rows: Sequence[BlockRow]) -> set[tuple[int, int]]:
    return {(int(r.concurrency or 0), r.repeat) for r in rows if r.mode == "concurrency" and r.disturbed is None}


def _measured(frame: Iterable[Mapping[str, Any]], counted: set[tuple[int, int]]) -> dict[tuple[int, int, int], dict[str, Any]]:
    out = {}
    for rec in frame:
        if rec.get("mode") != "concurrency" or rec.get("warmup") or rec.get("prompt_index") is None:
            continue
        key = (int(rec["level_value"]), int(rec["repeat"]))
        if key in counted:
            out[(*key, int(rec["prompt_index"]))] = dict(rec)
    return out


def _ok(rec: Mapping[str, Any]) -> bool:
    return rec.get("error_type") in (None, "") and (rec.get("output_tokens") or 0) > 0 and (rec.get("e2e_ms") or 0) > 0


def _speed(rec: Mapping[str, Any]) -> float:
    return float(rec["output_tokens"]) / float(rec["e2e_ms"]) * 1000.0


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def _by_round(pairs: Sequence[tuple[int, float, float]]) -> list[tuple[float, float]]:
    """Each round's geometric mean speed of the baseline and of the speculative configuration over its pairs: one
    paired value per round, the unit that is independent of the others."""
    logs: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for rnd, b, s in pairs:
        logs[rnd].append((math.log(b), math.log(s)))
    return [(math.exp(sum(b for b, _ in v) / len(v)), math.exp(sum(s for _, s in v) / len(v)))
            for _, v in sorted(logs.items())]


def traffic_view(base_frame: Iterable[Mapping[str, Any]], spec_frame: Iterable[Mapping[str, Any]],
                 base_rows: Sequence[BlockRow], spec_rows: Sequence[BlockRow], *, margin: float,
                 names: tuple[str, str] = ("baseline", "speculative"),
                 batch: Mapping[int | float, tuple[float | None, float | None]] | None = None,
                 confidence: float | Callable[[int], float] = 0.95, unanswered: Sequence[int | float] = (),
                 lossy_verifier: str | None = None) -> TrafficView:
    """``batch``: per concurrency, the running batch the speculative engine reported there (mean, max), which
    every category's answer states its engine setting in, as the level's own answer does. ``confidence``: of
    each interval, or, given the number of categories (the mix as sent among them), the confidence that holds
    them all together with the levels' own answer (``DecisionConfig.interval_confidence``: the categories
    share part of the comparison's alpha, Bonferroni over categories and levels, the looks held together): a
    category's answer is under the same error control as the level's. ``unanswered``: the levels with no block
    counted (``Comparison.unanswered``), open in every category's answer too. ``lossy_verifier``: the lossy
    verifier the speculative configuration's settings name: the temperature-0 output check fails it and says so,
    however many outputs matched (a lossy verifier may keep short greedy answers by chance; it keeps none by
    rule)."""
    counted = _counted(base_rows) & _counted(spec_rows)
    base, spec = _measured(base_frame, counted), _measured(spec_frame, counted)
    view = TrafficView(source=next((r.prompt_source for r in spec_rows if r.prompt_source), None),
                       lossy_verifier=lossy_verifier)
    pairs: dict[tuple[str, int], list[tuple[int, float, float]]] = defaultdict(list)  # (round, base, spec)
    steps: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    drafts: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)  # (accepted, drafted)
    same: dict[int, list[bool]] = defaultdict(list)
    greedy = all(r.temperature in (None, 0.0) for r in (*base_rows, *spec_rows))
    for key in sorted(base.keys() & spec.keys()):
        b, s = base[key], spec[key]
        if not (_ok(b) and _ok(s)):
            continue
        c = key[0]
        for category in (s.get("category") or "(none)", MIX):
            pairs[(category, c)].append((key[1], _speed(b), _speed(s)))
            if s.get("spec_verify_ct"):
                steps[(category, c)].append((int(s["output_tokens"]), int(s["spec_verify_ct"])))
            if s.get("spec_draft_tokens"):
                drafts[(category, c)].append((int(s.get("spec_accepted_tokens") or 0), int(s["spec_draft_tokens"])))
        if greedy and b.get("output_digest") and s.get("output_digest"):
            same[c].append(b["output_digest"] == s["output_digest"])
    categories = len({category for category, _ in pairs})
    view.confidence = confidence(categories) if callable(confidence) else confidence
    for (category, c), got in sorted(pairs.items()):
        rounds = _by_round(got)
        interval = ratio_interval([b for b, _ in rounds], [s for _, s in rounds], paired=True,
                                  confidence=view.confidence) if rounds else None
        accepted, drafted = steps.get((category, c)), drafts.get((category, c))
        view.levels.append(CategoryLevel(
            category=category, concurrency=c, pairs=len(got), rounds=len(rounds),
            ratio=interval.ratio if interval else float("nan"),
            ratio_low=interval.low if interval else None, ratio_high=interval.high if interval else None,
            verdict=verdict(interval, margin) if interval and len(got) >= MIN_PAIRS else "undetermined",
            accept_length=sum(t for t, _ in accepted) / sum(v for _, v in accepted) if accepted else None,
            acceptance_rate=sum(a for a, _ in drafted) / sum(d for _, d in drafted) if drafted else None))
    by_category: dict[str, list[LevelVerdict]] = defaultdict(list)
    for lv in view.levels:
        got = pairs[(lv.category, lv.concurrency)]
        if got:  # a level's throughput, as the concurrency times the geometric mean of its requests' speeds
            b_rate, s_rate = (lv.concurrency * math.exp(sum(math.log(p[i]) for p in got) / len(got)) for i in (1, 2))
            mean, most = (batch or {}).get(lv.concurrency, (None, None))
            by_category[lv.category].append(LevelVerdict(concurrency=lv.concurrency, verdict=lv.verdict,
                                                          ratio=lv.ratio, low=lv.ratio_low, high=lv.ratio_high,
                                                          rounds=lv.rounds, baseline_tokens_per_s=b_rate,
                                                          speculative_tokens_per_s=s_rate, batch_mean=mean,
                                                          batch_max=most))
    view.recommendations = {cat: recommend(levels, margin, unanswered) for cat, levels in by_category.items()}
    for name, frame in zip(names, (base, spec), strict=True):
        by_c: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
        for (c, _, _), rec in frame.items():
            if _ok(rec):
                by_c[c].append(rec)
        for c, recs in sorted(by_c.items()):
            lengths = [float(r["output_tokens"]) for r in recs]
            said = [r.get("finish_reason") for r in recs if r.get("finish_reason")]
            view.lengths.append(OutputLengths(
                config=name, concurrency=c, requests=len(recs), p10=_quantile(lengths, 0.1),
                p50=_quantile(lengths, 0.5), p90=_quantile(lengths, 0.9),
                stop_share=sum(1 for f in said if f == "stop") / len(said) if said else None))
    view.lossless = [Lossless(concurrency=c, pairs=len(v), same=sum(v)) for c, v in sorted(same.items())]
    if view.source in (None, "synthetic"):
        view.notes.append("Measured on synthetic text: how many drafted tokens a target accepts depends on the text, "
                          "and on generated words it does not represent real traffic. Measure with a real prompt set "
                          "(mt-bench, humaneval, sharegpt) or your own prompts (file) before acting on it.")
    if any(r.ignore_eos for r in spec_rows) and view.source not in (None, "synthetic"):
        view.notes.append("Real prompts were forced past their natural end (ignore_eos): outputs there drift from what "
                          "the model would say, and acceptance with them.")
    lossy = [lv for lv in view.lossless if lv.share < LOSSLESS_MIN_SHARE]
    view.lossless_check = "failed" if lossy or (lossy_verifier and greedy) else "passed" if view.lossless \
        else "not run"
    if lossy_verifier and greedy and not lossy:
        matched = ", ".join(f"{lv.same} of {lv.pairs} at C={lv.concurrency}" for lv in view.lossless) or "no pairs"
        view.notes.append(f"Not like for like: the speculative configuration's verifier is lossy by its settings "
                          f"({lossy_verifier}), so the temperature-0 output check fails it whatever share of outputs "
                          f"matched ({matched}): it does not promise the target's outputs. Measure with a lossless "
                          "verifier to compare like for like.")
    if lossy:
        view.notes.append("Not like for like: at temperature 0 the speculative server changed the outputs of "
                          + ", ".join(f"{lv.pairs - lv.same} of {lv.pairs} prompts at C={lv.concurrency}" for lv in lossy)
                          + f" (more than numerical noise: below {LOSSLESS_MIN_SHARE:.0%} the same). Check its "
                          "draft and verification settings; its speed is not the baseline's output delivered faster.")
    return view
