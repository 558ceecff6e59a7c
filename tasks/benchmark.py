"""run_concurrency_benchmark: one task per level, its result persisted.

With the flow's ``persist_result=True`` and the default cache policy (inputs, task
source, flow run id), a retried flow run reuses every level that finished and measures
only what failed; a new flow run always measures afresh. The level is written to the
store by the task itself, as soon as it ends.
"""

from __future__ import annotations

from typing import Any

from prefect import task

from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.bench.measure import BenchTarget, measure_level
from specsweep.report import level_label
from specsweep.store import ResultsStore
from tasks._common import run_logger


@task(name="run_concurrency_benchmark", persist_result=True, task_run_name="benchmark {config_name} {mode}={value} #{repeat}")
async def run_concurrency_benchmark(
    target: BenchTarget,
    workload: WorkloadConfig,
    sweep: SweepConfig,
    results_dir: str,
    run_id: str,
    config_name: str,
    level_index: int,
    mode: str,
    value: float,
    repeat: int = 0,
    tokens_before: int = 0,
) -> dict[str, Any]:
    """Measure one level against the running server and store it; return its figures."""
    logger = run_logger()
    if target.request.api_key:
        logger.redactor.add(target.request.api_key.get_secret_value())
    logger.info("%s: level %s (repeat %d) — %d requests, %d-token outputs, %d warm-up",
                config_name, f"{mode}={value:g}", repeat, sweep.num_requests, workload.output_len, sweep.warmup_requests)
    row = await measure_level(target, workload, sweep, store=ResultsStore(results_dir), run_id=run_id,
                              config_name=config_name, level_index=level_index, mode=mode, value=value, repeat=repeat,
                              tokens_before=tokens_before)
    spec = f", accept length {row['spec_accept_length']:.2f}" if row.get("spec_accept_length") else ""
    spec += f", acceptance {row['spec_acceptance_rate']:.0%}" if row.get("spec_acceptance_rate") else ""
    logger.info(
        "%s %s: %.1f output tok/s, TTFT p50 %.1f ms / p99 %.1f ms, ITL p50 %.2f ms, %d ok, %d failed%s%s",
        config_name, level_label(row), row["output_tokens_per_s"], row["ttft_ms_median"] or 0, row["ttft_ms_p99"] or 0,
        row["itl_ms_median"] or 0, row["completed"], row["failed"], spec,
        _client_note(row),
    )
    if row["failed"]:
        logger.warning("%s %s: %d request(s) failed (%s)", config_name, level_label(row), row["failed"], row["errors"])
    return row


def _client_note(row: dict[str, Any]) -> str:
    """Why the client's figures may be off, and what to do about it."""
    if not row.get("client_bottleneck"):
        return ""
    if (row.get("client_cpu_share") or 0.0) >= 0.9:
        return " — the client was the bottleneck (its CPU was busy): use more client workers"
    return (f" — the client's event loop was held up (lag p99 {row.get('client_loop_lag_p99_ms') or 0:.0f} ms) while "
            "using little CPU itself: the machine is short of CPU (is the server on it too?); latencies include that wait")
