"""Run one level of load against a server and return its raw records.

Closed loop: ``concurrency`` workers each send the next request as soon as their last one
ended. Open loop: Poisson arrivals at ``rate`` per second; each request's latency counts
from its scheduled time, so a client that falls behind cannot hide the wait
(coordinated omission). One connection pool per level, as large as the level's
concurrency and opened before the clock starts; requests are bytes prepared in advance,
so nothing is set up per request inside the timed path (``http1``). The client's own
CPU time and event-loop lag are measured, and a level where the client was the
bottleneck is flagged.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from specsweep.bench.client import PATHS, request_body, stream_request
from specsweep.bench.config import RequestOptions, SweepConfig
from specsweep.bench.http1 import Pool
from specsweep.bench.records import RequestRecord
from specsweep.bench.spec_counters import read_spec_counters
from specsweep.bench.workload import Prompt

#: A level is flagged when the client used this share of one core, or its loop lagged this much.
CPU_BOTTLENECK = 0.90
LAG_BOTTLENECK_MS = 20.0


@dataclass
class LevelRun:
    mode: str  # "concurrency" or "rate"
    value: float
    repeat: int
    records: list[RequestRecord]
    started_at: float  # wall clock, for labels
    client_cpu_s: float = 0.0
    client_wall_s: float = 0.0
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    workers: int = 1
    spec_before: dict[str, float] = field(default_factory=dict)
    spec_after: dict[str, float] = field(default_factory=dict)
    connections_opened: int = 0

    @property
    def client_cpu_share(self) -> float:
        return self.client_cpu_s / self.client_wall_s / self.workers if self.client_wall_s > 0 else 0.0

    @property
    def client_bottleneck(self) -> bool:
        return self.client_cpu_share >= CPU_BOTTLENECK or (self.loop_lag_p99_ms or 0.0) >= LAG_BOTTLENECK_MS


FD_MARGIN = 64


def ensure_fd_limit(connections: int) -> int:
    """Make sure this process may open ``connections`` sockets (plus a margin); return the limit.

    Raises the soft limit up to the hard one when needed; beyond that, a clear error before
    the level starts rather than failed connections in the middle of it.
    """
    import resource

    from specsweep.errors import ConfigError

    need = connections + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(hard, need)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    if soft != resource.RLIM_INFINITY and soft < need:
        raise ConfigError(
            f"concurrency {connections} needs about {need} open files, but this process may open only {soft} "
            f"(hard limit {hard}): raise it (ulimit -n {need}) or spread the level over several client workers"
        )
    return soft


def make_pool(base_url: str, max_connections: int) -> Pool:
    """One client for a level, its connections as many as the level's concurrency and no more."""
    return Pool(base_url, max_connections)


def auth_headers(opts: RequestOptions) -> dict[str, str]:
    return {"Authorization": f"Bearer {opts.api_key.get_secret_value()}"} if opts.api_key else {}


class _LagMonitor:
    def __init__(self, period: float = 0.01) -> None:
        self.period = period
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.period)
            self.lags.append(max(0.0, time.perf_counter() - t - self.period))

    def __enter__(self) -> _LagMonitor:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()

    def stats_ms(self) -> tuple[float | None, float | None]:
        if not self.lags:
            return None, None
        xs = sorted(self.lags)
        return xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1000, xs[-1] * 1000


async def _closed_loop(send: Any, concurrency: int, count: int, duration_s: float | None, first_index: int) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    next_i = 0
    stop_at = None if duration_s is None else time.perf_counter() + duration_s

    async def worker() -> None:
        nonlocal next_i
        while True:
            if stop_at is not None:
                if time.perf_counter() >= stop_at:
                    return
            elif next_i >= count:
                return
            i = next_i
            next_i += 1
            now = time.perf_counter()
            rec = RequestRecord(index=first_index + i, scheduled_s=now)
            records.append(rec)
            await send(rec, i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


async def _open_loop(send: Any, rate: float, count: int, duration_s: float | None, max_conc: int | None,
                     seed: int, first_index: int) -> list[RequestRecord]:
    rng = random.Random(seed)
    records: list[RequestRecord] = []
    sem = asyncio.Semaphore(max_conc) if max_conc else None
    tasks = []
    t0 = time.perf_counter()
    offset = 0.0
    i = 0
    while True:
        if duration_s is None and i >= count:
            break
        offset += rng.expovariate(rate)
        if duration_s is not None and offset > duration_s:
            break
        due = t0 + offset
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        rec = RequestRecord(index=first_index + i, scheduled_s=due)
        records.append(rec)

        async def one(r: RequestRecord = rec, k: int = i) -> None:
            if sem is None:
                await send(r, k)
            else:
                async with sem:
                    await send(r, k)

        tasks.append(asyncio.create_task(one()))
        i += 1
    await asyncio.gather(*tasks)
    return records


async def run_level_in_process(
    base_url: str,
    opts: RequestOptions,
    prompts: list[Prompt],
    output_len: int,
    sweep: SweepConfig,
    mode: str,
    value: float,
    *,
    repeat: int = 0,
    model: str | None = None,
    count: int | None = None,
    warmup: int | None = None,
    seed: int = 0,
    first_index: int = 0,
    start_at: float | None = None,
    on_request: Callable[[RequestRecord], None] | None = None,
) -> LevelRun:
    """One level (or one worker's share of it) in this process's event loop."""
    count = sweep.num_requests if count is None else count
    warmup = sweep.warmup_requests if warmup is None else warmup
    conc = int(value) if mode == "concurrency" else (sweep.max_concurrency or max(1, min(1024, count)))
    url = base_url.rstrip("/") + PATHS[opts.endpoint]
    headers = auth_headers(opts)
    ensure_fd_limit(conc)
    pool = make_pool(base_url, max(conc, 1))
    raws = [pool.request_bytes(PATHS[opts.endpoint], orjson.dumps(request_body(opts, p, output_len, model)), headers)
            for p in prompts]
    async with httpx.AsyncClient(timeout=30) as client:
        async def send(rec: RequestRecord, i: int) -> None:
            p = prompts[i % len(prompts)]
            if p.input_tokens is not None:
                rec.prompt_tokens, rec.prompt_tokens_exact = p.input_tokens, p.exact
            await stream_request(pool, raws[i % len(raws)], rec, opts.endpoint, opts.timeout_s)
            if on_request is not None and i >= 0:
                on_request(rec)

        async def warm_send(rec: RequestRecord, i: int) -> None:
            rec.warmup = True
            await stream_request(pool, raws[i % len(raws)], rec, opts.endpoint, opts.timeout_s)

        if warmup:
            warm = await _closed_loop(warm_send, min(conc, warmup), warmup, None, -warmup)
            if all(not r.ok for r in warm):
                first = warm[0]
                raise RuntimeError(
                    f"all {warmup} warm-up requests to {url} failed ({first.error_type}: {first.error_message}); "
                    "check the URL, endpoint and API key"
                )
        await pool.prefill(min(conc, 4096))  # no TCP setup inside the timed path
        spec_before = await read_spec_counters(client, base_url, headers)
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        started_at = time.time()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with _LagMonitor() as lag:
            if mode == "concurrency":
                records = await _closed_loop(send, conc, count, sweep.duration_s, first_index)
            else:
                records = await _open_loop(send, value, count, sweep.duration_s, sweep.max_concurrency, seed, first_index)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        pool.close()
        spec_after = await read_spec_counters(client, base_url, headers)
    p99, worst = lag.stats_ms()
    return LevelRun(mode, value, repeat, records, started_at, cpu, wall, p99, worst, 1, spec_before, spec_after,
                    connections_opened=pool.opened)


def run_async(coro: Any) -> Any:
    """asyncio.run on uvloop when it is installed (a faster event loop for the client)."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def _worker_entry(kwargs: dict[str, Any]) -> dict[str, Any]:
    run = run_async(run_level_in_process(**kwargs))
    return {"records": [r.as_row() for r in run.records], "cpu": run.client_cpu_s, "wall": run.client_wall_s,
            "lag_p99": run.loop_lag_p99_ms, "lag_max": run.loop_lag_max_ms, "started_at": run.started_at,
            "spec_before": run.spec_before, "spec_after": run.spec_after, "connections": run.connections_opened}


async def run_level(
    base_url: str,
    opts: RequestOptions,
    prompts: list[Prompt],
    output_len: int,
    sweep: SweepConfig,
    mode: str,
    value: float,
    *,
    repeat: int = 0,
    model: str | None = None,
    on_request: Callable[[RequestRecord], None] | None = None,
) -> LevelRun:
    """One level, in this process or spread over ``sweep.workers`` processes."""
    workers = sweep.workers
    if mode == "concurrency":
        workers = min(workers, int(value))
    if workers <= 1:
        return await run_level_in_process(base_url, opts, prompts, output_len, sweep, mode, value, repeat=repeat,
                                          model=model, seed=sweep_seed(sweep, mode, value, repeat), on_request=on_request)
    import concurrent.futures
    import multiprocessing

    count_shares = [sweep.num_requests // workers + (1 if i < sweep.num_requests % workers else 0) for i in range(workers)]
    if mode == "concurrency":
        shares = [int(value) // workers + (1 if i < int(value) % workers else 0) for i in range(workers)]
    else:
        shares = [value / workers] * workers
    start_at = time.perf_counter() + 3.0 + 0.5 * workers  # all workers start their clocks together
    jobs, first = [], 0
    for w in range(workers):
        jobs.append(dict(base_url=base_url, opts=opts, prompts=prompts, output_len=output_len, sweep=sweep, mode=mode,
                         value=shares[w], repeat=repeat, model=model, count=count_shares[w],
                         warmup=math.ceil(sweep.warmup_requests / workers), seed=sweep_seed(sweep, mode, value, repeat) + w,
                         first_index=first, start_at=start_at))
        first += count_shares[w]
    loop = asyncio.get_running_loop()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        results = await asyncio.gather(*(loop.run_in_executor(pool, _worker_entry, j) for j in jobs))
    records = [RequestRecord(**row) for res in results for row in res["records"]]
    lags = [r["lag_p99"] for r in results if r["lag_p99"] is not None]
    return LevelRun(
        mode, value, repeat, records, min(r["started_at"] for r in results),
        client_cpu_s=sum(r["cpu"] for r in results), client_wall_s=max(r["wall"] for r in results),
        loop_lag_p99_ms=max(lags) if lags else None,
        loop_lag_max_ms=max((r["lag_max"] for r in results if r["lag_max"] is not None), default=None),
        workers=workers, spec_before=results[0]["spec_before"], spec_after=results[0]["spec_after"],
        connections_opened=sum(r["connections"] for r in results),
    )


def sweep_seed(sweep: SweepConfig, mode: str, value: float, repeat: int) -> int:
    """A seed per level and repeat that is the same in every process and run."""
    return (int(value * 1000) * 7919 + repeat * 104729 + (0 if mode == "concurrency" else 15485863)) & 0x7FFFFFFF


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))
