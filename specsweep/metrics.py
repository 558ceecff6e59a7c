"""Per-request and per-level figures, as pure functions of the raw records.

Definitions shared with the established serving benchmarks:
- TTFT: scheduled send → first chunk with generated text (scheduled = sent in closed loop);
- ITL: gaps between later arrivals of text; an arrival that carries k tokens (one chunk
  with several tokens under speculation, or several one-token events read at once) gives
  k gaps of gap / k, so ITL is per token;
- TPOT: (E2E − TTFT) / (output tokens − 1); None for one token or fewer;
- E2E: scheduled send → last byte;
- duration: first send → last completion; throughputs count completed requests;
- achieved concurrency: Σ E2E (sent → end) / duration;
- peak output tokens/s: the most tokens that arrived in one 1-second bucket;
- steady output tokens/s: the tokens that arrived while the level's full concurrency was in flight
  (closed loop: from the C-th send to the first completion not followed by another send), over that
  window; ramp-up and drain excluded, as the established tools measure saturation. Its share of the
  block's duration is stored beside it. A comparison decides on it.
Whether a block was disturbed is judged beside the sweep (``specsweep.sweep.disturbance``).
Percentiles interpolate linearly (numpy's default), as the engines' own benchmarks do.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from specsweep.records import Block, BlockRow, BlockRun, RequestRecord, RequestRow
from specsweep.server import engine_metrics

STATS = ("mean", "median", "p90", "p99")


def ttft_s(r: RequestRecord) -> float | None:
    return None if r.first_token_s is None else r.first_token_s - r.scheduled_s


def e2e_s(r: RequestRecord) -> float | None:
    return None if r.end_s is None else r.end_s - r.scheduled_s


def tpot_s(r: RequestRecord) -> float | None:
    ttft, e2e, n = ttft_s(r), e2e_s(r), r.output_tokens
    if ttft is None or e2e is None or n is None or n <= 1:
        return None
    return (e2e - ttft) / (n - 1)


#: Chunks that follow each other closer than this share of the request's time per token belong to
#: one burst: the tokens one verify step accepted, sent as separate events a few µs apart.
BURST_FRACTION = 0.25


def arrivals(r: RequestRecord) -> list[tuple[float, int]]:
    """(time, tokens) per arrival. Chunks read at the same instant, or in one burst (closer together
    than BURST_FRACTION of the request's mean time per token), arrived together and count as one:
    an engine may send each accepted token as its own event, so a verify step that accepts four
    tokens shows as four events microseconds apart, not as four inter-token gaps."""
    times, tokens = r.chunk_times_s, r.chunk_tokens
    after_first = sum(tokens[1:])
    window = BURST_FRACTION * (times[-1] - times[0]) / after_first if len(times) > 1 and after_first else 0.0
    out: list[tuple[float, int]] = []
    last = float("-inf")
    for t, k in zip(times, tokens, strict=True):
        if out and (t == last or t - last < window):
            out[-1] = (out[-1][0], out[-1][1] + k)
        else:
            out.append((t, k))
        last = t
    return out


def itl_s(r: RequestRecord) -> list[float]:
    """Per-token inter-token latencies of one request: each gap is shared by the tokens it brought."""
    out: list[float] = []
    arr = arrivals(r)
    for i in range(1, len(arr)):
        k = max(1, arr[i][1])
        out.extend([(arr[i][0] - arr[i - 1][0]) / k] * k)
    return out


def summary(values: Sequence[float], scale: float = 1000.0) -> dict[str, float | None]:
    """mean, median, p90, p99 (× scale: seconds to ms by default); None when there are no values."""
    if len(values) == 0:
        return dict.fromkeys(STATS)
    a = np.asarray(values, dtype=float) * scale
    return {
        "mean": float(a.mean()),
        "median": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
    }


def peak_output_tokens_per_s(records: Iterable[RequestRecord], start: float) -> float:
    buckets: Counter[int] = Counter()
    for r in records:
        for t, k in zip(r.chunk_times_s, r.chunk_tokens, strict=True):
            buckets[int(math.floor(t - start))] += k
    return float(max(buckets.values())) if buckets else 0.0


def _verified_tokens(r: RequestRecord) -> float:
    """Tokens a request's verify steps emitted: the engine's own accept length times its steps where it gives one
    (which leaves out the tokens no verify step made), else its output tokens (completion tokens per verify step)."""
    if r.spec_accept_length is not None and r.spec_verify_ct:
        return r.spec_accept_length * r.spec_verify_ct
    return float(r.output_tokens or 0)


def spec_from_records(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """Per-request speculation figures (where the engine's answers carry them) summed over a level. The accept
    length two ways: over all verify steps together (each step counts once: ``spec_accept_length``, also
    ``..._step_weighted``) and as the mean of the requests' own (each request counts once)."""
    ok = [r for r in records if r.ok]
    drafted = sum(r.spec_draft_tokens or 0 for r in ok)
    accepted = sum(r.spec_accepted_tokens or 0 for r in ok)
    with_verify = [r for r in ok if r.spec_verify_ct]
    verify = sum(r.spec_verify_ct or 0 for r in with_verify)
    step_weighted = sum(_verified_tokens(r) for r in with_verify) / verify if verify else None
    drafted_with_verify = sum(r.spec_draft_tokens or 0 for r in with_verify if r.spec_draft_tokens is not None)
    return {
        "spec_drafted_per_step": drafted_with_verify / verify if verify and any(
            r.spec_draft_tokens is not None for r in with_verify) else None,
        "spec_acceptance_rate": accepted / drafted if drafted else None,
        "spec_accept_length": step_weighted,
        "spec_accept_length_step_weighted": step_weighted,
        "spec_accept_length_request_weighted": (
            sum(_verified_tokens(r) / (r.spec_verify_ct or 1) for r in with_verify) / len(with_verify)
            if with_verify else None),
    }


def spec_from_counters(before: dict[str, float], after: dict[str, float]) -> tuple[dict[str, float | None], str | None]:
    """A level's speculation figures from the engine's cumulative counters read around it
    (``engine_metrics.snapshot`` of its ``/metrics``): differences, never one reading. Returns the
    figures and how they were obtained (None when the server has no such counters)."""
    diff = engine_metrics.differences(before, after)
    if "spec_draft_tokens" not in diff:
        return {}, None
    drafted, drafts = diff["spec_draft_tokens"], diff.get("spec_drafts", 0.0)
    accepted = diff.get("spec_accepted_tokens", 0.0)
    return ({"spec_acceptance_rate": accepted / drafted if drafted > 0 else None,
             "spec_accept_length": 1 + accepted / drafts if drafts > 0 else None}, "/metrics difference")


def energy_figures(row: BlockRow, records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """A level's GPU energy from the power sampled while it ran (``gpu_power_mean_w``, the server's GPUs
    together): mean power times the measured span, per output token and per accepted draft token. The
    accepted tokens are the requests' own where the engine's answers said them, else its counters' difference.
    All None without power readings."""
    power, duration = row.gpu_power_mean_w, row.duration_s
    if power is None or duration <= 0:
        return {"gpu_energy_j": None, "joules_per_output_token": None, "joules_per_accepted_token": None}
    energy = power * duration
    said = [r.spec_accepted_tokens for r in records if r.ok and not r.warmup and r.spec_accepted_tokens is not None]
    accepted = float(sum(said)) if said else row.spec_accepted_tokens
    return {"gpu_energy_j": round(energy, 3),
            "joules_per_output_token": energy / row.output_tokens_total if row.output_tokens_total else None,
            "joules_per_accepted_token": energy / accepted if accepted else None}


def steady_window(records: Sequence[RequestRecord], concurrency: int | None) -> tuple[float, float] | None:
    """(start, end) of the span in which ``concurrency`` requests were in flight: closed loop, N requests,
    C at a time, each completion but the last C - 1 followed at once by the next send. None where there
    is no such span (fewer requests than C, or an open-loop level)."""
    measured = [r for r in records if not r.warmup and r.sent_s is not None]
    c, n = concurrency or 0, len(measured)
    ends = sorted(r.end_s for r in measured if r.end_s is not None)
    if c < 1 or n < c or len(ends) < n - c + 1:
        return None
    start = sorted(r.sent_s for r in measured if r.sent_s is not None)[c - 1]
    end = ends[n - c]
    return (start, end) if end > start else None


def tokens_between(records: Iterable[RequestRecord], start: float, end: float) -> int:
    return sum(k for r in records for t, k in zip(r.chunk_times_s, r.chunk_tokens, strict=True) if start < t <= end)


def request_speed(measured: Sequence[RequestRecord]) -> float | None:
    """The speed a request sees: the completed requests' output tokens over the seconds every request took from its
    scheduled send to its end (a failed one's time counts, its tokens do not), so a configuration that fails or
    queues its requests reads slower. None without a request that ended."""
    seconds = sum(x for r in measured if (x := e2e_s(r)) is not None)
    return sum(r.output_tokens or 0 for r in measured if r.ok) / seconds if seconds > 0 else None


def level_metrics(records: Sequence[RequestRecord], concurrency: int | None = None) -> dict[str, Any]:
    """Every per-level figure, with units in the names."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    sent = [r.sent_s for r in measured if r.sent_s is not None]
    ends = [r.end_s for r in measured if r.end_s is not None]
    start = min(sent) if sent else 0.0
    duration = (max(ends) - start) if sent and ends else 0.0
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    def rate(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    m: dict[str, Any] = {
        "requests": len(measured),
        "completed": len(ok),
        "failed": len(measured) - len(ok),
        "duration_s": duration,
        "request_throughput_per_s": rate(len(ok)),
        "input_tokens_total": in_tokens,
        "output_tokens_total": out_tokens,
        "input_tokens_per_s": rate(in_tokens),
        "output_tokens_per_s": rate(out_tokens),
        "total_tokens_per_s": rate(in_tokens + out_tokens),
        "achieved_concurrency": (
            sum(r.end_s - r.sent_s for r in measured if r.end_s is not None and r.sent_s is not None) / duration
            if duration > 0 else 0.0
        ),
        "peak_output_tokens_per_s": peak_output_tokens_per_s(measured, start),
        "request_speed_tokens_per_s": request_speed(measured),
        "input_tokens_exact": bool(ok) and all(r.prompt_tokens_exact for r in ok),
        "output_tokens_source": ",".join(sorted({r.output_tokens_source for r in ok})) or "none",
        "errors": ", ".join(f"{k}: {v}" for k, v in Counter(r.error_type for r in measured if not r.ok).most_common()),
    }
    series = {
        "ttft_ms": [x for r in ok if (x := ttft_s(r)) is not None],
        "tpot_ms": [x for r in ok if (x := tpot_s(r)) is not None],
        "itl_ms": [x for r in ok for x in itl_s(r)],
        "e2e_ms": [x for r in ok if (x := e2e_s(r)) is not None],
    }
    for name, values in series.items():
        for stat, value in summary(values).items():
            m[f"{name}_{stat}"] = value
    m.update(spec_from_records(measured))
    window = steady_window(measured, concurrency)
    if concurrency:
        m["reached_concurrency"] = window is not None
    if window is not None and duration > 0:
        w0, w1 = window
        m["steady_output_tokens_per_s"] = tokens_between(measured, w0, w1) / (w1 - w0)
        m["steady_share"] = (w1 - w0) / duration
    return m


def level_row(run: BlockRun, *, config_name: str) -> BlockRow:
    """Every figure of one level, from its raw records and counters."""
    m = level_metrics(run.records, run.level.concurrency)
    spec_source = "per-request" if (m["spec_acceptance_rate"] is not None or m["spec_accept_length"] is not None) else None
    counted, source = spec_from_counters(run.engine_before, run.engine_after)
    for key, value in counted.items():
        if m.get(key) is None and value is not None:
            m[key] = value
            spec_source = source
    if m.get("spec_accept_length_step_weighted") is None:  # the counters' figure is step-weighted too
        m["spec_accept_length_step_weighted"] = m.get("spec_accept_length")
    if m.get("spec_drafted_per_step") is None:
        diff = engine_metrics.differences(run.engine_before, run.engine_after)
        if diff.get("spec_drafts", 0.0) > 0 and "spec_draft_tokens" in diff:
            m["spec_drafted_per_step"] = diff["spec_draft_tokens"] / diff["spec_drafts"]
    level = run.level
    return BlockRow(
        config_name=config_name, level_index=level.index, mode=level.mode, concurrency=level.concurrency,
        request_rate_per_s=level.value if level.mode == "rate" else None, repeat=level.repeat,
        started_at=epoch_iso(run.started_at), **m, spec_source=spec_source,
        **engine_metrics.level_figures(run.engine_before, run.engine_after, run.engine_during),
        client_cpu_s=run.client_cpu_s, client_cpu_share=run.client_cpu_share,
        client_loop_lag_p99_ms=run.loop_lag_p99_ms, client_loop_lag_max_ms=run.loop_lag_max_ms,
        client_workers=run.workers, client_connections=run.connections_opened, client_bottleneck=run.client_bottleneck,
        stop_share=stop_share(run.records),
    )


def stop_share(records: Sequence[RequestRecord]) -> float | None:
    """Share of the completed measured requests that ended at their natural end (finish_reason stop); None
    where the server said no finish reason."""
    said = [r.finish_reason for r in records if r.ok and not r.warmup and r.finish_reason]
    return sum(1 for f in said if f == "stop") / len(said) if said else None


def request_rows(run: BlockRun) -> list[RequestRow]:
    """The level's requests as stored: chunk times as offsets from the send, derived figures in ms."""
    level: Block = run.level
    ms = (lambda x: None if x is None else x * 1000)  # noqa: E731
    rows = []
    for r in run.records:
        sent = r.sent_s if r.sent_s is not None else r.scheduled_s
        fields = r.as_dict()
        fields["chunk_times_s"] = [t - sent for t in r.chunk_times_s]
        rows.append(RequestRow(
            **fields, mode=level.mode, level_value=level.value, repeat=level.repeat,
            ttft_ms=ms(ttft_s(r)), e2e_ms=ms(e2e_s(r)), tpot_ms=ms(tpot_s(r)),
            send_delay_ms=None if r.sent_s is None else (r.sent_s - r.scheduled_s) * 1000,
        ))
    return rows


def epoch_iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")
