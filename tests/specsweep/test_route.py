"""``specsweep route`` in front of two real simulator processes (one speculating, one not): requests go to the
speculative server below the threshold of requests in flight and to the baseline from it, streamed through to
specsweep's own load generator; health waits for both; the metrics add up."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.records import Block
from specsweep.results.store import ResultsStore
from specsweep.route import Router, merge_metrics
from specsweep.sweep import BenchTarget, SweepJob, measure_level
from tests.helpers.processes import stop_process
from tests.helpers.sim import running_sim
from tests.helpers.sshd import free_port


@contextmanager
def running_router(speculative: str, baseline: str, off_from: int, *more: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specsweep.route", "--port", str(port), "--speculative", speculative,
                             "--baseline", baseline, "--off-from", str(off_from), *more],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(url + "/health", timeout=2)
                break
            except httpx.HTTPError:
                if proc.poll() is not None:
                    raise RuntimeError(proc.stdout.read().decode() if proc.stdout else "the router exited") from None
                time.sleep(0.05)
        yield url
    finally:
        stop_process(proc)


def routed(url: str) -> dict[str, int]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return {m.group(1): int(float(m.group(2)))
            for m in re.finditer(r'specsweep_route_requests_total\{upstream="(\w+)"\} (\S+)', text)}


def router_figure(url: str, name: str) -> float:
    m = re.search(rf"^specsweep_route_{name} (\S+)$", httpx.get(url + "/metrics", timeout=5).text, re.M)
    assert m is not None, name
    return float(m.group(1))


async def test_requests_go_by_the_load_in_flight_and_stream_through(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    with running_sim("--sim-profile", "tiny-fast", "--speculative-algorithm", "EAGLE3", "--enable-metrics") as (spec, _), \
            running_sim("--sim-profile", "tiny-fast", "--enable-metrics") as (base, _), \
            running_router(spec, base, off_from=3) as url:
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        answer = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=10)
        assert answer.status_code == 200 and answer.headers["x-specsweep-upstream"] == "speculative"
        target = BenchTarget(base_url=url, engine="sglang")
        job = SweepJob(run_id="r", config_name="routed", store=store, workload=WorkloadConfig(input_len=16, output_len=32),
                       sweep=SweepConfig(num_requests=12, warmup_requests=0))
        one = await measure_level(target, job, Block(index=0, mode="concurrency", value=1))
        after_one = routed(url)
        many = await measure_level(target, job, Block(index=1, mode="concurrency", value=6))
        after_many = routed(url)
        metrics = httpx.get(url + "/metrics", timeout=5).text
    # At one stream every request speculated; at six, most of the time six were in flight (from 3: the baseline).
    assert one.completed == 12 and one.failed == 0 and one.output_tokens_total == 12 * 32
    assert after_one["baseline"] == 0 and after_one["speculative"] >= 13
    assert many.completed == 12 and many.failed == 0
    assert after_many["baseline"] - after_one["baseline"] >= 6
    # Speculation figures streamed through from the speculative server only (per request, as SGLang answers them).
    assert one.spec_accept_length is not None and one.spec_accept_length > 1.2
    assert "specsweep_route_in_flight 0" in metrics and "sglang:num_running_reqs" in metrics


async def test_health_waits_for_both_servers_and_a_dead_one_is_a_502(tmp_path: Path) -> None:
    with running_sim("--sim-profile", "tiny-fast", "--speculative-algorithm", "EAGLE3") as (spec, _), \
            running_sim("--sim-profile", "tiny-fast", "--startup-s", "60", ready=False) as (base, _), \
            running_router(spec, base, off_from=1) as url:
        health = httpx.get(url + "/health", timeout=10)
        assert health.status_code == 503 and "baseline" in health.json()["not ready"]
        # off from 1: every generation goes to the baseline, which does not answer yet.
        answer = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=20)
        assert answer.status_code in (502, 503) and answer.headers["x-specsweep-upstream"] == "baseline"


@pytest.mark.parametrize("overlap", [False, True], ids=["one-at-a-time", "overlap"])
async def test_one_server_serves_at_a_time_unless_told_otherwise(tmp_path: Path, overlap: bool) -> None:
    """Two servers sharing this machine's two cores slow each other many times over when both compute: by default the
    router lets one serve at a time (new requests wait for the switch); --overlap lets both."""
    store = ResultsStore(tmp_path / "results")
    more = ["--settle-ms", "0", *(["--overlap"] if overlap else [])]
    with running_sim("--sim-profile", "tiny-fast", "--speculative-algorithm", "EAGLE3") as (spec, _), \
            running_sim("--sim-profile", "tiny-fast") as (base, _), \
            running_router(spec, base, 3, *more) as url:
        target = BenchTarget(base_url=url, engine="sglang")
        job = SweepJob(run_id="r", config_name="routed", store=store, workload=WorkloadConfig(input_len=16, output_len=32),
                       sweep=SweepConfig(num_requests=12, warmup_requests=0))
        # From idle, six streams at once: the first two arrive below the threshold and go to the speculative server.
        block = await measure_level(target, job, Block(index=0, mode="concurrency", value=6))
        both, held = router_figure(url, "both_busy_seconds_total"), router_figure(url, "held_total")
        counts = routed(url)
    assert block.completed == 12 and block.failed == 0
    assert counts["speculative"] >= 1 and counts["baseline"] >= 6
    if overlap:
        assert both > 0 and held == 0
    else:
        assert both == 0 and held >= 1  # the switch to the baseline waited for the speculative ones


async def test_a_burst_is_routed_by_its_whole_size() -> None:
    """Six requests arriving together at a threshold of three: each waits a few milliseconds for the others, and all
    go to the baseline; routed at once, the first two would speculate. (With both servers serving at once: one at
    a time, the third would wait for the first two to end, which these never do.)"""
    async def burst(settle_s: float) -> list[str]:
        router = Router("http://127.0.0.1:1", "http://127.0.0.1:2", off_from=3, settle_s=settle_s, overlap=True)

        async def one(delay: float) -> str:
            await asyncio.sleep(delay)
            router.in_flight += 1
            return await router.admit()
        return await asyncio.wait_for(asyncio.gather(*(one(i * 0.0005) for i in range(6))), 10)

    assert await burst(0.003) == ["baseline"] * 6
    assert (await burst(0.0)).count("speculative") == 2


async def test_a_switch_asked_for_in_a_dip_is_dropped_when_the_load_comes_back() -> None:
    """One server at a time, threshold three: three requests on the baseline; two end and one arrives in the dip
    (two in flight: it asks for the speculative server and waits for the baseline to drain); two more arrive (four in
    flight). All three go to the baseline, which still serves: no switch back and forth at a load the comparison
    says speculation loses at."""
    router = Router("http://127.0.0.1:1", "http://127.0.0.1:2", off_from=3, settle_s=0.0)

    async def arrive() -> str:
        router.in_flight += 1
        return await router.admit()

    router.in_flight = 3  # three at once
    first = [await asyncio.wait_for(router.admit(), 5) for _ in range(3)]
    assert first == ["baseline"] * 3 and router.active == "baseline"
    for name in first[:2]:  # two of them end
        router.in_flight -= 1
        await router.leave(name)
    dip = asyncio.create_task(arrive())
    await asyncio.sleep(0.01)
    assert not dip.done() and router.switch_to == "speculative"  # waiting for the baseline to drain
    later = await asyncio.wait_for(asyncio.gather(arrive(), arrive()), 5)
    assert later == ["baseline", "baseline"] and await asyncio.wait_for(dip, 5) == "baseline"
    assert router.switch_to is None and router.switches == 1 and router.held == 1


def test_metrics_of_both_servers_are_summed_once_per_series() -> None:
    a = "# HELP x_running running\n# TYPE x_running gauge\nx_running{m=\"a\"} 3\nx_tokens_total 10\n"
    b = "# HELP x_running running\n# TYPE x_running gauge\nx_running{m=\"a\"} 4\nx_tokens_total 5.5\nbroken line here\n"
    merged = merge_metrics([a, b])
    assert merged.count("# HELP x_running") == 1
    assert 'x_running{m="a"} 7' in merged and "x_tokens_total 15.5" in merged and "broken" not in merged


def test_a_threshold_below_one_is_refused() -> None:
    out = subprocess.run([sys.executable, "-m", "specsweep.route", "--port", "1", "--speculative", "http://127.0.0.1:1",
                          "--baseline", "http://127.0.0.1:2", "--off-from", "0"], capture_output=True, text=True)
    assert out.returncode == 2 and "--off-from must be at least 1" in out.stderr


@pytest.mark.parametrize("url", ["ftp://h:1", "http://h:1/v1", "127.0.0.1:8081"])
def test_an_upstream_that_is_not_a_base_url_is_refused(url: str) -> None:
    out = subprocess.run([sys.executable, "-m", "specsweep.route", "--port", "1", "--speculative", url,
                          "--baseline", "http://127.0.0.1:2", "--off-from", "2"], capture_output=True, text=True)
    assert out.returncode == 2 and "base URL" in out.stderr
