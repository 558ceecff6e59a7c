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
import random
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from specsweep import engines
from specsweep.bench.client import PATHS, request_body, stream_request
from specsweep.bench.config import RequestSpec, SweepConfig
from specsweep.bench.workload import Prompt
from specsweep.errors import ConfigError
from specsweep.records import Block, BlockRun, RequestRecord
from specsweep.server.http1 import Pool, bearer

FD_MARGIN = 64


def ensure_fd_limit(connections: int) -> int:
    """Make sure this process may open ``connections`` sockets (plus a margin); return the limit.

    Raises the soft limit up to the hard one when needed; beyond that, a clear error before
    the level starts rather than failed connections in the middle of it.
    """
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


async def _closed_loop(send: Any, concurrency: int, count: int, duration_s: float | None,
                       first_index: int) -> list[RequestRecord]:
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


def trace_gaps(arrivals: list[float], rate: float) -> list[float]:
    """A trace's gaps between arrivals (its requests in order, cycling), scaled so that its mean rate is
    ``rate``: the trace's own rate replays it as recorded, twice that at double speed."""
    if len(arrivals) < 2 or max(arrivals) <= min(arrivals):
        return [1.0 / rate] * max(1, len(arrivals))
    ordered = sorted(arrivals)
    own = (len(ordered) - 1) / (ordered[-1] - ordered[0])
    gaps = [b - a for a, b in zip(ordered, ordered[1:], strict=False)]
    gaps.append(1.0 / own)  # from the last back round to the first, when the trace is sent again
    return [g * own / rate for g in gaps]


async def _open_loop(send: Any, rate: float, count: int, duration_s: float | None, max_conc: int | None,
                     seed: int, first_index: int, gaps: list[float] | None = None) -> list[RequestRecord]:
    """Requests at ``rate`` a second: Poisson arrivals, or a trace's own gaps (``gaps``, cycling)."""
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
        if gaps:
            offset += 0.0 if i == 0 else gaps[(i - 1) % len(gaps)]
        else:
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


Counters = Callable[[], Awaitable[dict[str, float]]]


@dataclass(frozen=True)
class Load:
    """What the load generator sends at every level: where, how, which prompts, how many."""

    base_url: str
    request: RequestSpec
    prompts: tuple[Prompt, ...]
    output_len: int
    sweep: SweepConfig
    model: str | None = None
    engine: str = engines.CUSTOM
    #: Prompts of the warm-up requests, none of them a measured one (empty: the measured prompts, from the end).
    warmup_prompts: tuple[Prompt, ...] = ()

    @property
    def count(self) -> int:
        """Prompts to prepare and requests to send per level (a duration still needs a pool of prompts)."""
        return self.sweep.num_requests


@dataclass(frozen=True)
class _Share:
    """One client process's part of a level."""

    level: Block  # its value: this process's share of the concurrency or rate
    count: int
    warmup: int
    seed: int
    first_index: int = 0
    start_at: float | None = None


async def run_level_in_process(
    load: Load,
    share: _Share,
    *,
    counters: Counters | None = None,
    on_request: Callable[[RequestRecord], None] | None = None,
) -> BlockRun:
    """One level (or one worker's share of it) in this process's event loop."""
    level, sweep, opts = share.level, load.sweep, load.request
    count, warmup = share.count, share.warmup
    conc = int(level.value) if level.mode == "concurrency" else (sweep.max_concurrency or max(1, min(1024, count)))
    url = load.base_url.rstrip("/") + PATHS[opts.path_kind]
    headers = bearer(opts.api_key)
    ensure_fd_limit(conc)
    pool = Pool(load.base_url, max(conc, 1))
    prompts = load.prompts
    raws = [pool.request_bytes(PATHS[opts.path_kind], orjson.dumps(request_body(opts, p, load.output_len, load.model,
                                                                               load.engine)), headers)
            for p in prompts]

    warm_raws = [pool.request_bytes(PATHS[opts.path_kind], orjson.dumps(request_body(opts, p, load.output_len, load.model,
                                                                                    load.engine)), headers)
                 for p in load.warmup_prompts] or raws
    reader = engines.EventReader(load.engine)

    async def send(rec: RequestRecord, i: int) -> None:
        p = prompts[i % len(prompts)]
        rec.prompt_index, rec.category, rec.endpoint = i % len(prompts), p.category, opts.path_kind
        if p.input_tokens is not None:
            rec.prompt_tokens, rec.prompt_tokens_exact = p.input_tokens, p.exact
        await stream_request(pool, raws[i % len(raws)], rec, opts.path_kind, opts.timeout_s, reader)
        if on_request is not None and i >= 0:
            on_request(rec)

    async def warm_send(rec: RequestRecord, i: int) -> None:
        rec.warmup = True
        await stream_request(pool, warm_raws[i % len(warm_raws)], rec, opts.path_kind, opts.timeout_s, reader)

    if warmup:
        warm = await _closed_loop(warm_send, min(conc, warmup), warmup, None, -warmup)
        if all(not r.ok for r in warm):
            first = warm[0]
            raise RuntimeError(
                f"all {warmup} warm-up requests to {url} failed ({first.error_type}: {first.error_message}); "
                "check the URL, endpoint and API key"
            )
    await pool.prefill(min(conc, 4096))  # no TCP setup inside the timed path
    engine_before = await counters() if counters else {}
    if share.start_at is not None:
        await asyncio.sleep(max(0.0, share.start_at - time.perf_counter()))
    started_at = time.time()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with _LagMonitor() as lag:
        if level.mode == "concurrency":
            records = await _closed_loop(send, conc, count, sweep.duration_s, share.first_index)
        else:
            arrivals = [p.arrival_s for p in prompts]
            gaps = trace_gaps([a for a in arrivals if a is not None], level.value) \
                if arrivals and all(a is not None for a in arrivals) else None
            records = await _open_loop(send, level.value, count, sweep.duration_s, sweep.max_concurrency, share.seed,
                                       share.first_index, gaps)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    pool.close()
    engine_after = await counters() if counters else {}
    p99, worst = lag.stats_ms()
    return BlockRun(level, records, started_at, cpu, wall, p99, worst, 1, engine_before, engine_after,
                    connections_opened=pool.opened)


def run_async(coro: Any) -> Any:
    """asyncio.run on uvloop when it is installed (a faster event loop for the client)."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def run_to_wire(run: BlockRun) -> dict[str, Any]:
    """A level's outcome as plain data, for crossing a process boundary (client worker processes, and
    the load generator on the GPU host): its records and what the client measured of itself."""
    return {"records": [r.as_dict() for r in run.records], "cpu": run.client_cpu_s, "wall": run.client_wall_s,
            "lag_p99": run.loop_lag_p99_ms, "lag_max": run.loop_lag_max_ms, "started_at": run.started_at,
            "connections": run.connections_opened, "workers": run.workers, "engine_before": run.engine_before,
            "engine_after": run.engine_after}


def run_from_wire(level: Block, wire: dict[str, Any]) -> BlockRun:
    return BlockRun(level, [RequestRecord(**row) for row in wire["records"]], wire["started_at"],
                    client_cpu_s=wire["cpu"], client_wall_s=wire["wall"], loop_lag_p99_ms=wire["lag_p99"],
                    loop_lag_max_ms=wire["lag_max"], workers=wire.get("workers", 1),
                    engine_before=wire.get("engine_before", {}), engine_after=wire.get("engine_after", {}),
                    connections_opened=wire["connections"])


def _worker_entry(load: Load, share: _Share) -> dict[str, Any]:
    return run_to_wire(run_async(run_level_in_process(load, share)))


async def run_level(
    load: Load,
    level: Block,
    *,
    counters: Counters | None = None,
    on_request: Callable[[RequestRecord], None] | None = None,
) -> BlockRun:
    """One level, in this process or spread over ``sweep.workers`` processes. ``counters`` reads the
    server's cumulative counters; it is called right before and right after the timed load."""
    sweep = load.sweep
    workers = sweep.workers
    if level.mode == "concurrency":
        workers = min(workers, int(level.value))
    seed = sweep_seed(level)
    if workers <= 1:
        share = _Share(level, sweep.num_requests, sweep.warmup_requests, seed)
        return await run_level_in_process(load, share, counters=counters, on_request=on_request)
    import concurrent.futures
    import multiprocessing

    count_shares = [sweep.num_requests // workers + (1 if i < sweep.num_requests % workers else 0) for i in range(workers)]
    if level.mode == "concurrency":
        values = [float(int(level.value) // workers + (1 if i < int(level.value) % workers else 0)) for i in range(workers)]
    else:
        values = [level.value / workers] * workers
    start_at = time.perf_counter() + 3.0 + 0.5 * workers  # all workers start their clocks together
    shares, first = [], 0
    for w in range(workers):
        shares.append(_Share(level.model_copy(update={"value": values[w]}), count_shares[w],
                             math.ceil(sweep.warmup_requests / workers), seed + w, first, start_at))
        first += count_shares[w]
    loop = asyncio.get_running_loop()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        running = [loop.run_in_executor(pool, _worker_entry, load, s) for s in shares]
        # The workers warm up and then wait for start_at: read the counters just before it.
        await asyncio.sleep(max(0.0, start_at - 0.05 - time.perf_counter()))
        engine_before = await counters() if counters else {}
        results = await asyncio.gather(*running)
    engine_after = await counters() if counters else {}
    records = [RequestRecord(**row) for res in results for row in res["records"]]
    lags = [r["lag_p99"] for r in results if r["lag_p99"] is not None]
    return BlockRun(
        level, records, min(r["started_at"] for r in results),
        client_cpu_s=sum(r["cpu"] for r in results), client_wall_s=max(r["wall"] for r in results),
        loop_lag_p99_ms=max(lags) if lags else None,
        loop_lag_max_ms=max((r["lag_max"] for r in results if r["lag_max"] is not None), default=None),
        workers=workers, engine_before=engine_before, engine_after=engine_after,
        connections_opened=sum(r["connections"] for r in results),
    )


def sweep_seed(level: Block) -> int:
    """A seed per level and repeat that is the same in every process and run."""
    return (int(level.value * 1000) * 7919 + level.repeat * 104729 + (0 if level.mode == "concurrency" else 15485863)) \
        & 0x7FFFFFFF

