"""A server whose answers break HTTP or SSE framing (a real process that misbehaves on purpose, every
other request): each broken answer is an error row at once, named as a protocol error, and the level
goes on; no traceback reaches the terminal, no request waits for its timeout."""

from __future__ import annotations

import time

import pytest

from specsweep.bench.config import RequestSpec, SweepConfig
from specsweep.bench.runner import Load, run_level
from specsweep.bench.workload import Prompt
from specsweep.records import Block
from tests.helpers.bad_server import running

CAUSES = {
    "bad-chunk-size": "bad chunk size",
    "bad-status-line": "bad status line",
    "oversized-headers": "headers longer than 64 KiB",
    "choices-not-list": "'choices' is not a list of objects",
    "invalid-utf8": "not valid UTF-8",
    "endless-line": "an event line longer than 1024 KiB",  # not buffered without end, nor scanned again and again
}


@pytest.mark.parametrize("mode", list(CAUSES))
async def test_a_broken_answer_is_a_protocol_error_at_once(mode: str, capfd: pytest.CaptureFixture[str]) -> None:
    with running(mode) as url:
        load = Load(url, RequestSpec(timeout_s=60), (Prompt("hello", 1, True),), 4,
                    SweepConfig(num_requests=12, warmup_requests=0))
        t0 = time.monotonic()
        run = await run_level(load, Block(index=0, mode="concurrency", value=1))
        took = time.monotonic() - t0
    ok = [r for r in run.records if r.error_type is None]
    bad = [r for r in run.records if r.error_type is not None]
    assert took < 10, took  # nobody waited for the 60 s timeout
    assert len(ok) == 6 and all(sum(r.chunk_tokens) == 4 for r in ok)  # the level went on between them
    assert len(bad) == 6 and {r.error_type for r in bad} == {"ProtocolError"}, {r.error_type for r in bad}
    assert all(CAUSES[mode] in (r.error_message or "") for r in bad), bad[0].error_message
    assert "Traceback" not in capfd.readouterr().err
