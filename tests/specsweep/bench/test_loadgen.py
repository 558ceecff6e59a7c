"""The load generator against real servers (the simulator process, llama.cpp), into a real store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from specsweep.bench.config import RequestSpec, SweepConfig, WorkloadConfig
from specsweep.bench.workload import build_prompts
from specsweep.errors import ConfigError, StoreError
from specsweep.records import Block, BlockRow, RequestRow, RunRow
from specsweep.results.store import ResultsStore
from specsweep.sweep import BenchTarget, SweepJob, measure_level, repeats, run_levels, sweep_levels
from tests.helpers.sim import running_sim

#: Timing bounds and busy servers: these run when no other test does (scripts/test.sh).
pytestmark = pytest.mark.solo


async def measure(target: BenchTarget, workload: WorkloadConfig, sweep: SweepConfig, *, store: ResultsStore,
                  run_id: str, mode: str = "concurrency", value: float = 1) -> BlockRow:
    job = SweepJob(run_id=run_id, config_name=run_id, store=store, workload=workload, sweep=sweep)
    return await measure_level(target, job, Block(index=0, mode=mode, value=value))  # type: ignore[arg-type]


async def run_sweep(target: BenchTarget, workload: WorkloadConfig, sweep: SweepConfig, *, store: ResultsStore,
                    run_id: str) -> list[BlockRow]:
    job = SweepJob(run_id=run_id, config_name=run_id, store=store, workload=workload, sweep=sweep)
    return await run_levels(sweep_levels(sweep), lambda lv: measure_level(target, job, lv), more=repeats(sweep.repeats),
                            stop_at_saturation=sweep.stop_at_saturation)


def lrow(**fields: object) -> BlockRow:
    return BlockRow.model_validate({"config_name": "c", "level_index": 0, "mode": "concurrency", **fields})


def rrow(index: int) -> RequestRow:
    return RequestRow(index=index, mode="concurrency", level_value=1.0, repeat=0, scheduled_s=0.0)


@pytest.fixture
def store(tmp_path: Path) -> ResultsStore:
    return ResultsStore(tmp_path / "results")


async def test_counts_tokens_and_chunks_under_speculation(store: ResultsStore) -> None:
    with running_sim("--sim-profile", "tiny-fast", "--speculative-algorithm", "EAGLE3") as (url, _):
        target = BenchTarget(base_url=url, engine="sglang")
        row = await measure(target, WorkloadConfig(input_len=32, output_len=40), SweepConfig(num_requests=12),
                                  store=store, run_id="r1", mode="concurrency", value=4)
    assert row.completed == 12 and row.failed == 0
    assert row.output_tokens_total == 12 * 40 and row.output_tokens_source == "usage"
    assert row.input_tokens_exact  # the simulator offers /tokenize
    reqs = store.requests(["r1"])
    assert len(reqs) == 12
    assert all(sum(t) == 40 for t in reqs["chunk_tokens"])
    assert max(max(t) for t in reqs["chunk_tokens"]) > 1  # several tokens in one chunk, counted as such
    assert all(len(times) == len(toks) for times, toks in zip(reqs["chunk_times_s"], reqs["chunk_tokens"], strict=True))
    assert 1.5 < row.spec_accept_length < 3.5


async def test_native_generate_endpoint_and_verify_counts(store: ResultsStore) -> None:
    with running_sim("--sim-profile", "tiny-fast", "--speculative-algorithm", "EAGLE3") as (url, _):
        target = BenchTarget(base_url=url, request=RequestSpec(endpoint="generate"))
        row = await measure(target, WorkloadConfig(output_len=30), SweepConfig(num_requests=8), store=store,
                                  run_id="g", mode="concurrency", value=2)
    assert row.completed == 8 and row.output_tokens_total == 240
    assert row.output_tokens_source == "meta_info" and row.spec_source == "per-request"
    assert 1.5 < row.spec_accept_length < 3.5


async def test_chat_endpoint(store: ResultsStore) -> None:
    with running_sim("--sim-profile", "tiny-fast") as (url, _):
        target = BenchTarget(base_url=url, request=RequestSpec(endpoint="chat", ignore_eos=True))
        row = await measure(target, WorkloadConfig(source="bundled", output_len=16), SweepConfig(num_requests=6),
                                  store=store, run_id="c", mode="concurrency", value=3)
    assert row.completed == 6 and row.output_tokens_total == 96


async def test_failures_are_rows_not_the_end_of_the_sweep(store: ResultsStore) -> None:
    with running_sim("--sim-profile", "tiny-fast", "--fault-error-rate", "0.3", "--fault-cut-rate", "0.2",
                     "--seed", "3") as (url, _):
        target = BenchTarget(base_url=url)
        rows = await run_sweep(target, WorkloadConfig(output_len=20), SweepConfig(concurrency=[2, 4], num_requests=30,
                               warmup_requests=0), store=store, run_id="f")
    # Each level's first block with failures is set aside and measured again; failing again, the failures are
    # the server's: that block counts, with them.
    assert [(r.concurrency, r.disturbed is None) for r in rows] == [(2, False), (2, True), (4, False), (4, True)]
    assert all(r.failed and "request(s) failed" in (r.disturbed or "request(s) failed") for r in rows)
    reqs = store.requests(["f"])
    assert len(reqs) == 120
    errors = set(reqs["error_type"].dropna())
    assert "HTTPStatus" in errors and ("CutOff" in errors or "ClientPayloadError" in errors or "ReadError" in errors)
    assert sum(r.failed for r in rows) == reqs["error_type"].notna().sum()
    cut = reqs[reqs["error_type"].isin(["CutOff", "ClientPayloadError", "ReadError"])]
    assert (cut["chunk_tokens"].map(len) > 0).any()  # partial streams keep what arrived


async def test_request_rate_mode_counts_latency_from_schedule(store: ResultsStore) -> None:
    with running_sim("--sim-profile", "tiny-fast") as (url, _):
        target = BenchTarget(base_url=url)
        row = await measure(target, WorkloadConfig(output_len=10), SweepConfig(request_rate=[50.0], num_requests=40),
                                  store=store, run_id="o", mode="rate", value=50.0)
    assert row.completed == 40 and row.request_rate_per_s == 50.0
    reqs = store.requests(["o"])
    assert (reqs["send_delay_ms"] >= 0).all() and (reqs["send_delay_ms"] < 50).all()
    # Poisson arrivals at 50/s for 40 requests take about 0.8 s.
    assert 0.3 < row.duration_s < 3.0


async def test_timeout_is_a_row(store: ResultsStore) -> None:
    with running_sim("--sim-profile", "tiny-fast", "--fault-stall-s", "3") as (url, _):
        target = BenchTarget(base_url=url, request=RequestSpec(timeout_s=1.0))
        row = await measure(target, WorkloadConfig(output_len=10), SweepConfig(num_requests=2, warmup_requests=0,
                                                                              requests_per_slot=0),
                            store=store, run_id="t", mode="concurrency", value=2)
    assert row.failed == 2 and row.errors == "Timeout: 2"


async def test_stop_at_saturation(store: ResultsStore) -> None:
    with running_sim("--sim-profile", "tiny-fast", "--max-running-requests", "4") as (url, _):
        target = BenchTarget(base_url=url)
        # As many requests as the highest level, so that every level really holds that many in flight
        # (with fewer, two high levels would run the same load and latency could not keep growing).
        sweep = SweepConfig(concurrency=[1, 4, 8, 16, 32, 64], num_requests=64, warmup_requests=0, stop_at_saturation=True)
        rows = await run_sweep(target, WorkloadConfig(output_len=16), sweep, store=store, run_id="s")
    # The engine runs 4 at a time: throughput is flat from 4 or 8 on while latency climbs.
    levels = [r.concurrency for r in rows]
    assert levels[:4] == [1, 4, 8, 16] and levels[-1] in (16, 32) and 64 not in levels, [
        (r.concurrency, round(r.output_tokens_per_s), round(r.e2e_ms_median)) for r in rows]


async def test_warmup_failure_is_loud(store: ResultsStore) -> None:
    with running_sim("--sim-profile", "tiny-fast", "--api-key", "right-key-123") as (url, _):
        target = BenchTarget(base_url=url, request=RequestSpec(api_key="wrong-key-456"))  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="all 2 warm-up requests .* failed"):
            await measure(target, WorkloadConfig(output_len=4), SweepConfig(num_requests=2), store=store,
                                run_id="w", mode="concurrency", value=1)
        ok = BenchTarget(base_url=url, request=RequestSpec(api_key="right-key-123"))  # type: ignore[arg-type]
        row = await measure(ok, WorkloadConfig(output_len=4), SweepConfig(num_requests=2), store=store,
                                  run_id="w", mode="concurrency", value=1)
        assert row.completed == 2


async def test_several_client_processes(store: ResultsStore) -> None:
    with running_sim("--sim-profile", "tiny-fast") as (url, _):
        target = BenchTarget(base_url=url)
        row = await measure(target, WorkloadConfig(output_len=10), SweepConfig(num_requests=20, workers=2),
                                  store=store, run_id="m", mode="concurrency", value=4)
    assert row.completed == 20 and row.client_workers == 2
    assert sorted(store.requests(["m"])["index"]) == list(range(20))


async def test_store_reads_back_with_pandas_and_partitions(store: ResultsStore) -> None:
    with running_sim("--sim-profile", "tiny-fast") as (url, _):
        target = BenchTarget(base_url=url)
        for run_id in ("a", "b"):
            await run_sweep(target, WorkloadConfig(output_len=8), SweepConfig(concurrency=[1, 2], num_requests=4),
                            store=store, run_id=run_id)
    levels = pd.read_parquet(store.local_root / "levels")  # type: ignore[operator]
    assert sorted(levels["run_id"].astype(str).unique()) == ["a", "b"] and len(levels) == 4
    assert {"ttft_ms_median", "output_tokens_per_s", "itl_ms_p99", "e2e_ms_mean"} <= set(levels.columns)
    assert len(pd.read_parquet(store.local_root / "requests")) == 16  # type: ignore[operator]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB filesystem (tmpfs) for the results, so that disks can fill up and turn read-only."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_keeps_earlier_levels(small_disk: Path) -> None:
    store = ResultsStore(small_disk / "results")
    store.write_level("r", "L000-concurrency-1-r0", lrow(output_tokens_per_s=1.0), [rrow(1)])
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as f:  # fill the disk to the last block
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    with pytest.raises(StoreError, match="No space left on device. Earlier results are intact"):
        store.write_level("r", "L001-concurrency-2-r0", lrow(output_tokens_per_s=2.0), [rrow(i) for i in range(3000)])
    assert list(store.levels(["r"])["output_tokens_per_s"]) == [1.0]
    leftovers = [p for p in (small_disk / "results").rglob("*") if p.name.startswith(".")]
    assert leftovers == []  # nothing half-written stays behind


def test_read_only_disk_is_refused_before_anything_runs(small_disk: Path) -> None:
    import subprocess

    store = ResultsStore(small_disk / "results")
    store.write_level("r", "L000", lrow(output_tokens_per_s=1.0), [rrow(1)])
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    with pytest.raises(StoreError, match="not writable: Read-only file system"):
        store.check_writable()
    with pytest.raises(StoreError, match="Read-only file system"):
        store.write_level("r", "L001", lrow(output_tokens_per_s=2.0), [rrow(2)])
    assert list(store.levels(["r"])["output_tokens_per_s"]) == [1.0]


async def test_workload_files(tmp_path: Path) -> None:
    good = tmp_path / "p.jsonl"
    good.write_text(json.dumps({"prompt": "hello there"}) + "\n\n" + json.dumps("plain string prompt") + "\n")
    prompts = await build_prompts(WorkloadConfig(source="file", prompts_file=good), 3)
    # In a seeded order, cycling: each prompt once before any comes again.
    assert {p.text for p in prompts[:2]} == {"hello there", "plain string prompt"} and prompts[2] == prompts[0]
    assert not prompts[0].exact  # no tokenizer: approximate, and labelled so
    pd.DataFrame({"prompt": ["a b", "c d"]}).to_parquet(tmp_path / "p.parquet")
    assert len(await build_prompts(WorkloadConfig(source="file", prompts_file=tmp_path / "p.parquet"), 2)) == 2
    cases = {"empty.jsonl": (b"", "holds no prompts"), "latin.jsonl": (b"\xe9t\xe9\n", "not UTF-8"),
             "bad.jsonl": (b"{not json}\n", "line 1 is not JSON"),
             "nofield.jsonl": (b'{"text": "x"}\n', "has neither a string 'prompt' nor 'messages'")}
    for name, (data, needle) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ConfigError, match=needle):
            await build_prompts(WorkloadConfig(source="file", prompts_file=tmp_path / name), 1)
    synth = await build_prompts(WorkloadConfig(input_len=50, input_len_range=0.2, seed=5), 4)
    again = await build_prompts(WorkloadConfig(input_len=50, input_len_range=0.2, seed=5), 4)
    assert synth == again and len({p.text for p in synth}) == 4


def test_bad_sweep_settings_name_the_field() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="every concurrency level must be at least 1"):
        SweepConfig(concurrency=[0, 8])
    with pytest.raises(ValidationError, match="request rates must be positive"):
        SweepConfig(request_rate=[-1.0])
    with pytest.raises(ValidationError, match="prompts_file is empty"):
        WorkloadConfig(source="file")


def test_files_with_empty_and_set_columns_read_back_together(store: ResultsStore) -> None:
    """A column that is None in one level and a number in another must not break reading the dataset."""
    store.write_level("a", "L000", lrow(concurrency=1, spec_accept_length=None, ttft_ms_p99=None, errors=""), [])
    store.write_level("b", "L000", lrow(mode="rate", concurrency=None, request_rate_per_s=2.0, spec_accept_length=2.5,
                                        ttft_ms_p99=3.0, errors="x"), [])
    store.write_run("a", RunRow(config_name="a", gpu_count=None, time_to_ready_s=None, status="failed"))
    store.write_run("b", RunRow(config_name="b", gpu_count=8, time_to_ready_s=1.5, status="completed"))
    levels = pd.read_parquet(store.local_root / "levels")  # type: ignore[operator]
    assert sorted(levels["spec_accept_length"].fillna(0)) == [0, 2.5]
    assert len(pd.read_parquet(store.local_root / "runs")) == 2  # type: ignore[operator]


async def test_concurrency_512_stays_within_its_connections_and_records_everything(store: ResultsStore) -> None:
    import resource

    with running_sim("--sim-profile", "instant", "--max-running-requests", "1024") as (url, _):
        target = BenchTarget(base_url=url)
        row = await measure(target, WorkloadConfig(input_len=4, output_len=8),
                            SweepConfig(num_requests=1024, warmup_requests=8), store=store, run_id="big", value=512)
    assert row.requests == 1024 and row.completed == 1024, row.errors
    assert 0 < row.client_connections <= 512  # never more connections than the level allows
    assert len(store.requests(["big"])) == 1024
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 512 + 64


def test_file_descriptor_limit_is_checked_before_the_level() -> None:
    import resource

    from specsweep.bench.runner import ensure_fd_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    with pytest.raises(ConfigError, match=f"concurrency {hard} needs about {hard + 64} open files"):
        ensure_fd_limit(hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # a low soft limit is raised as needed
        assert ensure_fd_limit(1000) >= 1064
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_duration_instead_of_a_request_count(store: ResultsStore) -> None:
    with running_sim("--sim-profile", "tiny-fast") as (url, _):
        row = await measure(BenchTarget(base_url=url), WorkloadConfig(output_len=16),
                            SweepConfig(duration_s=1.0, warmup_requests=1), store=store, run_id="d", value=2)
    # ~400 tok/s per stream at 16 tokens: about 25 requests a second per stream; the last finish after 1 s.
    assert row.completed > 10 and 1.0 <= row.duration_s < 1.6


async def test_warm_up_lasts_until_ttft_settles(store: ResultsStore) -> None:
    """A freshly started server whose first 6 generations are slow, less and less: the warm-up goes
    past them and stops once TTFT has settled; the measured level then sees no cold start."""
    from specsweep.sweep import settle

    with running_sim("--sim-profile", "tiny-fast", "--sim-cold-requests", "6", "--sim-cold-ttft-s", "0.25") as (url, _):
        target = BenchTarget(base_url=url)
        job = SweepJob(run_id="w2", config_name="w2", store=store, workload=WorkloadConfig(output_len=8),
                       sweep=SweepConfig(num_requests=8, warmup_requests=0))
        report = await settle(target, job)
        assert report.settled and 6 < report.requests <= 12, report
        assert report.ttft_ms[0] > 200 and all(t > 30 for t in report.ttft_ms[:6])
        assert all(t < 30 for t in report.ttft_ms[6:])
        row = await measure_level(target, job, Block(index=0, mode="concurrency", value=2))
    assert row.ttft_ms_p99 is not None and row.ttft_ms_p99 < 100
