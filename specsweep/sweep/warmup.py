"""A freshly started server warmed up until its time to first token settles."""

from __future__ import annotations

import statistics
import time

from pydantic import BaseModel

from specsweep import metrics
from specsweep.bench.runner import Load, run_level
from specsweep.records import Block
from specsweep.sweep.job import BenchTarget, SweepJob
from specsweep.sweep.prompts import _prompts, request_for, warmup_workload


class WarmUp(BaseModel):
    """How a freshly started server was warmed up: one request at a time until its TTFT settled."""

    requests: int
    ttft_ms: list[float]
    settled: bool
    seconds: float

async def settle(target: BenchTarget, job: SweepJob, *, max_requests: int = 24, max_seconds: float = 60.0,
                 window: int = 4, tolerance: float = 0.15, jitter_ms: float = 2.0) -> WarmUp:
    """Warm a server up after its start until its time to first token settles: single requests (of the
    run's workload, from prompts no level sends) until the last ``window`` TTFTs all lie within
    ±``tolerance`` of their median (or within ``jitter_ms``, for a server whose TTFT is a few ms, where
    scheduling jitter alone exceeds the fraction), or the cap. The first requests after a start pay for compiled
    kernels, cold caches and lazy allocations; measured levels should not."""
    t0 = time.perf_counter()
    if max_requests <= 0:
        return WarmUp(requests=0, ttft_ms=[], settled=False, seconds=0.0)
    one = job.sweep.model_copy(update={"num_requests": 1, "warmup_requests": 0, "duration_s": None, "workers": 1})
    ttfts: list[float] = []
    settled = False
    async with target.api() as api:
        model = target.request.model or await api.first_model()
        # The warm-up prompts take the median length of a block's prompts (one prompt alone may be the set's longest),
        # of 32 at most (a level may be an endless one of 100,000).
        measured = (await _prompts(api, model, job.workload, max(1, min(job.sweep.num_requests, 32)))).prompts
        workload = warmup_workload(job.workload, measured)
        prompts = (await _prompts(api, model, workload, max_requests)).prompts
        request = request_for(target.request, job.workload, measured)
        for i in range(max_requests):
            load = Load(base_url=target.base_url, request=request, prompts=(prompts[i],),
                        output_len=workload.output_len, sweep=one, model=model, engine=target.engine)
            run = await run_level(load, Block(index=0, mode="concurrency", value=1))
            ttft = metrics.ttft_s(run.records[0])
            if ttft is not None:
                ttfts.append(ttft * 1000)
            recent = ttfts[-window:]
            if len(recent) == window:
                mid = statistics.median(recent)
                settled = all(abs(x - mid) <= max(tolerance * mid, jitter_ms) for x in recent)
            if settled or time.perf_counter() - t0 > max_seconds:
                break
    return WarmUp(requests=len(ttfts), ttft_ms=[round(x, 2) for x in ttfts], settled=settled,
                  seconds=time.perf_counter() - t0)
