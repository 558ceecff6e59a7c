"""Prompts of exact length, counted by the model's own tokenizer here or by the server, the same for both
configurations, and stored with each level (how they were counted, and their digest)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from tokenizers import Tokenizer as HFTokenizer

from specsweep import engines
from specsweep.analysis.compare import prompts_differ
from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.bench.workload import Tokenizer, build_prompts, check_source, local_tokenizer, prompts_digest
from specsweep.errors import ConfigError
from specsweep.records import Block
from specsweep.results.store import ResultsStore
from specsweep.server.api import ServerAPI
from specsweep.sweep import BenchTarget, SweepJob, measure_level, server_tokenizer
from tests.helpers.sim import running_sim
from tests.helpers.tokenizer import make_tokenizer


@pytest.mark.parametrize(("decoder", "vocab_size"), [(True, 300), (False, 1000)])
async def test_a_local_tokenizer_gives_prompts_of_exact_length(tmp_path: Path, decoder: bool, vocab_size: int) -> None:
    """Words of several tokens each (a small vocabulary) with a tokenizer that decodes: cut at a token.
    Words of one token each, no decoder: grown and trimmed by words."""
    path = make_tokenizer(tmp_path, decoder=decoder, vocab_size=vocab_size)
    workload = WorkloadConfig(input_len=128, input_len_range=0.25, seed=3)
    prompts = await build_prompts(workload, 512, local_tokenizer(tmp_path))  # the folder, as a model ships it
    check = HFTokenizer.from_file(str(path))
    true = [len(check.encode(p.text).ids) for p in prompts]
    assert [p.input_tokens for p in prompts] == true and all(p.exact for p in prompts)  # counts are the tokenizer's
    import random

    rng = random.Random(3)
    targets = [max(1, round(128 + rng.uniform(-32, 32))) for _ in range(512)]
    assert true == targets
    assert prompts == await build_prompts(workload, 512, local_tokenizer(path))  # the same prompts every time


async def test_the_servers_tokenizer_counts_them_when_none_is_given() -> None:
    with running_sim("--sim-profile", "instant") as (url, _):
        async with ServerAPI(url) as api:
            prompts = await build_prompts(WorkloadConfig(input_len=64), 300, server_tokenizer(api))
            recount = await api.count_tokens_many([p.text for p in prompts])
    assert recount == [64] * 300 and all(p.exact and p.input_tokens == 64 for p in prompts)


def test_a_missing_or_bad_tokenizer_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizer .*no tokenizer.json there"):
        check_source(WorkloadConfig(tokenizer=tmp_path / "nowhere"))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not a tokenizers JSON file"):
        check_source(WorkloadConfig(tokenizer=tmp_path))


async def test_each_level_stores_how_its_prompts_were_counted_and_their_digest(tmp_path: Path) -> None:
    store = ResultsStore(str(tmp_path / "results"))
    make_tokenizer(tmp_path / "tok")
    sweep = SweepConfig(num_requests=8, warmup_requests=0)
    rows = {}
    with running_sim("--sim-profile", "instant") as (url, _):
        for name, workload in (("base", WorkloadConfig(input_len=32, output_len=4)),
                               ("spec", WorkloadConfig(input_len=32, output_len=4)),
                               ("local", WorkloadConfig(input_len=32, output_len=4, tokenizer=tmp_path / "tok")),
                               ("other", WorkloadConfig(input_len=32, output_len=4, seed=9))):
            job = SweepJob(run_id=name, config_name=name, store=store, workload=workload, sweep=sweep)
            rows[name] = await measure_level(BenchTarget(base_url=url), job, Block(index=0, mode="concurrency", value=2))
    assert rows["base"].prompt_tokens_by == "server" and rows["local"].prompt_tokens_by == "local"
    assert rows["base"].prompts_digest == rows["spec"].prompts_digest != rows["other"].prompts_digest
    stored = pd.read_parquet(tmp_path / "results" / "levels")
    assert set(stored["prompts_digest"]) == {rows[n].prompts_digest for n in rows}
    requests = pd.read_parquet(tmp_path / "results" / "requests", filters=[("run_id", "=", "base")])
    assert (requests["prompt_tokens"] == 32).all() and requests["prompt_tokens_exact"].all()
    assert prompts_differ([rows["base"]], [rows["spec"]]) == []
    assert prompts_differ([rows["base"]], [rows["other"]]) == ["C=2 block 0"]
    assert len(prompts_digest(())) == 16


async def test_a_server_that_counts_an_unknown_body_as_zero_is_not_believed() -> None:
    """A /tokenize that reads only {"prompt": ...} and answers any other body with {"count": 0} (as a server
    that ignores a field it does not know): the first form tried is not taken for the right one; the one
    that counts sensibly is, and every count is exact."""
    with running_sim("--sim-profile", "instant", "--fault-tokenize-only", "prompt") as (url, _):
        async with ServerAPI(url) as api:
            form = await api.tokenize_form()
            assert form is not None and engines.tokenize_bodies()[form]("x") == {"prompt": "x"}
            prompts = await build_prompts(WorkloadConfig(input_len=128), 256, server_tokenizer(api))
            recount = await api.count_tokens_many([p.text for p in prompts])
    assert recount == [128] * 256 and all(p.exact and p.input_tokens == 128 for p in prompts)


async def test_counts_that_make_no_sense_are_approximate_and_labelled_so(tmp_path: Path) -> None:
    """A /tokenize that gives every text the same count: no form agrees with itself on a longer text, so no
    count is stored as exact, and the level row says the lengths are approximate."""
    store = ResultsStore(str(tmp_path / "results"))
    with running_sim("--sim-profile", "instant", "--fault-tokenize-constant", "7") as (url, _):
        async with ServerAPI(url) as api:
            assert await api.tokenize_form() is None and await api.count_tokens("a few words") is None
        # (31 tokens: prompts are built once per model and workload in a process, and another test here used 32.)
        job = SweepJob(run_id="r", config_name="r", store=store, workload=WorkloadConfig(input_len=31, output_len=4),
                       sweep=SweepConfig(num_requests=8, warmup_requests=0))
        row = await measure_level(BenchTarget(base_url=url), job, Block(index=0, mode="concurrency", value=2))
    assert row.prompt_tokens_by == "approximate"  # (the server's own usage counts, where it sends them, are its own)


@pytest.mark.parametrize("step", [1, 2, 3])
async def test_the_length_search_stops_when_counts_stop_moving(step: int) -> None:
    """A tokenizer whose counts move in steps of ``step`` tokens (a target between two steps cannot be hit):
    each prompt keeps the closest length, and the search ends in a handful of rounds, not the cap of 32."""
    rounds: list[int] = []

    async def count(texts: list[str]) -> list[int]:
        rounds.append(len(texts))
        return [step * len(t.split()) for t in texts]

    targets = WorkloadConfig(input_len=100, input_len_range=0.2, seed=5)
    prompts = await build_prompts(targets, 300, Tokenizer("server", count))
    import random

    rng = random.Random(5)
    want = [max(1, round(100 + rng.uniform(-20, 20))) for _ in range(300)]
    assert all(p.exact and abs(p.input_tokens - w) <= step // 2 for p, w in zip(prompts, want, strict=True))  # type: ignore[operator]
    assert len(rounds) <= 10 and rounds[0] == 300 and rounds == sorted(rounds, reverse=True)


async def test_a_prompts_file_is_read_once_off_the_event_loop_and_few_prompt_sets_are_kept(tmp_path: Path) -> None:
    """Each level asked for its prompts again: the file was read and parsed again for every level, on the event
    loop that times the requests; and the worker kept every prompt set it ever built."""
    import threading

    from specsweep.bench import datasets
    from specsweep.sweep import prompts as level_prompts

    file = tmp_path / "p.jsonl"
    file.write_text("".join(f'{{"prompt": "question {i} about something"}}\n' for i in range(50)))
    workload = WorkloadConfig(source="file", prompts_file=file)
    threads: list[str] = []
    reader = datasets._prompts_file_read

    def spy(name: str, mtime: int, size: int) -> tuple[datasets.Item, ...]:
        threads.append(threading.current_thread().name)
        return reader(name, mtime, size)

    datasets._prompts_file_read = spy  # type: ignore[assignment]
    try:
        before = reader.cache_info().misses
        for count in (8, 16, 32, 64):  # the levels of a sweep
            assert len(await build_prompts(workload, count)) == count
    finally:
        datasets._prompts_file_read = reader  # type: ignore[assignment]
    assert reader.cache_info().misses == before + 1
    assert threads and threading.main_thread().name not in threads

    tokenizer = make_tokenizer(tmp_path)
    for count in range(1, level_prompts.PROMPT_CACHE_SETS + 10):
        await level_prompts._prompts(None, None, WorkloadConfig(input_len=8, tokenizer=tokenizer), count)  # type: ignore[arg-type]
    assert len(level_prompts._prompt_cache) == level_prompts.PROMPT_CACHE_SETS
