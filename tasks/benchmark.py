"""run_concurrency_benchmark: one task per level (block), written to the store as soon as it ends; and
the warm-up after a start.

A retried flow run keeps its run ids, so a level this run already stored is taken from the store
(Parquet, read back as the project's own rows) and not measured again: the retry measures only what
did not finish, on whichever worker picks it up. Nothing of Prefect's result persistence is used.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from specsweep.records import Block, BlockRow
from specsweep.sweep import SweepJob, WarmUp, measure_level, settle, stored_level
from tasks._common import run_logger
from tasks.server import Server


@task(name="run_concurrency_benchmark", cache_policy=NO_CACHE, task_run_name="benchmark {job.config_name} {level}")
async def _benchmark(server: Server, job: SweepJob, level: Block) -> BlockRow:
    logger = run_logger(server.profile, server.host)
    if server.target.request.api_key:
        logger.redactor.add(server.target.request.api_key.get_secret_value())
    if (done := stored_level(job, level)) is not None:
        logger.info("%s %s: measured in an earlier try of this flow run: kept (%.1f output tok/s)", job.config_name,
                    level.label, done.output_tokens_per_s)
        return done
    sweep, workload = job.sweep.for_level(level.mode, level.value), job.workload
    logger.info("%s: level %s (repeat %d) — %d requests, %d-token outputs, %d warm-up%s", job.config_name, level.label,
                level.repeat, sweep.num_requests, workload.output_len, sweep.warmup_requests,
                f" — load generated on {server.on_host.host.label}" if server.on_host else "")
    row = await measure_level(server.target, job, level, on_host=server.on_host, gpus=server.gpus)
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


async def run_concurrency_benchmark(server: Server, job: SweepJob, level: Block) -> BlockRow:
    """Measure one level (a block) against the running server and store it; return its figures. The load
    runs here, or on the server's host where the host config puts it there; the server's GPUs are read
    with nvidia-smi while it runs (where the host has it)."""
    return await _benchmark.with_options(**server.stages.benchmark.task_options())(server, job, level)


@task(name="warm_up", cache_policy=NO_CACHE, task_run_name="warm up {job.config_name}")
async def warm_up(server: Server, job: SweepJob) -> WarmUp:
    """After a start: single requests until the server's time to first token settles (or a cap)."""
    max_requests = server.stages.warm_up_requests
    report = await settle(server.target, job, max_requests=max_requests, max_seconds=server.stages.warm_up_seconds)
    if max_requests <= 0:
        return report
    shown = ", ".join(f"{x:.0f}" for x in report.ttft_ms[-6:])
    run_logger().info("%s warmed up with %d request(s) in %.1f s: TTFT %s ms (last %d)%s", job.config_name,
                      report.requests, report.seconds, shown, min(6, report.requests),
                      "" if report.settled else " — not settled within the cap; the first level may read high")
    return report


def _client_note(row: BlockRow) -> str:
    """Why the client's figures may be off, and what to do about it."""
    if not row.client_bottleneck:
        return ""
    if (row.client_cpu_share or 0.0) >= 0.9:
        return " — the client was the bottleneck (its CPU was busy): use more client workers"
    return (f" — the client's event loop was held up (lag p99 {row.client_loop_lag_p99_ms or 0:.0f} ms) while "
            "using little CPU itself: the machine is short of CPU (is the server on it too?); latencies include that wait")
