"""The service-level view: how much load each configuration carries within latency targets.

Given targets for the 99th percentile of time to first token and of time per output token, at each
level and for each configuration (from the requests of the blocks that count, pooled):

- the level **meets** the targets when both p99s are within them;
- **capacity** is the highest measured concurrency up to which every level meets them (None: not even
  the first);
- **goodput** is the output tokens per second of the requests that met both targets themselves
  (DistServe's definition, in tokens): throughput that a service with these targets can count.

What speculation does to capacity is the difference of the two capacities.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from specsweep.records import BlockRow


class SLO(BaseModel):
    """Latency targets (p99)."""

    model_config = ConfigDict(extra="forbid")

    ttft_p99_ms: float | None = Field(None, gt=0, description="Target for the 99th percentile of time to first token.")
    tpot_p99_ms: float | None = Field(None, gt=0, description="Target for the 99th percentile of time per output token.")

    @model_validator(mode="after")
    def _some(self) -> SLO:
        if self.ttft_p99_ms is None and self.tpot_p99_ms is None:
            raise ValueError("give ttft_p99_ms, tpot_p99_ms or both (milliseconds)")
        return self

    def describe(self) -> str:
        parts = ([f"TTFT p99 ≤ {self.ttft_p99_ms:g} ms"] if self.ttft_p99_ms else []) + (
            [f"TPOT p99 ≤ {self.tpot_p99_ms:g} ms"] if self.tpot_p99_ms else [])
        return " and ".join(parts)


class Request(BaseModel):
    """What the view needs of one measured request."""

    ttft_ms: float | None
    tpot_ms: float | None
    output_tokens: int
    ok: bool


class Side(BaseModel):
    """One configuration at one level."""

    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    meets: bool
    goodput_tokens_per_s: float
    requests: int
    within: int = Field(description="Requests that met both targets themselves.")


class SLOLevel(BaseModel):
    concurrency: int
    baseline: Side
    speculative: Side


class SLOView(BaseModel):
    slo: SLO
    levels: list[SLOLevel]
    baseline_capacity: int | None
    speculative_capacity: int | None
    summary: str


def _p99(xs: Sequence[float]) -> float | None:
    return float(np.percentile(xs, 99)) if xs else None


def side(requests: Sequence[Request], seconds: float, slo: SLO) -> Side:
    ok = [r for r in requests if r.ok]
    ttft = _p99([r.ttft_ms for r in ok if r.ttft_ms is not None])
    tpot = _p99([r.tpot_ms for r in ok if r.tpot_ms is not None])
    meets = len(ok) == len(requests) and bool(ok) and \
        (slo.ttft_p99_ms is None or (ttft is not None and ttft <= slo.ttft_p99_ms)) and \
        (slo.tpot_p99_ms is None or tpot is None or tpot <= slo.tpot_p99_ms)

    def within(r: Request) -> bool:
        return r.ok and (slo.ttft_p99_ms is None or (r.ttft_ms is not None and r.ttft_ms <= slo.ttft_p99_ms)) and \
            (slo.tpot_p99_ms is None or r.tpot_ms is None or r.tpot_ms <= slo.tpot_p99_ms)

    good = [r for r in requests if within(r)]
    return Side(ttft_p99_ms=ttft, tpot_p99_ms=tpot, meets=meets, requests=len(requests), within=len(good),
                goodput_tokens_per_s=sum(r.output_tokens for r in good) / seconds if seconds > 0 else 0.0)


def capacity(levels: Sequence[int], meets: Sequence[bool]) -> int | None:
    """The highest level up to which every level meets the targets."""
    best = None
    for c, ok in zip(levels, meets, strict=True):
        if not ok:
            break
        best = c
    return best


def slo_view(slo: SLO, base: Mapping[int, tuple[list[Request], float]],
             spec: Mapping[int, tuple[list[Request], float]]) -> SLOView:
    """The view from each configuration's requests and measured seconds per concurrency."""
    cs = sorted(set(base) & set(spec))
    levels = [SLOLevel(concurrency=c, baseline=side(*base[c], slo), speculative=side(*spec[c], slo)) for c in cs]
    b = capacity(cs, [lv.baseline.meets for lv in levels])
    s = capacity(cs, [lv.speculative.meets for lv in levels])
    return SLOView(slo=slo, levels=levels, baseline_capacity=b, speculative_capacity=s,
                   summary=_summary(slo, b, s, cs))


def _cap(c: int | None, cs: Sequence[int]) -> str:
    if c is None:
        return f"not even {cs[0]}" if cs else "none"
    return f"{c}" + (" (the highest level measured: maybe more)" if c == cs[-1] else "")


def _summary(slo: SLO, b: int | None, s: int | None, cs: Sequence[int]) -> str:
    head = f"Within {slo.describe()}: the baseline carries up to {_cap(b, cs)} concurrent requests, speculation up " \
           f"to {_cap(s, cs)}"
    if b == s:
        return head + ": speculation leaves the capacity as it is."
    if (s or 0) > (b or 0):
        return head + ": speculation raises the capacity."
    return head + ": speculation lowers the capacity."


def requests_by_level(frame: Iterable[Mapping[str, object]], rows: Sequence[BlockRow]) -> dict[int, tuple[list[Request], float]]:
    """The measured requests of the blocks that count (not warm-ups; not blocks set aside), and those blocks'
    seconds, by concurrency. ``frame``: request records with mode, level_value, repeat, warmup, ttft_ms,
    tpot_ms, output_tokens, error_type."""
    counted = {(int(r.concurrency or 0), r.repeat): r.duration_s for r in rows
               if r.mode == "concurrency" and r.disturbed is None}
    out: dict[int, tuple[list[Request], float]] = {}
    for (c, _repeat), seconds in counted.items():
        reqs, total = out.get(c, ([], 0.0))
        out[c] = (reqs, total + seconds)
    for rec in frame:
        if rec.get("mode") != "concurrency" or rec.get("warmup"):
            continue
        key = (int(_num(rec.get("level_value")) or 0), int(_num(rec.get("repeat")) or 0))
        if key not in counted:
            continue
        out[key[0]][0].append(Request(
            ttft_ms=_num(rec.get("ttft_ms")), tpot_ms=_num(rec.get("tpot_ms")),
            output_tokens=int(_num(rec.get("output_tokens")) or 0),
            ok=rec.get("error_type") in (None, "") and _num(rec.get("ttft_ms")) is not None))
    return out


def _num(x: object) -> float | None:
    if x is None:
        return None
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if v != v else v  # NaN from pandas: missing
