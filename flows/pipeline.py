"""What every benchmark flow does, in the order the design card draws it:

    parameters → host → server → load → records → Parquet → comparison → artifacts

``measure_configurations`` holds the host (lock and connection) and runs each profile
through ``measure_configuration``: kill leftovers → start → wait (``served``) →
``run_concurrency_benchmark`` per level (the core's sweep engine) → the final kill. These
are plain async functions, not subflows: their tasks belong to the calling flow run, so
retrying that run reuses every finished level (persisted results, cached by inputs).

``benchmark_flow`` declares a flow with the cleanup hooks every benchmark flow has.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from prefect import Flow, flow, get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.client.schemas.objects import FlowRun, State
from prefect.context import FlowRunContext
from prefect.flows import FlowStateHook
from prefect.logging.loggers import flow_run_logger
from pydantic import BaseModel, SecretStr

from flows.host_lock import LOCK_LEASE_S, host_lock, release_recorded_lease
from specsweep import lifecycle
from specsweep.bench.config import RequestOptions, RequestParams
from specsweep.bench.workload import check_source
from specsweep.compare import Comparison
from specsweep.decision import DecisionConfig, baseline_needs_more, pair_needs_more, speculative_needs_more
from specsweep.hosts import Host, HostConfig, open_host
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.records import Level, LevelRow
from specsweep.settings import BenchmarkSettings
from specsweep.store import ResultsStore
from specsweep.sweep import (
    Measure,
    More,
    RunRecorder,
    ServerCheck,
    SweepJob,
    finished_run,
    new_run_row,
    points,
    repeats,
    run_levels,
    run_paired_levels,
)
from specsweep.tunnel import stop_marked_tunnels
from tasks.benchmark import run_concurrency_benchmark, warm_up
from tasks.blocks import (
    aresolve_host,
    aresolve_profile,
    aresolve_secret,
    check_allowed,
    record_host_keys,
    resolve_host,
)
from tasks.results import artifact_key, compare_configurations, fingerprint_environment, publish_configuration
from tasks.server import Served, served
from tasks.started import StartRecord, forget_recorded, recorded_starts
from tasks.storage import ResultsLocation, aresolve_results, result_storage


class ConfigurationResult(BaseModel):
    config_name: str
    run_id: str
    levels: list[LevelRow]
    time_to_ready_s: float | None


@dataclass
class Prepared:
    """The benchmark settings with what they name read: the API key, the results location."""

    settings: BenchmarkSettings
    request: RequestOptions
    results: ResultsLocation
    store: ResultsStore


async def prepare(benchmark: BenchmarkSettings, profiles: list[ProfileParams]) -> tuple[Prepared, list[ServerProfile]]:
    """Everything a run needs before it touches a host: secrets read, results writable, prompts readable.
    Anything missing is refused here, naming the field."""
    request = await _resolve_request(benchmark.request)
    servers = [await aresolve_profile(p, f"profiles[{i}]" if len(profiles) > 1 else "profile")
               for i, p in enumerate(profiles)]
    results = await aresolve_results(benchmark.results, benchmark.results_block)
    store = ResultsStore(results.url, results.storage_options())
    store.check_writable()
    check_source(benchmark.workload)
    return Prepared(benchmark, request, results, store), servers


async def _resolve_request(request: RequestParams) -> RequestOptions:
    options = request if isinstance(request, RequestOptions) else RequestOptions.model_validate(request.model_dump())
    key = await aresolve_secret(request.api_key_secret, "benchmark.request.api_key_secret")
    return options.model_copy(update={"api_key": SecretStr(key)}) if key else options


@asynccontextmanager
async def opened(config: HostConfig, block: str | None = None) -> AsyncIterator[Host]:
    """The run's one connection to its host. Host keys it trusted by accept_unknown_host_key are kept
    in the ssh-host ``block`` it came from, for later runs to check against."""
    logger = get_run_logger()
    host = open_host(config, logger)
    try:
        yield host
    finally:
        await asyncio.to_thread(host.close)
        if block and (accepted := host.accepted_host_keys()):
            try:
                added = await record_host_keys(block, accepted)
                if added:
                    logger.warning("recorded %d host key(s) trusted this run in ssh-host block %s: later runs check "
                                   "the host against them", len(added), block)
            except Exception as exc:  # noqa: BLE001 - the run's work is done; say what was not kept
                logger.error("could not record the trusted host keys in ssh-host block %s: %s", block, exc)


async def measure_configurations(profiles: list[ProfileParams], host: HostConfig,
                                 benchmark: BenchmarkSettings) -> list[ConfigurationResult]:
    """Each configuration in turn on one host, holding its lock from the first kill to the last; each
    level measured ``benchmark.sweep.repeats`` times."""
    prepared, servers = await prepare(benchmark, profiles)
    host_config = await aresolve_host(host)
    check_allowed(host_config, servers)
    fixed = repeats(benchmark.sweep.repeats)
    async with host_lock(host_config), opened(host_config, host.block) as connection:
        return [await measure_configuration(profile, connection, host_config, prepared, fixed) for profile in servers]


async def measure_configuration(profile: ServerProfile, host: Host, host_config: HostConfig, prepared: Prepared,
                                more: More, *, decision: DecisionConfig | None = None,
                                only: set[int] | None = None) -> ConfigurationResult:
    """One configuration: kill leftovers → start → wait → warm up → every level, in blocks → kill."""
    logger = get_run_logger()
    sweep = prepared.settings.sweep
    async with configuration(profile, host, host_config, prepared, decision=decision) as run:
        if run.done is not None:
            return run.done
        levels = [p for p in points(sweep) if only is None or p.index in only]
        rows = await run_levels(levels, run.measure, more=more, stop_at_saturation=sweep.stop_at_saturation,
                                check_server=run.check, on_level=run.progress, on_saturation=run.saturated)
    await publish_configuration(run.job, host.label, rows)
    logger.info("%s: %d block(s) over %d level(s)", profile.name, len(rows), len({r.level_index for r in rows}))
    return run.result(rows)


@dataclass
class Configuration:
    """One configuration's run while it lasts: how to measure a block, check the server, show progress."""

    profile: ServerProfile
    job: SweepJob
    measure: Measure
    check: ServerCheck | None
    progress: Callable[[LevelRow, int, int], Awaitable[None]]
    ready_s: list[float]
    done: ConfigurationResult | None = None

    def result(self, rows: list[LevelRow]) -> ConfigurationResult:
        return ConfigurationResult(config_name=self.profile.name, run_id=self.job.run_id, levels=rows,
                                   time_to_ready_s=self.ready_s[0] if self.ready_s else None)

    def saturated(self) -> None:
        get_run_logger().info("%s: throughput stopped rising for two levels while latency grew: stopping the sweep",
                              self.profile.name)


@asynccontextmanager
async def configuration(profile: ServerProfile, host: Host, host_config: HostConfig, prepared: Prepared, *,
                        decision: DecisionConfig | None = None, restart_per_block: bool = False,
                        ) -> AsyncIterator[Configuration]:
    """A configuration's run, its row recorded however it ends: its server served (kill leftovers →
    start → wait → warm up; the kill at the end) for the whole block, or, with ``restart_per_block``
    (the alternate design on a host where only one server fits), for each block it measures."""
    logger = get_run_logger()
    settings, store = prepared.settings, prepared.store
    job = SweepJob(run_id=run_id_for(profile), config_name=profile.name, results=prepared.results.url,
                   storage=prepared.results.storage_options(), workload=settings.workload, sweep=settings.sweep)
    request = prepared.request if prepared.request.api_key or not profile.api_key else \
        prepared.request.model_copy(update={"api_key": profile.api_key})
    base_url = host_config.http_url(profile.port) if host_config.traffic_mode == "direct" else \
        f"tunnel to {profile.host}:{profile.port} on {host_config.label}"
    if host_config.load_generator == "host":
        base_url += f" (load generated on the host by {host_config.host_python})"
    bench = run_concurrency_benchmark.with_options(**settings.stages.benchmark.task_options(),
                                                   result_storage=await result_storage(prepared.results))
    progress = await progress_bar(profile.name)
    ready_s: list[float] = []
    if (done := finished_run(store, job.run_id)) is not None:
        # A retry of this flow run: this configuration finished in an earlier try. Its
        # results are kept, and its server is not started again for nothing.
        logger.info("%s finished in an earlier try of this flow run (run id %s): keeping its %d block(s)",
                    profile.name, job.run_id, len(done))
        config = Configuration(profile, job, bench_only(bench, None, job), None, progress, ready_s)
        config.done = ConfigurationResult(config_name=profile.name, run_id=job.run_id, levels=done,
                                          time_to_ready_s=store.run(job.run_id).time_to_ready_s)
        yield config
        return
    design = None if decision is None else (decision.design if decision.design == "sequential"
                                            else f"alternate-{decision.alternate_by}")
    logger.info("%s on %s: run id %s%s", profile.name, host.label, job.run_id, f" ({design} design)" if design else "")
    row = new_run_row(config_name=profile.name, engine=profile.engine, job=job, host=host.label, base_url=base_url,
                      command=profile.masked_command(), flow_run_id=str(_flow_run().id), design=design,
                      decision=decision)
    with RunRecorder(store, job.run_id, row) as record:

        @asynccontextmanager
        async def ready() -> AsyncIterator[Served]:
            async with served(host, host_config, profile, settings.stages, request, marker=str(_flow_run().id)) as server:
                if not ready_s:
                    record.record_fingerprint(await fingerprint_environment(host, server.target))
                    record.update(time_to_ready_s=server.ready.time_to_ready_s)
                ready_s.append(server.ready.time_to_ready_s)
                await warm_up(server.target, job, settings.stages.warm_up_requests)
                yield server

        if restart_per_block:

            async def measure_restarted(level: Level) -> LevelRow:
                async with ready() as server:
                    row = await bench(server.target, job, level, server.path.on_host, server.gpus)
                    if row.failed:
                        await server.check(f"during level {level.label}")
                    return row

            yield Configuration(profile, job, measure_restarted, None, progress, ready_s)
        else:
            async with ready() as server:
                yield Configuration(profile, job, bench_only(bench, server, job), server.check, progress, ready_s)


def bench_only(bench: Any, server: Served | None, job: SweepJob) -> Measure:
    """The level task bound to the server and run: what the sweep engine calls for each block."""

    async def measure(level: Level) -> LevelRow:
        assert server is not None, "a finished configuration measures nothing"
        row: LevelRow = await bench(server.target, job, level, server.path.on_host, server.gpus)
        return row

    return measure


async def progress_bar(name: str) -> Callable[[LevelRow, int, int], Awaitable[None]]:
    """A progress artifact for one configuration, and the hook that moves it after each level."""
    progress = await acreate_progress_artifact(0.0, key=artifact_key(name, "progress"), description=f"{name}: levels done")

    async def advance(_row: LevelRow, done: int, total: int) -> None:
        await aupdate_progress_artifact(progress, 100.0 * done / total, description=f"{name}: {done}/{total} levels done")

    return advance


def _flow_run() -> FlowRun:
    context = FlowRunContext.get()
    assert context is not None and context.flow_run is not None, "a benchmark runs inside a flow run"
    flow_run = context.flow_run
    return flow_run


def flow_run_id() -> str:
    return str(_flow_run().id)


def run_id_for(profile: ServerProfile) -> str:
    """The same id on every retry of a flow run (so cached levels line up), a new one per flow run."""
    flow_run = _flow_run()
    created = flow_run.created or flow_run.expected_start_time
    stamp = created.strftime("%Y%m%dT%H%M%SZ") if created else "run"
    return f"{stamp}-{profile.name}-{flow_run.id.hex[:8]}"


async def compare_configurations_on(baseline: ProfileParams, speculative: ProfileParams, host: HostConfig,
                                    benchmark: BenchmarkSettings, decision: DecisionConfig) -> ComparisonResult:
    """Baseline and speculative on one host, level by level in blocks until each level's verdict is
    decided (or its budget spent), then the comparison of the two."""
    logger = get_run_logger()
    logger.info("comparing %s (baseline) with %s (speculative) on %s; %s design, margin ±%.0f %%", baseline.name,
                speculative.name, host.label, decision.design if decision.design == "sequential"
                else f"alternate ({decision.alternate_by})", decision.margin * 100)
    if benchmark.sweep.repeats != 1:
        logger.warning("benchmark.sweep.repeats is not used by comparisons: each level gets blocks until it is "
                       "decided (decision.min_blocks, decision.max_requests_per_level, decision.max_seconds_per_level)")
    prepared, (base, spec) = await prepare(benchmark, [baseline, speculative])
    host_config = await aresolve_host(host)
    check_allowed(host_config, [base, spec])
    n = benchmark.sweep.num_requests
    async with host_lock(host_config), opened(host_config, host.block) as connection:
        if decision.design == "sequential":
            base_result = await measure_configuration(base, connection, host_config, prepared,
                                                      lambda p, rows: baseline_needs_more(decision, n)(rows),
                                                      decision=decision)
            by_level: dict[int, list[LevelRow]] = {}
            for r in base_result.levels:
                by_level.setdefault(r.level_index, []).append(r)
            spec_result = await measure_configuration(
                spec, connection, host_config, prepared,
                lambda p, rows: speculative_needs_more(decision, n, by_level.get(p.index, []))(rows), decision=decision,
                only=set(by_level))  # the levels the baseline reached (it may have stopped at saturation)
        else:
            base_result, spec_result = await alternate(base, spec, connection, host_config, prepared, decision)
    comp = await compare_configurations(base_result.run_id, spec_result.run_id, prepared.store, decision)
    return ComparisonResult(baseline=base_result, speculative=spec_result, comparison=comp, results=str(prepared.store))


async def alternate(base: ServerProfile, spec: ServerProfile, host: Host, host_config: HostConfig, prepared: Prepared,
                    decision: DecisionConfig) -> tuple[ConfigurationResult, ConfigurationResult]:
    """The alternate design: baseline and speculative blocks in turn at each level, both servers up
    side by side (the speculative one on the next port when they share one), or one at a time,
    restarted for each block."""
    restart = decision.alternate_by == "restart"
    if not restart and spec.port == base.port:
        spec = spec.model_copy(update={"port": base.port + 1})
    sweep = prepared.settings.sweep
    async with configuration(base, host, host_config, prepared, decision=decision, restart_per_block=restart) as b, \
            configuration(spec, host, host_config, prepared, decision=decision, restart_per_block=restart) as s:
        if b.done is not None and s.done is not None:
            return b.done, s.done

        async def progress(row: LevelRow, done: int, total: int) -> None:
            await (b if row.config_name == base.name else s).progress(row, done, total)

        base_rows, spec_rows = await run_paired_levels(
            points(sweep), b.measure, s.measure, more=lambda bs, ss: pair_needs_more(decision, sweep.num_requests)(bs, ss),
            stop_at_saturation=sweep.stop_at_saturation, check_base=b.check, check_spec=s.check, on_block=progress,
            on_saturation=b.saturated)
    await publish_configuration(b.job, host.label, base_rows)
    await publish_configuration(s.job, host.label, spec_rows)
    return b.result(base_rows), s.result(spec_rows)


class ComparisonResult(BaseModel):
    baseline: ConfigurationResult
    speculative: ConfigurationResult
    comparison: Comparison
    results: str


# -- declaring a benchmark flow ------------------------------------------------------------------

ServersOf = Callable[[dict[str, Any]], list[ServerProfile]]
P = ParamSpec("P")
R = TypeVar("R")


def benchmark_flow(name: str, servers: ServersOf) -> Callable[[Callable[P, R]], Flow[P, R]]:
    """``@flow`` with what every benchmark flow has: persisted results (a retry reuses finished
    levels) and the hooks that kill its servers when it fails, is cancelled or crashes.
    ``servers`` rebuilds the flow's server profiles from its parameters."""
    hook = cleanup_hook(servers)

    return flow(name=name, persist_result=True, on_failure=[hook], on_cancellation=[hook], on_crashed=[hook])


def cleanup_hook(servers: ServersOf) -> FlowStateHook[..., Any]:
    """A flow hook that kills the servers this flow run started, and only those, and says so in the
    flow run's own log.

    Cancellation and crash hooks run in the runner process, not the flow's: they cannot use
    anything the flow held in memory, only what the flow run records: its parameters (the host,
    the profiles) and its record of each start (``tasks.started``: the start's token, by which the
    kill finds that server's processes). Never by port or name: a run cancelled while it waited
    for the host started nothing, and must leave the running benchmark's server alone.
    """

    def hook(flow: Flow[Any, Any], flow_run: FlowRun, state: State) -> None:
        log: logging.Logger | logging.LoggerAdapter[logging.Logger] = flow_run_logger(flow_run, flow)
        stopped = stop_marked_tunnels(str(flow_run.id))
        if stopped:
            log.warning("cleanup after %s (%s): stopped its SSH tunnel process(es) %s", flow_run.name, state.name, stopped)
        try:
            starts = recorded_starts(flow_run.id)
        except Exception as exc:  # noqa: BLE001 - a hook must not raise
            log.error("cleanup of flow run %s: cannot read which servers it started: %s", flow_run.id, exc)
            return
        if not starts:
            log.info("cleanup after %s (%s): it has no server running (none started, or all stopped): nothing to "
                     "kill", flow_run.name, state.name)
        else:
            _kill_recorded(servers, flow_run, state, starts, log)
        # Only once its servers are gone may another run have the host.
        try:
            if release_recorded_lease(flow_run.id):
                log.warning("cleanup after %s (%s): released its hold on its host", flow_run.name, state.name)
        except Exception as exc:  # noqa: BLE001
            log.error("cleanup after %s: could not release its host lock (%s); it frees itself within %.0f s",
                      flow_run.name, exc, LOCK_LEASE_S)

    return hook


def _kill_recorded(servers: ServersOf, flow_run: FlowRun, state: State, starts: list[StartRecord],
                   log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
    """Kill the servers of the recorded starts: each by its start's token, on the run's host."""
    params = flow_run.parameters or {}
    try:
        host_config = resolve_host(HostConfig.model_validate(params.get("host") or {}))
        profiles = {p.name: p for p in servers(params)}
    except Exception as exc:  # noqa: BLE001 - a hook must not raise
        log.error("cleanup of flow run %s: cannot rebuild its host and servers from the parameters: %s",
                  flow_run.id, exc)
        return
    with open_host(host_config) as host:
        for start in starts:
            profile = profiles.get(start.profile)
            if profile is None:
                log.error("cleanup of %s: start %s names profile %r, not among the run's", flow_run.name,
                          start.token[:8], start.profile)
                continue
            profile = profile.model_copy(update={"port": start.port})
            try:
                report = lifecycle.kill_server(host, profile, token=start.token)
                log.warning("cleanup after %s (%s): %s", flow_run.name, state.name, report.summary())
                forget_recorded(start)
            except Exception as exc:  # noqa: BLE001
                log.error("cleanup of %s after %s failed: %s", profile.name, flow_run.name, exc)
