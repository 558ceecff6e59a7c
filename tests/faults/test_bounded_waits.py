"""Every wait outside the timed load is bounded as a whole: a server that trickles its /health answer, or
sends the headers of a /tokenize answer and then nothing, holds a run up no longer than the deadline."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from specsweep.bench.config import WorkloadConfig
from specsweep.bench.workload import build_prompts
from specsweep.server import api as server_api
from specsweep.server.api import NoAnswer, ServerAPI
from specsweep.sweep import server_tokenizer
from tests.helpers.bad_server import running

pytestmark = pytest.mark.solo  # bounds in seconds: measured alone


@pytest.fixture
def stalling() -> Iterator[str]:
    with running("stalls") as url:
        yield url


async def test_a_trickled_health_answer_is_cut_at_the_calls_deadline(stalling: str) -> None:
    async with ServerAPI(stalling) as api:
        t0 = time.monotonic()
        with pytest.raises(NoAnswer):
            await api.status("/health", timeout_s=1.0)
        took = time.monotonic() - t0
    # A byte arrives every 0.2 s, so no single read ever times out: only a deadline on the whole call ends it.
    assert took < 1.0 + 0.5, took


async def test_a_tokenize_that_never_finishes_leaves_approximate_counts_within_the_deadline(
        stalling: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_api, "TOKENIZE_DETECT_S", 2.0)  # 15 s in use: the rule, not the constant
    monkeypatch.setattr(server_api, "TOKENIZE_CALL_S", 1.0)
    async with ServerAPI(stalling) as api:
        t0 = time.monotonic()
        prompts = await build_prompts(WorkloadConfig(input_len=32), 64, server_tokenizer(api))
        took = time.monotonic() - t0
    assert len(prompts) == 64 and not any(p.exact for p in prompts)  # labelled approximate, not believed
    assert took < 2.0 + 1.5, took  # the whole detection, not 1 s for each of its probes
