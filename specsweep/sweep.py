"""The sweep engine: the one place that runs levels, keeps them, and records the run.

    plan(sweep)                       → the levels, in order (index, mode, value, repeat)
    run_levels(levels, measure, ...)  → each level measured by ``measure``, the server
                                        checked after failures, the sweep stopped at saturation
    measure_level(target, job, level) → one level: prompts → load → records → figures → store
    RunRecorder                       → the run's row: running, then completed/failed/cancelled

The CLI hands ``run_levels`` the plain ``measure_level``; the flows hand it their Prefect
task (persisted, so that a retried flow run reuses finished levels) and their crash check.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from specsweep import metrics
from specsweep.bench.config import RequestOptions, SweepConfig, WorkloadConfig
from specsweep.bench.runner import Load, run_level
from specsweep.bench.workload import Prompt, build_prompts, server_tokenizer
from specsweep.records import Level, LevelRow, RequestRecord, RunRow, RunStatus
from specsweep.server_api import ServerAPI
from specsweep.storage import StorageOptions
from specsweep.store import ResultsStore, now_iso

Measure = Callable[[Level], Awaitable[LevelRow]]
ServerCheck = Callable[[str], Awaitable[None]]
OnLevel = Callable[[LevelRow, int, int], Awaitable[None]]


class BenchTarget(BaseModel):
    """Where and how to send requests."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="Server address, e.g. http://127.0.0.1:30000.", pattern=r"^https?://[^\s/]+")
    request: RequestOptions = Field(default_factory=RequestOptions, description="Endpoint, API key, sampling.")
    engine: str = Field("custom", description="The engine behind the URL (asks SGLang for per-request speculation data).")

    def api(self) -> ServerAPI:
        return ServerAPI(self.base_url, self.request.api_key)


class SweepJob(BaseModel):
    """What every level of one run shares: which run, where it is stored, what to send."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    config_name: str
    results: str = Field(description="Results root: a path or a filesystem URL.")
    storage: StorageOptions | None = Field(None, description="Object store credentials, when the root needs them.")
    workload: WorkloadConfig
    sweep: SweepConfig

    def store(self) -> ResultsStore:
        return ResultsStore(self.results, self.storage)


def plan(sweep: SweepConfig) -> list[Level]:
    """Every level of a sweep in the order it is measured: each level's repeats back to back."""
    return [Level(index=i, mode=mode, value=value, repeat=r)
            for i, (mode, value) in enumerate(sweep.levels()) for r in range(sweep.repeats)]


# -- one level ---------------------------------------------------------------------------------

_prompt_cache: dict[str, tuple[Prompt, ...]] = {}


async def _prompts(api: ServerAPI, model: str | None, workload: WorkloadConfig, count: int) -> tuple[Prompt, ...]:
    key = json.dumps([model, workload.model_dump(mode="json"), count])
    if key not in _prompt_cache:
        _prompt_cache[key] = tuple(await build_prompts(workload, count, server_tokenizer(api)))
    return _prompt_cache[key]


async def measure_level(
    target: BenchTarget,
    job: SweepJob,
    level: Level,
    *,
    on_request: Callable[[RequestRecord], None] | None = None,
) -> LevelRow:
    """Run one level, write it to the store (atomically) and return its row."""
    sweep = job.sweep
    count = sweep.num_requests if sweep.duration_s is None else max(sweep.num_requests, 256)
    # Fresh prompts for every level and repeat (seeded, so reruns send the same ones): a server
    # with a prompt cache must not answer later levels from what earlier ones left behind.
    workload = job.workload.model_copy(update={"seed": job.workload.seed + 1000 * level.index + level.repeat})
    async with target.api() as api:
        model = target.request.model or await api.first_model()
        load = Load(base_url=target.base_url, request=target.request, prompts=await _prompts(api, model, workload, count),
                    output_len=workload.output_len, sweep=sweep, model=model, engine=target.engine)
        run = await run_level(load, level, counters=api.spec_counters, on_request=on_request)
    row = metrics.level_row(run, config_name=job.config_name)
    job.store().write_level(job.run_id, level.key, row, metrics.request_rows(run))
    return row


# -- the sweep ---------------------------------------------------------------------------------


def saturated(rows: list[LevelRow], *, min_gain: float = 0.05) -> bool:
    """True once output throughput stopped rising for two levels while latency grew.

    ``rows`` are per-level figures in sweep order (one per level, repeats merged).
    """
    if len(rows) < 3:
        return False
    best_before = max(r.output_tokens_per_s for r in rows[:-2])
    flat = all(r.output_tokens_per_s <= best_before * (1 + min_gain) for r in rows[-2:])
    lat = [r.e2e_ms_median or 0.0 for r in rows[-3:]]
    return flat and lat[2] > lat[1] > lat[0]


def merge_repeats(rows: list[LevelRow]) -> LevelRow:
    """One row per level: the median over repeats of every measured figure (the level's identity
    and counts are the first repeat's)."""
    if len(rows) == 1:
        return rows[0]
    merged: dict[str, Any] = rows[0].model_dump()
    for name in merged:
        values = [v for r in rows if isinstance(v := getattr(r, name), float)]
        if values:
            merged[name] = statistics.median(values)
    return LevelRow.model_validate(merged)


async def run_levels(
    levels: list[Level],
    measure: Measure,
    *,
    stop_at_saturation: bool = False,
    check_server: ServerCheck | None = None,
    on_level: OnLevel | None = None,
    on_saturation: Callable[[], None] | None = None,
) -> list[LevelRow]:
    """Measure the levels in order and return their rows.

    ``check_server(when)`` runs after a level with failed requests and when ``measure`` raises:
    it raises if the server is gone (the sweep stops there, with the levels before it kept).
    """
    rows: list[LevelRow] = []
    merged: list[LevelRow] = []
    by_index: dict[int, list[LevelRow]] = {}
    for n, level in enumerate(levels, 1):
        try:
            row = await measure(level)
        except Exception:
            if check_server is not None:
                await check_server(f"while level {level.label} was measured")
            raise
        rows.append(row)
        by_index.setdefault(level.index, []).append(row)
        if row.failed and check_server is not None:
            await check_server(f"during level {level.label}")
        if on_level is not None:
            await on_level(row, n, len(levels))
        last_of_level = n == len(levels) or levels[n].index != level.index
        if last_of_level:
            merged.append(merge_repeats(by_index[level.index]))
            if stop_at_saturation and saturated(merged):
                if on_saturation is not None:
                    on_saturation()
                break
    return rows


# -- the run's record ----------------------------------------------------------------------------


def describe_error(exc: BaseException) -> str:
    """An exception as the run row keeps it: its message and any notes added on the way out."""
    notes = getattr(exc, "__notes__", None) or []
    return "; ".join([str(exc) or type(exc).__name__, *notes])[:2000]


class RunRecorder:
    """Writes a run's row when it starts ("running") and when it ends, however it ends."""

    def __init__(self, store: ResultsStore, run_id: str, row: RunRow) -> None:
        self.store, self.run_id, self.row = store, run_id, row

    def update(self, **fields: Any) -> None:
        self.row = self.row.model_copy(update=fields)
        self.store.write_run(self.run_id, self.row)

    def record_fingerprint(self, fp: dict[str, Any]) -> None:
        """The environment: GPU, driver, engine version and model as columns, the rest as JSON."""
        fp = dict(fp)
        columns = {k: fp.pop(k, None) for k in ("gpu", "gpu_count", "driver", "engine_version", "model")}
        fp.pop("host", None)
        self.update(**columns, fingerprint_json=json.dumps(fp, sort_keys=True, default=str))

    def __enter__(self) -> RunRecorder:
        self.update(status="running", started_at=self.row.started_at or now_iso())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        status: RunStatus = "completed"
        if exc is not None:
            cancelled = exc_type is not None and (issubclass(exc_type, KeyboardInterrupt)
                                                  or exc_type.__name__ == "CancelledError")
            status = "cancelled" if cancelled else "failed"
        self.update(status=status, ended_at=now_iso(), error=describe_error(exc) if exc is not None else None)


def new_run_row(*, config_name: str, engine: str, job: SweepJob, host: str, base_url: str | None = None,
                command: str | None = None, flow_run_id: str | None = None) -> RunRow:
    return RunRow(config_name=config_name, engine=engine, command=command, host=host, base_url=base_url,
                  flow_run_id=flow_run_id, workload_json=job.workload.model_dump_json(),
                  sweep_json=job.sweep.model_dump_json(), started_at=now_iso())


def finished_run(store: ResultsStore, run_id: str) -> list[LevelRow] | None:
    """The levels of a run that completed (in an earlier try of the same flow run), else None."""
    if not store.has_run(run_id) or store.run(run_id).status != "completed":
        return None
    return store.level_rows(run_id)
