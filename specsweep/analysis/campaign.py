"""One comparison across a fleet: each host's answer, one answer per hardware kind, and the hosts of a kind that
disagree.

A kind is what the fingerprint records of a host and its engine (GPU model and count, driver, engine and version,
model). Per kind and level the hosts' ratios are pooled: the kind's ratio is their geometric mean, its interval
runs from the lowest host's low to the highest host's high (an answer that holds on every host of the kind must hold
over all of their intervals), and the spread between hosts (the largest ratio over the smallest) is set against the
effect measured (the pooled ratio's distance from 1). Hosts of one kind disagree at a level when two of their
intervals do not overlap; a host whose interval misses more than half of the others' is named as the outlier (of
two that disagree, both are). The kind's setting is the least worst-case loss over the pooled intervals (``recommend``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pydantic import BaseModel, Field

from specsweep.analysis.compare import Comparison
from specsweep.analysis.recommend import LevelVerdict, Recommendation, recommend
from specsweep.analysis.stats import RatioInterval, Verdict, verdict
from specsweep.records import RunRow


class HostLevel(BaseModel):
    concurrency: int
    ratio: float
    low: float | None = None
    high: float | None = None


class HostAnswer(BaseModel):
    """One host's comparison, or why it has none."""

    host: str
    kind: str = ""
    status: str | None = None
    off_from: int | None = None
    worst_case_loss: float | None = None
    decision: str = ""
    levels: list[HostLevel] = Field(default_factory=list)
    runs: tuple[str, str] | None = None
    error: str | None = Field(None, description="Why the host has no answer (unreachable, failed every try).")


class KindLevel(BaseModel):
    concurrency: int
    ratio: float = Field(description="Geometric mean of the hosts' ratios.")
    low: float | None = Field(None, description="The lowest host's low (None: a host's interval is unbounded).")
    high: float | None = None
    spread: float = Field(description="The largest host ratio over the smallest: 1.00 where they agree exactly.")
    effect: float = Field(description="How far the pooled ratio lies from 1 (as a factor): what the spread is held "
                          "against.")
    hosts: dict[str, float] = Field(default_factory=dict)
    disagree: bool = Field(False, description="Two hosts' intervals do not overlap here.")
    outliers: list[str] = Field(default_factory=list)


class KindAnswer(BaseModel):
    kind: str
    hosts: list[str]
    levels: list[KindLevel]
    recommendation: Recommendation
    flagged: bool = Field(description="Hosts of this kind disagree beyond their intervals at some level.")
    outliers: list[str] = Field(default_factory=list)


def kind_of(run: RunRow) -> str:
    """The hardware kind a run was measured on, with its engine and model, in words."""
    gpu = "CPU" if not run.gpu or run.gpu.startswith("none") else f"{run.gpu_count or 1}x {run.gpu}"
    driver = f", driver {run.driver}" if run.driver else ""
    return f"{gpu}{driver} · {run.engine_version or run.engine} · {run.model or '?'}"


def host_answer(host: str, comp: Comparison, spec_run: RunRow) -> HostAnswer:
    rec = comp.recommendation
    return HostAnswer(host=host, kind=kind_of(spec_run), status=rec.status, off_from=rec.speculation_off_from,
                      worst_case_loss=rec.worst_case_loss, decision=rec.decision,
                      levels=[HostLevel(concurrency=lv.concurrency, ratio=lv.ratio, low=lv.ratio_low, high=lv.ratio_high)
                              for lv in comp.levels],
                      runs=(comp.baseline_run_id or "", comp.speculative_run_id or ""))


def _overlap(a: HostLevel, b: HostLevel) -> bool:
    if None in (a.low, a.high, b.low, b.high):
        return True  # an unbounded interval overlaps everything
    return a.low <= b.high and b.low <= a.high  # type: ignore[operator]


def _kind_level(c: int, by_host: dict[str, HostLevel]) -> KindLevel:
    ratios = {h: lv.ratio for h, lv in by_host.items()}
    logs = [math.log(r) for r in ratios.values()]
    pooled = math.exp(statistics.fmean(logs))
    lows = [lv.low for lv in by_host.values()]
    highs = [lv.high for lv in by_host.values()]
    disagree = any(not _overlap(a, b) for i, a in enumerate(by_host.values()) for b in list(by_host.values())[i + 1:])
    outliers = []
    if disagree:  # the hosts whose interval misses more than half of the others' (two hosts: both are named)
        for h, lv in by_host.items():
            others = [o for name, o in by_host.items() if name != h]
            if sum(not _overlap(lv, o) for o in others) > len(others) / 2:
                outliers.append(h)
    return KindLevel(concurrency=c, ratio=pooled, low=None if None in lows else min(lows),  # type: ignore[type-var]
                     high=None if None in highs else max(highs), spread=math.exp(max(logs) - min(logs)),  # type: ignore[type-var]
                     effect=math.exp(abs(math.log(pooled))), hosts=ratios, disagree=disagree, outliers=outliers)


def kind_answers(answers: Sequence[HostAnswer], margin: float) -> list[KindAnswer]:
    """One answer per kind, from the hosts that answered (module docstring)."""
    kinds: dict[str, list[HostAnswer]] = {}
    for a in answers:
        if a.error is None:
            kinds.setdefault(a.kind, []).append(a)
    out = []
    for kind, hosts in sorted(kinds.items()):
        concurrencies = sorted({lv.concurrency for a in hosts for lv in a.levels})
        levels = []
        for c in concurrencies:
            by_host = {a.host: lv for a in hosts for lv in a.levels if lv.concurrency == c}
            levels.append(_kind_level(c, by_host))
        verdicts = [LevelVerdict(concurrency=lv.concurrency, verdict=_verdict(lv, margin), ratio=lv.ratio,
                                 baseline_tokens_per_s=1.0, speculative_tokens_per_s=lv.ratio, low=lv.low, high=lv.high,
                                 rounds=0) for lv in levels]
        outliers = sorted({h for lv in levels for h in lv.outliers})
        out.append(KindAnswer(kind=kind, hosts=[a.host for a in hosts], levels=levels,
                              recommendation=recommend(verdicts, margin), flagged=any(lv.disagree for lv in levels),
                              outliers=outliers))
    return out


def _verdict(lv: KindLevel, margin: float) -> Verdict:
    return verdict(RatioInterval(ratio=lv.ratio, low=lv.low, high=lv.high, blocks=(0, 0), paired=True,
                                 confidence=0.0), margin)


def campaign_markdown(answers: Sequence[HostAnswer], kinds: Sequence[KindAnswer]) -> str:
    """The campaign's report: one answer per kind, each host's beside it, the kinds whose hosts disagree."""
    lines = ["## Campaign: one answer per kind of host", ""]
    for k in kinds:
        flag = " — **hosts disagree**" + (f" (outlier: {', '.join(k.outliers)})" if k.outliers else "") if k.flagged else ""
        lines += [f"### {k.kind}{flag}", "", f"**{k.recommendation.decision}** ({k.recommendation.status}; "
                  f"{len(k.hosts)} host(s): {', '.join(k.hosts)})", "",
                  "| concurrency | pooled ratio [interval] | spread between hosts | effect | " +
                  " | ".join(k.hosts) + " |", "| --- | --- | --- | --- |" + " --- |" * len(k.hosts)]
        for lv in k.levels:
            interval = f"[{lv.low:.2f}, {lv.high:.2f}]" if lv.low is not None and lv.high is not None else "[unbounded]"
            cells = [f"x{lv.hosts[h]:.2f}" + (" (outlier)" if h in lv.outliers else "") if h in lv.hosts else "-"
                     for h in k.hosts]
            lines.append(f"| {lv.concurrency} | x{lv.ratio:.2f} {interval} | x{lv.spread:.2f} | x{lv.effect:.2f} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    lines += ["### Each host", "", "| host | kind | answer | status | worst case |", "| --- | --- | --- | --- | --- |"]
    for a in answers:
        if a.error is not None:
            lines.append(f"| {a.host} | - | no answer: {a.error[:200]} | failed | - |")
        else:
            worst = "unbounded" if a.worst_case_loss is None else f"{a.worst_case_loss:.1%}"
            answer = "keep it on" if a.off_from is None else f"off from {a.off_from}"
            lines.append(f"| {a.host} | {a.kind} | {answer} | {a.status} | {worst} |")
    return "\n".join(lines)
