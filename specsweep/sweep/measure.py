"""One block of a level measured and stored: prompts → load → records → figures → the store (atomically);
a block stored again as judged; a block an earlier try of the run already stored."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

from specsweep import engines, metrics
from specsweep.bench.remote import HostLoadGenerator
from specsweep.bench.runner import Load, run_level
from specsweep.records import Block, BlockRow, RequestRecord
from specsweep.server import engine_metrics
from specsweep.server.controller_state import TierSampler, tier_figures
from specsweep.server.gpus import GpuWatch, level_gpu_figures
from specsweep.sweep.disturbance import disturbance
from specsweep.sweep.job import BenchTarget, SweepJob
from specsweep.sweep.prompts import _prompts, marked, request_for, warmup_workload

#: How often the engine's /metrics gauges are read while a level runs.
ENGINE_SAMPLE_S = 0.25
#: How often an engine's own controller's active tier (where it shows one) is read while a block runs: often
#: enough that a short block (a fraction of a second on the simulator) holds a reading.
CONTROLLER_SAMPLE_S = 0.1

async def measure_level(
    target: BenchTarget,
    job: SweepJob,
    level: Block,
    *,
    on_request: Callable[[RequestRecord], None] | None = None,
    on_host: HostLoadGenerator | None = None,
    gpus: GpuWatch | None = None,
) -> BlockRow:
    """Run one level, write it to the store (atomically) and return its row. With ``on_host`` the level's
    load runs on the server's host (its prompts prepared here, as always) and ``on_request`` is not called.
    With ``gpus`` the server's GPUs are read with nvidia-smi while the level runs."""
    sweep = job.sweep.for_level(level.mode, level.value)
    count = sweep.num_requests if sweep.duration_s is None else max(sweep.num_requests, 256)
    # Fresh prompts for every level and repeat (seeded, so reruns send the same ones): a server
    # with a prompt cache must not answer later levels from what earlier ones left behind.
    workload = job.workload.model_copy(update={"seed": job.workload.seed + 1000 * level.index + level.repeat})
    async with target.api() as api:
        model = target.request.model or await api.first_model()
        prompt_set = await _prompts(api, model, workload, count)
        # No block profits from what an earlier one left in the server's prefix cache: emptied where the engine
        # can, else (real prompt sets repeat across blocks) each prompt opens with a mark of its own block; the
        # configurations compared get the very same prompts (their outputs are compared), but one that shares its
        # servers with them (the verify stage's router) gets a mark of its own, or it reads their cache.
        reset = await api.reset_prefix_cache(engines.cache_resets(target.engine))
        if reset is None:
            shared = marked(prompt_set, level.key) if workload.source != "synthetic" else prompt_set
            if job.own_prompts:  # its own marks; the digest of what the others are sent (their comparison's check)
                prompt_set = dataclasses.replace(marked(prompt_set, level.key, job.config_name), digest=shared.digest)
            else:
                prompt_set = shared
        request = request_for(target.request, workload, prompt_set.prompts)
        warm = (await _prompts(api, model, warmup_workload(workload, prompt_set.prompts), sweep.warmup_requests)).prompts \
            if sweep.warmup_requests else ()
        load = Load(base_url=target.base_url, request=request, prompts=prompt_set.prompts,
                    output_len=workload.output_len, sweep=sweep, model=model, engine=target.engine,
                    warmup_prompts=warm)
        # The engine's gauges (its batch, queue, KV cache) are read here while the level runs, wherever
        # its load comes from; its counters right before and after the timed load.
        watch = gpus.fresh() if gpus is not None else None
        reader = engines.tier_reader(target.engine)
        tiers = TierSampler(api.get_json, *reader, interval_s=CONTROLLER_SAMPLE_S) if reader else None
        async with engine_metrics.Sampler(api.metrics_text, interval_s=ENGINE_SAMPLE_S) as sampler, \
                watch or contextlib.nullcontext(), tiers or contextlib.nullcontext():
            if on_host is not None:
                run = await on_host.run(load, level)
            else:
                run = await run_level(load, level, counters=api.engine_snapshot, on_request=on_request)
        run.engine_during = sampler.samples.within(run.started_at, run.started_at + run.client_wall_s)
    gpu = level_gpu_figures(watch.within(run.started_at, run.started_at + run.client_wall_s)) if watch else {}
    # The engine's own controller's tier while the block ran (where it shows one).
    tier = tier_figures(tiers.within(run.started_at, run.started_at + run.client_wall_s)) if tiers else {}
    row = metrics.level_row(run, config_name=job.config_name).model_copy(
        update={"prompts_digest": prompt_set.digest, "prompt_tokens_by": prompt_set.counted_by,
                "prompt_source": workload.source, "endpoint": request.path_kind, "ignore_eos": request.ignore_eos,
                "cache_reset": reset or ("unique prompts" if workload.source != "synthetic" or job.own_prompts else None),
                "temperature": request.temperature, "top_p": request.top_p, **gpu, **tier})
    row = row.model_copy(update=metrics.energy_figures(row, run.records))  # GPU energy from the power sampled
    row = row.model_copy(update={"disturbed": disturbance(run, row.model_dump())})
    job.store.write_level(job.run_id, level.key, row, metrics.request_rows(run))
    return row

async def set_aside(job: SweepJob, row: BlockRow) -> None:
    """Store a block again as judged: set aside as disturbed (with its reason), or counted after all (its
    disturbance recurred: the server's)."""
    job.store.write_level_row(job.run_id, row.level.key, row)

def stored_level(job: SweepJob, level: Block) -> BlockRow | None:
    """The level as this run already stored it (an earlier try of the same flow run measured it), or None."""
    return job.store.level_row(job.run_id, level.key)
