"""run_concurrency_benchmark: one task per level, its result persisted where every worker reads it.

The cache key is the task's inputs except the server's address (a retry may reach the
same server through another local port) and the load generator's connection, its source, and the flow run id: so a retried
flow run reuses every level that finished, wherever it runs, and a new flow run always
measures afresh. The level is written to the store by the task itself, as soon as it ends.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE, RUN_ID, TASK_SOURCE, Inputs

from specsweep.bench.remote import HostLoadGenerator
from specsweep.gpu_metrics import GpuWatch
from specsweep.records import Level, LevelRow
from specsweep.sweep import BenchTarget, SweepJob, WarmUp, measure_level, settle
from tasks._common import run_logger

LEVEL_CACHE = Inputs(exclude=["target", "on_host", "gpus"]) + TASK_SOURCE + RUN_ID


@task(name="run_concurrency_benchmark", persist_result=True, cache_policy=LEVEL_CACHE,
      task_run_name="benchmark {job.config_name} {level}")
async def run_concurrency_benchmark(target: BenchTarget, job: SweepJob, level: Level,
                                    on_host: HostLoadGenerator | None = None, gpus: GpuWatch | None = None) -> LevelRow:
    """Measure one level against the running server and store it; return its figures. ``on_host``: the
    load generator on the server's host, when the host config puts it there; ``gpus``: the server's GPUs,
    read with nvidia-smi while the level runs (where the host has it)."""
    logger = run_logger()
    if target.request.api_key:
        logger.redactor.add(target.request.api_key.get_secret_value())
    sweep, workload = job.sweep, job.workload
    logger.info("%s: level %s (repeat %d) — %d requests, %d-token outputs, %d warm-up%s", job.config_name, level.label,
                level.repeat, sweep.num_requests, workload.output_len, sweep.warmup_requests,
                f" — load generated on {on_host.host.label}" if on_host else "")
    row = await measure_level(target, job, level, on_host=on_host, gpus=gpus)
    spec = f", accept length {row.spec_accept_length:.2f}" if row.spec_accept_length else ""
    spec += f", acceptance {row.spec_acceptance_rate:.0%}" if row.spec_acceptance_rate else ""
    logger.info(
        "%s %s: %.1f output tok/s, TTFT p50 %.1f ms / p99 %.1f ms, TPOT p50 %.2f ms, %d ok, %d failed%s%s",
        job.config_name, level.label, row.output_tokens_per_s, row.ttft_ms_median or 0, row.ttft_ms_p99 or 0,
        row.tpot_ms_median or 0, row.completed, row.failed, spec, _client_note(row),
    )
    if row.failed:
        logger.warning("%s %s: %d request(s) failed (%s)", job.config_name, level.label, row.failed, row.errors)
    return row


@task(name="warm_up", cache_policy=NO_CACHE, task_run_name="warm up {job.config_name}")
async def warm_up(target: BenchTarget, job: SweepJob, max_requests: int = 24) -> WarmUp:
    """After a start: single requests until the server's time to first token settles (or a cap)."""
    report = await settle(target, job, max_requests=max_requests)
    if max_requests <= 0:
        return report
    shown = ", ".join(f"{x:.0f}" for x in report.ttft_ms[-6:])
    run_logger().info("%s warmed up with %d request(s) in %.1f s: TTFT %s ms (last %d)%s", job.config_name,
                      report.requests, report.seconds, shown, min(6, report.requests),
                      "" if report.settled else " — not settled within the cap; the first level may read high")
    return report


def _client_note(row: LevelRow) -> str:
    """Why the client's figures may be off, and what to do about it."""
    if not row.client_bottleneck:
        return ""
    if (row.client_cpu_share or 0.0) >= 0.9:
        return " — the client was the bottleneck (its CPU was busy): use more client workers"
    return (f" — the client's event loop was held up (lag p99 {row.client_loop_lag_p99_ms or 0:.0f} ms) while "
            "using little CPU itself: the machine is short of CPU (is the server on it too?); latencies include that wait")
