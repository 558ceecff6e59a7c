"""Metrics against figures worked out by hand."""

from __future__ import annotations

import pytest

from specsweep.metrics import e2e_s, itl_s, level_metrics, spec_from_counters, summary, tpot_s, ttft_s
from specsweep.records import BlockRow, RequestRecord
from specsweep.sweep import merge_repeats, saturated


def rec(index: int, sent: float, chunks: list[tuple[float, int]], end: float, *, scheduled: float | None = None,
        prompt: int = 10, error: str | None = None) -> RequestRecord:
    r = RequestRecord(index=index, scheduled_s=sent if scheduled is None else scheduled, sent_s=sent, end_s=end)
    for t, k in chunks:
        r.chunk_times_s.append(t)
        r.chunk_tokens.append(k)
    if chunks:
        r.first_token_s, r.last_token_s = chunks[0][0], chunks[-1][0]
    r.output_tokens = sum(k for _, k in chunks)
    r.prompt_tokens, r.prompt_tokens_exact = prompt, True
    r.error_type = error
    return r


def test_multi_token_chunks_give_per_token_itl() -> None:
    # Sent at 0; first chunk (1 token) at 0.1; then 3 tokens at 0.4; then 1 token at 0.5.
    r = rec(0, 0.0, [(0.1, 1), (0.4, 3), (0.5, 1)], 0.55)
    assert ttft_s(r) == pytest.approx(0.1)
    assert e2e_s(r) == pytest.approx(0.55)
    assert itl_s(r) == pytest.approx([0.1, 0.1, 0.1, 0.1])  # the 0.3 s gap belongs to 3 tokens
    assert tpot_s(r) == pytest.approx((0.55 - 0.1) / 4)


def test_events_read_together_share_their_gap() -> None:
    # llama.cpp sends one event per token; after a verify step several arrive in one read.
    r = rec(0, 0.0, [(0.1, 1), (0.4, 1), (0.4, 1), (0.4, 1), (0.5, 1)], 0.5)
    assert itl_s(r) == pytest.approx([0.1, 0.1, 0.1, 0.1])


def test_a_burst_of_events_from_one_verify_step_is_one_arrival() -> None:
    # One event per accepted token, a few µs apart: the 0.3 s gap belongs to all three tokens,
    # not 0.3 s for the first and 0 ms for the others.
    r = rec(0, 0.0, [(0.1, 1), (0.4, 1), (0.40001, 1), (0.40002, 1), (0.5, 1)], 0.5)
    assert itl_s(r) == pytest.approx([0.1, 0.1, 0.1, 0.1], abs=1e-4)
    # Without speculation, steady gaps are never merged, even with some jitter.
    steady = rec(1, 0.0, [(0.1, 1), (0.19, 1), (0.31, 1), (0.4, 1)], 0.4)
    assert itl_s(steady) == pytest.approx([0.09, 0.12, 0.09])


def test_single_token_output_has_no_tpot_and_no_itl() -> None:
    r = rec(0, 0.0, [(0.2, 1)], 0.2)
    assert tpot_s(r) is None and itl_s(r) == []


def test_open_loop_latency_counts_from_the_scheduled_time() -> None:
    r = rec(0, 1.0, [(1.5, 1), (1.6, 1)], 1.6, scheduled=0.8)  # the client sent it 200 ms late
    assert ttft_s(r) == pytest.approx(0.7) and e2e_s(r) == pytest.approx(0.8)


def test_level_metrics_by_hand() -> None:
    a = rec(0, 0.0, [(0.5, 1), (1.0, 1), (1.5, 2)], 1.5)
    b = rec(1, 0.5, [(1.0, 1), (2.0, 1)], 2.5)
    failed = rec(2, 0.2, [(0.6, 1)], 0.7, error="CutOff")
    m = level_metrics([a, b, failed])
    assert (m["requests"], m["completed"], m["failed"]) == (3, 2, 1)
    assert m["duration_s"] == pytest.approx(2.5)  # first send 0.0 → last completion 2.5
    assert m["output_tokens_total"] == 6  # 4 + 2; the failed request's token is not counted
    assert m["output_tokens_per_s"] == pytest.approx(6 / 2.5)
    assert m["input_tokens_per_s"] == pytest.approx(20 / 2.5)
    assert m["total_tokens_per_s"] == pytest.approx(26 / 2.5)
    assert m["request_throughput_per_s"] == pytest.approx(2 / 2.5)
    # Σ E2E (sent → end) over every measured request: 1.5 + 2.0 + 0.5 = 4.0
    assert m["achieved_concurrency"] == pytest.approx(4.0 / 2.5)
    # 1 s buckets from 0.0: [0,1): 1 (a) + 1 (failed) ; [1,2): 1+2 (a) + 1 (b) = 4 ; [2,3): 1 (b)
    assert m["peak_output_tokens_per_s"] == 4
    assert m["ttft_ms_mean"] == pytest.approx(500.0)  # 0.5 and 0.5
    # ITL: a → 0.5, 0.25, 0.25 ; b → 1.0 : median of [0.25, 0.25, 0.5, 1.0] = 0.375
    assert m["itl_ms_median"] == pytest.approx(375.0)
    assert m["errors"] == "CutOff: 1"


def test_summary_percentiles_and_empty() -> None:
    s = summary([0.001 * i for i in range(1, 101)])
    assert s["median"] == pytest.approx(50.5) and s["p90"] == pytest.approx(90.1) and s["p99"] == pytest.approx(99.01)
    assert summary([]) == {"mean": None, "median": None, "p90": None, "p99": None}


def test_spec_from_counters() -> None:
    figures, how = spec_from_counters({"spec_draft_tokens": 100, "spec_accepted_tokens": 60, "spec_drafts": 25},
                                      {"spec_draft_tokens": 300, "spec_accepted_tokens": 180, "spec_drafts": 75})
    assert figures == {"spec_acceptance_rate": 0.6, "spec_accept_length": pytest.approx(1 + 120 / 50)}
    assert how == "/metrics difference"
    assert spec_from_counters({}, {}) == ({}, None)
    # A counter that went down (the server restarted between the readings) gives no figure.
    assert spec_from_counters({"spec_draft_tokens": 300}, {"spec_draft_tokens": 10}) == ({}, None)


def test_sglang_acceptance_from_per_request_fields() -> None:
    from specsweep.metrics import spec_from_records

    # Two requests: 40 tokens in 16 verify steps (3 drafts proposed per step, 24 accepted), 30 in 14.
    a = rec(0, 0.0, [(0.1, 40)], 0.2)
    a.spec_verify_ct, a.spec_draft_tokens, a.spec_accepted_tokens = 16, 48, 24
    b = rec(1, 0.0, [(0.1, 30)], 0.2)
    b.spec_verify_ct, b.spec_draft_tokens, b.spec_accepted_tokens = 14, 42, 16
    figures = spec_from_records([a, b])
    assert figures["spec_accept_length"] == pytest.approx(70 / 30)
    assert figures["spec_acceptance_rate"] == pytest.approx(40 / 90)


def level(tps: float, e2e: float, **fields: object) -> BlockRow:
    return BlockRow(config_name="c", level_index=0, mode="concurrency", concurrency=1, output_tokens_per_s=tps,
                    e2e_ms_median=e2e, **fields)  # type: ignore[arg-type]


def test_saturation_rule() -> None:
    rows = [level(t, lat) for t, lat in [(100, 10), (300, 12), (302, 20), (304, 40)]]
    assert saturated(rows)  # within 5 % of the best earlier level for two levels, latency growing
    rows[2] = level(360, 20)
    assert not saturated(rows)
    assert not saturated(rows[:2])


def test_merge_repeats_takes_medians() -> None:
    merged = merge_repeats([level(1.0, 3.0, errors="a"), level(5.0, 1.0, errors="a"), level(2.0, 2.0, errors="a")])
    assert (merged.output_tokens_per_s, merged.e2e_ms_median, merged.errors) == (2.0, 2.0, "a")


def test_every_request_record_field_is_stored() -> None:
    from dataclasses import fields

    from specsweep.records import RequestRow

    assert {f.name for f in fields(RequestRecord)} <= set(RequestRow.model_fields)
