"""Measure levels and keep them: one level → records → metrics → the store.

``measure_level`` is the unit a Prefect task wraps (one task per level), and
``run_sweep`` runs a whole sweep for the ``specsweep bench`` command.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from specsweep import metrics
from specsweep.bench.config import RequestOptions, SweepConfig, WorkloadConfig
from specsweep.bench.records import RequestRecord
from specsweep.bench.runner import LevelRun, auth_headers, run_level
from specsweep.bench.workload import Prompt, build_prompts, http_tokenizer
from specsweep.store import ResultsStore, epoch_iso

_prompt_cache: dict[str, list[Prompt]] = {}


class BenchTarget(BaseModel):
    """Where and how to send requests."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="Server address, e.g. http://127.0.0.1:30000.", pattern=r"^https?://[^\s/]+")
    request: RequestOptions = Field(default_factory=RequestOptions, description="Endpoint, API key, sampling.")


def level_key(level_index: int, mode: str, value: float, repeat: int) -> str:
    return f"L{level_index:03d}-{mode}-{value:g}-r{repeat}"


async def prompts_for(target: BenchTarget, workload: WorkloadConfig, count: int) -> list[Prompt]:
    key = json.dumps([target.base_url, workload.model_dump(mode="json"), count])
    if key not in _prompt_cache:
        headers = auth_headers(target.request)
        async with httpx.AsyncClient(timeout=30) as client:
            _prompt_cache[key] = await build_prompts(workload, count, http_tokenizer(client, target.base_url, headers))
    return _prompt_cache[key]


async def server_model(target: BenchTarget) -> str | None:
    if target.request.model:
        return target.request.model
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.get(target.base_url.rstrip("/") + "/v1/models", headers=auth_headers(target.request))
            data = r.json().get("data") if r.status_code == 200 else None
            return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def request_rows(run: LevelRun) -> list[dict[str, Any]]:
    rows = []
    for r in run.records:
        row = r.as_row()
        sent = r.sent_s if r.sent_s is not None else r.scheduled_s
        row["chunk_times_s"] = [t - sent for t in r.chunk_times_s]  # offsets from the send, seconds
        row["ttft_ms"] = None if (x := metrics.ttft_s(r)) is None else x * 1000
        row["e2e_ms"] = None if (x := metrics.e2e_s(r)) is None else x * 1000
        row["tpot_ms"] = None if (x := metrics.tpot_s(r)) is None else x * 1000
        row["send_delay_ms"] = None if r.sent_s is None else (r.sent_s - r.scheduled_s) * 1000
        row.update(mode=run.mode, level_value=run.value, repeat=run.repeat)
        rows.append(row)
    return rows


def level_row(run: LevelRun, *, config_name: str, level_index: int, tokens_before: int | None = None) -> dict[str, Any]:
    m = metrics.level_metrics(run.records)
    spec_c, source = metrics.spec_from_counters(run.spec_before, run.spec_after, m["output_tokens_total"], tokens_before)
    spec_source = "per-request" if (m["spec_acceptance_rate"] is not None or m["spec_accept_length"] is not None) else None
    for key, value in spec_c.items():
        if m.get(key) is None and value is not None:
            m[key] = value
            spec_source = source
    return {
        "config_name": config_name,
        "level_index": level_index,
        "mode": run.mode,
        "concurrency": int(run.value) if run.mode == "concurrency" else None,
        "request_rate_per_s": run.value if run.mode == "rate" else None,
        "repeat": run.repeat,
        "started_at": epoch_iso(run.started_at),
        **m,
        "spec_source": spec_source,
        "client_cpu_s": run.client_cpu_s,
        "client_cpu_share": run.client_cpu_share,
        "client_loop_lag_p99_ms": run.loop_lag_p99_ms,
        "client_loop_lag_max_ms": run.loop_lag_max_ms,
        "client_workers": run.workers,
        "client_connections": run.connections_opened,
        "client_bottleneck": run.client_bottleneck,
    }


async def measure_level(
    target: BenchTarget,
    workload: WorkloadConfig,
    sweep: SweepConfig,
    *,
    store: ResultsStore,
    run_id: str,
    config_name: str,
    level_index: int,
    mode: str,
    value: float,
    repeat: int = 0,
    tokens_before: int | None = None,
    on_request: Callable[[RequestRecord], None] | None = None,
) -> dict[str, Any]:
    """Run one level, write it to the store (atomically) and return its row."""
    count = sweep.num_requests if sweep.duration_s is None else max(sweep.num_requests, 256)
    # Fresh prompts for every level and repeat (seeded, so reruns send the same ones): a server
    # with a prompt cache must not answer later levels from what earlier ones left behind.
    level_workload = workload.model_copy(update={"seed": workload.seed + 1000 * level_index + repeat})
    prompts = await prompts_for(target, level_workload, count)
    model = await server_model(target)
    run = await run_level(target.base_url, target.request, prompts, workload.output_len, sweep, mode, value,
                          repeat=repeat, model=model, on_request=on_request)
    row = level_row(run, config_name=config_name, level_index=level_index, tokens_before=tokens_before)
    store.write_level(run_id, level_key(level_index, mode, value, repeat), row, request_rows(run))
    return row


def saturated(rows: list[dict[str, Any]], *, min_gain: float = 0.05) -> bool:
    """True once output throughput stopped rising for two levels while latency grew.

    ``rows`` are per-level figures in sweep order (one per level, repeats merged).
    """
    if len(rows) < 3:
        return False
    best_before = max(r["output_tokens_per_s"] or 0 for r in rows[:-2])
    last_two = rows[-2:]
    flat = all((r["output_tokens_per_s"] or 0) <= best_before * (1 + min_gain) for r in last_two)
    lat = [r.get("e2e_ms_median") or 0 for r in rows[-3:]]
    growing = lat[2] > lat[1] > lat[0]
    return flat and growing


def merge_repeats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row per level: the median over repeats of every number."""
    import statistics

    if len(rows) == 1:
        return rows[0]
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
            out[key] = statistics.median(vals) if vals else None
    return out


async def run_sweep(
    target: BenchTarget,
    workload: WorkloadConfig,
    sweep: SweepConfig,
    *,
    store: ResultsStore,
    run_id: str,
    config_name: str,
    on_level: Callable[[dict[str, Any]], None] | None = None,
    on_request: Callable[[RequestRecord], None] | None = None,
) -> list[dict[str, Any]]:
    """Every level in order, each written as soon as it ends; stops early at saturation if asked."""
    merged: list[dict[str, Any]] = []
    tokens = 0
    for index, (mode, value) in enumerate(sweep.levels()):
        reps = []
        for repeat in range(sweep.repeats):
            row = await measure_level(target, workload, sweep, store=store, run_id=run_id, config_name=config_name,
                                      level_index=index, mode=mode, value=value, repeat=repeat, tokens_before=tokens,
                                      on_request=on_request)
            tokens += int(row["output_tokens_total"])
            reps.append(row)
            if on_level:
                on_level(row)
        merged.append(merge_repeats(reps))
        if sweep.stop_at_saturation and saturated(merged):
            break
    return merged


def run_row(
    *,
    config_name: str,
    engine: str,
    base_url: str,
    workload: WorkloadConfig,
    sweep: SweepConfig,
    started_at: str,
    status: str,
    fingerprint: dict[str, Any] | None = None,
    command: str | None = None,
    host: str | None = None,
    flow_run_id: str | None = None,
    ended_at: str | None = None,
    time_to_ready_s: float | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """The row of the runs dataset. The fingerprint's fields become columns (gpu, driver, engine_version, model)."""
    fp = dict(fingerprint or {})
    row: dict[str, Any] = {
        "flow_run_id": flow_run_id,
        "config_name": config_name,
        "engine": engine,
        "command": command,
        "host": host or fp.pop("host", None),
        "base_url": base_url,
        "gpu": fp.pop("gpu", None),
        "gpu_count": fp.pop("gpu_count", None),
        "driver": fp.pop("driver", None),
        "engine_version": fp.pop("engine_version", None),
        "model": fp.pop("model", None),
        "fingerprint_json": json.dumps(fp, sort_keys=True, default=str),
        "workload_json": workload.model_dump_json(),
        "sweep_json": sweep.model_dump_json(),
        "started_at": started_at,
        "ended_at": ended_at,
        "status": status,
        "time_to_ready_s": time_to_ready_s,
        "error": error,
    }
    return row
