"""The sweep engine: the one place that runs levels, keeps them, and records the run.

    points(sweep)                     → the levels, in order (index, mode, value)
    run_levels(points, measure, more) → each level measured in blocks by ``measure`` until
                                        ``more`` says enough; the server checked after
                                        failures; the sweep stopped at saturation
    run_in_turn(...)                  → the same for several configurations, blocks in turn
    measure_level(target, job, level) → one level: prompts → load → records → figures → store
    stored_level(job, level)          → a level this run already stored (a retried flow run
                                        measures only what did not finish)
    RunRecorder                       → the run's row: running, then completed/failed/cancelled

The CLI hands ``run_levels`` the plain ``measure_level``; the flows hand it their Prefect
task and their crash check. ``specsweep.designs`` drives it for comparisons and grids.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from specsweep import engines, metrics
from specsweep.bench.config import RequestOptions, SweepConfig, WorkloadConfig
from specsweep.bench.remote import HostLoadGenerator
from specsweep.bench.runner import Load, run_level
from specsweep.bench.workload import Prompt, Tokenizer, build_prompts, local_tokenizer, prompts_digest
from specsweep.errors import ConfigError
from specsweep.records import Level, LevelRow, Mode, RequestRecord, RunRow, RunStatus
from specsweep.results import ResultsStore, now_iso
from specsweep.server import engine_metrics
from specsweep.server.api import ServerAPI
from specsweep.server.gpus import GpuWatch, level_gpu_figures

Measure = Callable[[Level], Awaitable[LevelRow]]
ServerCheck = Callable[[str], Awaitable[None]]
OnLevel = Callable[[LevelRow, int, int], Awaitable[None]]


class BenchTarget(BaseModel):
    """Where and how to send requests."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="Server address, e.g. http://127.0.0.1:30000.", pattern=r"^https?://[^\s/]+")
    request: RequestOptions = Field(default_factory=RequestOptions, description="Endpoint, API key, sampling.")
    engine: str = Field(engines.CUSTOM, description="The engine behind the URL (what its requests ask for, what its "
                        "answers carry).")

    def api(self) -> ServerAPI:
        return ServerAPI(self.base_url, self.request.api_key)


@dataclass(frozen=True)
class SweepJob:
    """What every level of one run shares: which run, where it is stored, what to send."""

    run_id: str
    config_name: str
    store: ResultsStore
    workload: WorkloadConfig
    sweep: SweepConfig


@dataclass(frozen=True)
class Point:
    """A level of the sweep before its blocks: where it stands, closed or open loop, how much load."""

    index: int
    mode: Mode
    value: float

    def block(self, repeat: int) -> Level:
        return Level(index=self.index, mode=self.mode, value=self.value, repeat=repeat)

    @property
    def label(self) -> str:
        return self.block(0).label


def points(sweep: SweepConfig) -> list[Point]:
    """The sweep's levels in the order they are measured."""
    return [Point(i, mode, value) for i, (mode, value) in enumerate(sweep.levels())]  # type: ignore[arg-type]


# -- one level ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class PromptSet:
    """A level's prompts, how their lengths were counted, and their digest (stored with the level, so a
    comparison can tell that both configurations were sent the same prompts)."""

    prompts: tuple[Prompt, ...]
    counted_by: str  # local | server | approximate
    digest: str


#: How often the engine's /metrics gauges are read while a level runs.
ENGINE_SAMPLE_S = 0.25

_prompt_cache: dict[str, PromptSet] = {}


def server_tokenizer(api: ServerAPI) -> Tokenizer:
    """The server's /tokenize, a few calls at a time; None counts (the approximate path) where its answers
    make no sense."""
    return Tokenizer("server", api.count_tokens_many)


async def _prompts(api: ServerAPI, model: str | None, workload: WorkloadConfig, count: int) -> PromptSet:
    """The prompts for one level: built once per workload, seed and count in this process, so that both
    configurations of a comparison get the very same prompts."""
    key = json.dumps([model if workload.tokenizer is None else None, workload.model_dump(mode="json"), count])
    if key not in _prompt_cache:
        tokenizer = local_tokenizer(workload.tokenizer) if workload.tokenizer else server_tokenizer(api)
        prompts = tuple(await build_prompts(workload, count, tokenizer))
        counted_by = tokenizer.source if prompts and all(p.exact for p in prompts) else "approximate"
        _prompt_cache[key] = PromptSet(prompts, counted_by, prompts_digest(prompts))
    return _prompt_cache[key]


def marked(prompt_set: PromptSet, block: str) -> PromptSet:
    """The prompts, each opening with a mark of its block and place (``[block#i]``): nothing of one block is a
    prefix cached by another. The marks are the same in each configuration (the block's key, not the server's)."""
    def mark(p: Prompt, i: int) -> Prompt:
        tag = f"[{block}#{i}] "
        messages = p.messages
        if messages:
            first_user = next((j for j, (role, _) in enumerate(messages) if role == "user"), 0)
            messages = tuple((r, tag + c if j == first_user else c) for j, (r, c) in enumerate(messages))
        return dataclasses.replace(p, text=tag + p.text, messages=messages)

    prompts = tuple(mark(p, i) for i, p in enumerate(prompt_set.prompts))
    return PromptSet(prompts, prompt_set.counted_by, prompts_digest(prompts))


def warmup_workload(workload: WorkloadConfig, prompts: Sequence[Prompt]) -> WorkloadConfig:
    """Prompts for warm-up requests that no level measures (a cache must not hold a measured prompt): synthetic
    text of the measured prompts' median length, from a seed of its own."""
    lengths = sorted(p.input_tokens for p in prompts if p.input_tokens)
    return workload.model_copy(update={
        "source": "synthetic", "input_len": lengths[len(lengths) // 2] if lengths else workload.input_len,
        "input_len_range": 0.0, "seed": workload.seed + 7_000_003})


def request_for(request: RequestOptions, workload: WorkloadConfig, prompts: Sequence[Prompt]) -> RequestOptions:
    """The request options with the defaults the prompts decide: chat for chat messages, ignore_eos for synthetic
    text only. Chat messages cannot go to the completions endpoint (the model's chat template would be lost)."""
    chat = any(p.messages for p in prompts)
    resolved = request.resolved(chat=chat, synthetic=workload.source == "synthetic")
    if chat and resolved.path_kind != "chat":
        raise ConfigError(f"the prompts of source {workload.source!r} are chat messages, which the "
                          f"{resolved.path_kind} endpoint cannot take without losing the model's chat template: "
                          "set request.endpoint to 'chat' (or leave it empty)")
    return resolved


async def measure_level(
    target: BenchTarget,
    job: SweepJob,
    level: Level,
    *,
    on_request: Callable[[RequestRecord], None] | None = None,
    on_host: HostLoadGenerator | None = None,
    gpus: GpuWatch | None = None,
) -> LevelRow:
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
        # can, else (real prompt sets repeat across blocks) each prompt opens with a mark of its own block.
        reset = await api.reset_prefix_cache(engines.cache_resets(target.engine))
        if reset is None and workload.source != "synthetic":
            prompt_set = marked(prompt_set, level.key)
        request = request_for(target.request, workload, prompt_set.prompts)
        warm = (await _prompts(api, model, warmup_workload(workload, prompt_set.prompts), sweep.warmup_requests)).prompts \
            if sweep.warmup_requests else ()
        load = Load(base_url=target.base_url, request=request, prompts=prompt_set.prompts,
                    output_len=workload.output_len, sweep=sweep, model=model, engine=target.engine,
                    warmup_prompts=warm)
        # The engine's gauges (its batch, queue, KV cache) are read here while the level runs, wherever
        # its load comes from; its counters right before and after the timed load.
        watch = gpus.fresh() if gpus is not None else None
        async with engine_metrics.Sampler(api.metrics_text, interval_s=ENGINE_SAMPLE_S) as sampler, \
                watch or contextlib.nullcontext():
            if on_host is not None:
                run = await on_host.run(load, level)
            else:
                run = await run_level(load, level, counters=api.engine_snapshot, on_request=on_request)
        run.engine_during = sampler.samples.within(run.started_at, run.started_at + run.client_wall_s)
    gpu = level_gpu_figures(watch.within(run.started_at, run.started_at + run.client_wall_s)) if watch else {}
    row = metrics.level_row(run, config_name=job.config_name).model_copy(
        update={"prompts_digest": prompt_set.digest, "prompt_tokens_by": prompt_set.counted_by,
                "prompt_source": workload.source, "endpoint": request.path_kind, "ignore_eos": request.ignore_eos,
                "cache_reset": reset or ("unique prompts" if workload.source != "synthetic" else None),
                "temperature": request.temperature, "top_p": request.top_p, **gpu})
    job.store.write_level(job.run_id, level.key, row, metrics.request_rows(run))
    return row


async def set_aside(job: SweepJob, row: LevelRow) -> None:
    """Store a block again as judged: set aside as disturbed (with its reason), or counted after all (its
    disturbance recurred: the server's)."""
    job.store.write_level_row(job.run_id, row.level.key, row)


def stored_level(job: SweepJob, level: Level) -> LevelRow | None:
    """The level as this run already stored it (an earlier try of the same flow run measured it), or None."""
    return job.store.level_row(job.run_id, level.key)


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
        measured = (await _prompts(api, model, job.workload, 1)).prompts
        workload = warmup_workload(job.workload, measured)
        prompts = (await _prompts(api, model, workload, max_requests)).prompts
        request = request_for(target.request, job.workload, measured)
        for i in range(max_requests):
            load = Load(base_url=target.base_url, request=request, prompts=(prompts[i],),
                        output_len=workload.output_len, sweep=one, model=model, engine=target.engine)
            run = await run_level(load, Level(index=0, mode="concurrency", value=1))
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


More = Callable[[Point, list[LevelRow]], bool]


def repeats(n: int) -> More:
    """A fixed number of blocks per level."""
    return lambda point, rows: len(rows) < n


SetAside = Callable[[LevelRow], Awaitable[None]]
#: Blocks (or rounds of blocks in turn) of one level set aside as disturbed at most: past it the level keeps
#: what it has, and says so.
MAX_SET_ASIDE = 4
PAIRED_WITH_DISTURBED = "measured in turn with a block that was set aside"


class _Sweep:
    """What the sweeps share: measuring a block with the crash check around it, setting aside a block the
    machine disturbed, and the stop at saturation."""

    def __init__(self, stop_at_saturation: bool, on_saturation: Callable[[], None] | None) -> None:
        self.stop_at_saturation, self.on_saturation = stop_at_saturation, on_saturation
        self.merged: list[LevelRow] = []

    @staticmethod
    async def block(measure: Measure, level: Level, check_server: ServerCheck | None) -> LevelRow:
        try:
            row = await measure(level)
        except Exception:
            if check_server is not None:
                await check_server(f"while level {level.label} was measured")
            raise
        if row.failed and check_server is not None:
            await check_server(f"during level {level.label}")
        return row

    @staticmethod
    async def judged(row: LevelRow, level_rows: list[LevelRow], clean: list[LevelRow],
                     set_aside: SetAside | None) -> LevelRow:
        """The block judged against its level's earlier blocks (``level_rows``, the ``clean`` ones among them).
        Failed requests or a client lag met again after a block was set aside for them are how the level runs
        here: the block counts (stored so), unless no request of it completed (an outage, or a server that
        answers nothing, has no throughput to count). A stall is a disturbance however often it comes back
        (up to MAX_SET_ASIDE). Else it is marked disturbed when its
        throughput lies far outside its level's clean blocks. A disturbed block goes to ``set_aside`` (stored
        with its reason)."""
        cause = metrics.own_cause(row.disturbed)
        if cause in metrics.THE_SERVERS_WHEN_MET_AGAIN and row.completed and \
                any(metrics.own_cause(r.disturbed) == cause for r in level_rows):
            row = row.model_copy(update={"disturbed": None})
            if set_aside is not None:
                await set_aside(row)
            return row
        if row.disturbed is None and (why := metrics.outlier(row.throughput, [r.throughput for r in clean])):
            row = row.model_copy(update={"disturbed": why})
        if row.disturbed is not None and set_aside is not None:
            await set_aside(row)
        return row

    def saturated_after(self, rows: list[LevelRow]) -> bool:
        self.merged.append(merge_repeats(rows))
        if self.stop_at_saturation and saturated(self.merged):
            if self.on_saturation is not None:
                self.on_saturation()
            return True
        return False


async def run_levels(
    sweep: list[Point],
    measure: Measure,
    *,
    more: More,
    stop_at_saturation: bool = False,
    check_server: ServerCheck | None = None,
    on_level: OnLevel | None = None,
    on_saturation: Callable[[], None] | None = None,
    set_aside: SetAside | None = None,
) -> list[LevelRow]:
    """Measure each level in blocks, in order, and return every block's row.

    ``more(point, rows)`` says whether a level needs another block (``repeats(n)`` for a fixed number); it
    sees only the blocks that count: a block the machine disturbed (``LevelRow.disturbed``; an outlier among
    its level's blocks is marked here and stored again by ``set_aside``) is kept and measured again, at most
    MAX_SET_ASIDE times per level; failures or a client lag met again in the block measured again count.
    ``check_server(when)`` runs after a block with failed requests and when
    ``measure`` raises: it raises if the server is gone (the sweep stops there, with the blocks before it
    kept).
    """
    state = _Sweep(stop_at_saturation, on_saturation)
    rows: list[LevelRow] = []
    for n, point in enumerate(sweep, 1):
        level_rows: list[LevelRow] = []
        clean: list[LevelRow] = []
        while True:
            row = await state.block(measure, point.block(len(level_rows)), check_server)
            row = await state.judged(row, level_rows, clean, set_aside)
            level_rows.append(row)
            rows.append(row)
            if on_level is not None:
                await on_level(row, n, len(sweep))
            if row.disturbed is not None:
                if len(level_rows) - len(clean) > MAX_SET_ASIDE:
                    break
                continue
            clean.append(row)
            if not more(point, clean):
                break
        if state.saturated_after(clean or level_rows):
            break
    return rows


def rotation(arms: int, repeat: int) -> list[int]:
    """Which arm measures first in a round: ABBA for two (so a drift within a pair falls on both alike),
    a rotation for more (each arm in each place in turn)."""
    if arms == 2:
        return [0, 1] if repeat % 2 == 0 else [1, 0]
    return [(repeat + i) % arms for i in range(arms)]


async def run_in_turn(
    sweep: list[Point],
    measures: Sequence[Measure],
    *,
    more: Callable[[list[list[LevelRow]]], bool],
    stop_at_saturation: bool = False,
    checks: Sequence[ServerCheck | None] | None = None,
    on_block: OnLevel | None = None,
    on_saturation: Callable[[], None] | None = None,
    set_asides: Sequence[SetAside | None] | None = None,
) -> list[list[LevelRow]]:
    """The alternate design: at each level, a block of each configuration in turn (``rotation``), round after
    round until ``more(rows per configuration)`` says the level is decided. A round with a disturbed block
    is set aside whole (the others marked as measured beside it) and measured again, at most MAX_SET_ASIDE
    times per level. The first configuration's blocks decide the stop at saturation. Returns every block's
    row of each configuration."""
    k = len(measures)
    checks = list(checks) if checks is not None else [None] * k
    set_asides = list(set_asides) if set_asides is not None else [None] * k
    state = _Sweep(stop_at_saturation, on_saturation)
    out: list[list[LevelRow]] = [[] for _ in range(k)]
    for n, point in enumerate(sweep, 1):
        clean: list[list[LevelRow]] = [[] for _ in range(k)]
        level_rows: list[list[LevelRow]] = [[] for _ in range(k)]
        rounds = aside = 0
        while True:
            level = point.block(rounds)
            rounds += 1
            got: dict[int, LevelRow] = {}
            for arm in rotation(k, level.repeat):
                row = await state.block(measures[arm], level, checks[arm])
                got[arm] = await state.judged(row, level_rows[arm], clean[arm], set_asides[arm])
                level_rows[arm].append(got[arm])
                if on_block is not None:
                    await on_block(got[arm], n, len(sweep))
            if any(r.disturbed is not None for r in got.values()):
                for arm, row in got.items():
                    if row.disturbed is None:
                        got[arm] = row.model_copy(update={"disturbed": PAIRED_WITH_DISTURBED})
                        if (store_it := set_asides[arm]) is not None:
                            await store_it(got[arm])
                for arm in range(k):
                    out[arm].append(got[arm])
                aside += 1
                if aside > MAX_SET_ASIDE:
                    break
                continue
            for arm in range(k):
                out[arm].append(got[arm])
                clean[arm].append(got[arm])
            if await _set_aside_shifted_round(clean, out, set_asides):
                aside += 1
                if aside > MAX_SET_ASIDE:
                    break
                continue
            if not more(clean):
                break
        if state.saturated_after(clean[0] or [r for r in out[0] if r.level_index == point.index]):
            break
    return out


async def _set_aside_shifted_round(clean: list[list[LevelRow]], out: list[list[LevelRow]],
                                   set_asides: Sequence[SetAside | None]) -> bool:
    """Set aside the round whose paired ratio (each arm against the first) lies far outside the others'
    (``metrics.outlier_round``): its rows leave ``clean``, are marked in ``out`` and stored. True if one was."""
    for arm in range(1, len(clean)):
        found = metrics.outlier_round([max(s.throughput, 1e-9) / max(b.throughput, 1e-9)
                                       for b, s in zip(clean[0], clean[arm], strict=False)])
        if found is None:
            continue
        index, why = found
        for a in range(len(clean)):
            row = clean[a].pop(index)
            marked = row.model_copy(update={"disturbed": why})
            out[a][next(i for i, r in enumerate(out[a]) if r is row)] = marked
            if (store_it := set_asides[a]) is not None:
                await store_it(marked)
        return True
    return False


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
                command: str | None = None, flow_run_id: str | None = None, design: str | None = None,
                decision: BaseModel | None = None, verifies: tuple[str, str] | None = None) -> RunRow:
    """``verifies``: (comparison, arm) for a run of the verify stage."""
    return RunRow(config_name=config_name, engine=engine, command=command, host=host, base_url=base_url,
                  flow_run_id=flow_run_id, workload_json=job.workload.model_dump_json(),
                  sweep_json=job.sweep.model_dump_json(), design=design,
                  decision_json=decision.model_dump_json() if decision is not None else None, started_at=now_iso(),
                  verifies=verifies[0] if verifies else None, verify_arm=verifies[1] if verifies else None)


def finished_run(store: ResultsStore, run_id: str) -> list[LevelRow] | None:
    """The levels of a run that completed (in an earlier try of the same flow run), else None."""
    if not store.has_run(run_id) or store.run(run_id).status != "completed":
        return None
    return store.level_rows(run_id)
