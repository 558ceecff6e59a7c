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
from pydantic import BaseModel, SecretStr, ValidationError

from flows.host_lock import LOCK_LEASE_S, host_lock, release_recorded_lease
from specsweep import lifecycle
from specsweep.bench.config import RequestOptions, RequestParams
from specsweep.bench.workload import check_source
from specsweep.compare import Comparison
from specsweep.hosts import Host, HostConfig, open_host
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.records import LevelRow
from specsweep.settings import BenchmarkSettings
from specsweep.store import ResultsStore
from specsweep.sweep import RunRecorder, SweepJob, finished_run, new_run_row, plan, run_levels
from tasks.benchmark import run_concurrency_benchmark
from tasks.blocks import aresolve_host, aresolve_profile, aresolve_secret, resolve_host
from tasks.results import artifact_key, compare_configurations, fingerprint_environment, publish_configuration
from tasks.server import served
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
async def opened(config: HostConfig) -> AsyncIterator[Host]:
    """The run's one connection to its host."""
    host = open_host(config, get_run_logger())
    try:
        yield host
    finally:
        await asyncio.to_thread(host.close)


async def measure_configurations(profiles: list[ProfileParams], host: HostConfig,
                                 benchmark: BenchmarkSettings) -> list[ConfigurationResult]:
    """Each configuration in turn on one host, holding its lock from the first kill to the last."""
    prepared, servers = await prepare(benchmark, profiles)
    host_config = await aresolve_host(host)
    async with host_lock(host_config), opened(host_config) as connection:
        return [await measure_configuration(profile, connection, host_config, prepared) for profile in servers]


async def measure_configuration(profile: ServerProfile, host: Host, host_config: HostConfig,
                                prepared: Prepared) -> ConfigurationResult:
    """One configuration: kill leftovers → start → wait → every level → kill."""
    logger = get_run_logger()
    settings, store = prepared.settings, prepared.store
    job = SweepJob(run_id=run_id_for(profile), config_name=profile.name, results=prepared.results.url,
                   storage=prepared.results.storage_options(), workload=settings.workload, sweep=settings.sweep)
    if (done := finished_run(store, job.run_id)) is not None:
        # A retry of this flow run: this configuration finished in an earlier try. Its
        # results are kept, and its server is not started again for nothing.
        logger.info("%s finished in an earlier try of this flow run (run id %s): keeping its %d level(s)",
                    profile.name, job.run_id, len(done))
        return ConfigurationResult(config_name=profile.name, run_id=job.run_id, levels=done,
                                   time_to_ready_s=store.run(job.run_id).time_to_ready_s)
    levels = plan(settings.sweep)
    logger.info("%s: %d level(s) on %s; run id %s", profile.name, len(levels), host.label, job.run_id)
    request = prepared.request if prepared.request.api_key or not profile.api_key else \
        prepared.request.model_copy(update={"api_key": profile.api_key})
    base_url = host_config.http_url(profile.port)
    row = new_run_row(config_name=profile.name, engine=profile.engine, job=job, host=host.label, base_url=base_url,
                      command=profile.masked_command(), flow_run_id=str(_flow_run().id))
    with RunRecorder(store, job.run_id, row) as record:
        async with served(host, profile, settings.stages, request, base_url) as server:
            record.record_fingerprint(await fingerprint_environment(host, server.target))
            record.update(time_to_ready_s=server.ready.time_to_ready_s)
            bench = run_concurrency_benchmark.with_options(**settings.stages.benchmark.task_options(),
                                                           result_storage=await result_storage(prepared.results))
            rows = await run_levels(
                levels, lambda level: bench(server.target, job, level), stop_at_saturation=settings.sweep.stop_at_saturation,
                check_server=server.check, on_level=await progress_bar(profile.name),
                on_saturation=lambda: logger.info("%s: throughput stopped rising for two levels while latency grew: "
                                                  "stopping the sweep", profile.name))
    await publish_configuration(job, host.label, rows)
    return ConfigurationResult(config_name=profile.name, run_id=job.run_id, levels=rows,
                               time_to_ready_s=server.ready.time_to_ready_s)


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


def run_id_for(profile: ServerProfile) -> str:
    """The same id on every retry of a flow run (so cached levels line up), a new one per flow run."""
    flow_run = _flow_run()
    created = flow_run.created or flow_run.expected_start_time
    stamp = created.strftime("%Y%m%dT%H%M%SZ") if created else "run"
    return f"{stamp}-{profile.name}-{flow_run.id.hex[:8]}"


async def compare_configurations_on(baseline: ProfileParams, speculative: ProfileParams, host: HostConfig,
                                    benchmark: BenchmarkSettings, allow_mismatch: bool = False) -> ComparisonResult:
    """Baseline, then speculative, back to back on one host; then the comparison of the two."""
    get_run_logger().info("comparing %s (baseline) with %s (speculative) on %s", baseline.name, speculative.name,
                          host.label)
    base, spec = await measure_configurations([baseline, speculative], host, benchmark)
    results = await aresolve_results(benchmark.results, benchmark.results_block)
    store = ResultsStore(results.url, results.storage_options())
    comp = await compare_configurations(base.run_id, spec.run_id, store, allow_mismatch)
    return ComparisonResult(baseline=base, speculative=spec, comparison=comp, results=str(store))


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
    """A flow hook that kills the flow's servers, rebuilt from the flow run's parameters, and says
    so in the flow run's own log.

    Cancellation and crash hooks run in the runner process, not the flow's: they cannot use
    anything the flow held in memory, only what the flow run records.
    """

    def hook(flow: Flow[Any, Any], flow_run: FlowRun, state: State) -> None:
        log: logging.Logger | logging.LoggerAdapter[logging.Logger] = flow_run_logger(flow_run, flow)
        params = flow_run.parameters or {}
        try:
            host_config = resolve_host(HostConfig.model_validate(params.get("host") or {}))
            profiles = servers(params)
        except ValidationError:
            # Parameters that do not validate were refused before the flow body ran: nothing started.
            log.info("cleanup of flow run %s: its parameters were refused, so no server was started", flow_run.id)
            return
        except Exception as exc:  # noqa: BLE001 - a hook must not raise
            log.error("cleanup of flow run %s: cannot rebuild its servers from the parameters: %s", flow_run.id, exc)
            return
        with open_host(host_config) as host:
            for profile in profiles:
                try:
                    report = lifecycle.kill_server(host, profile)
                    log.warning("cleanup after %s (%s): %s", flow_run.name, state.name, report.summary())
                except Exception as exc:  # noqa: BLE001
                    log.error("cleanup of %s after %s failed: %s", profile.name, flow_run.name, exc)
        # Only once the servers are gone may another run have the host.
        try:
            if release_recorded_lease(flow_run.id):
                log.warning("cleanup after %s (%s): released its hold on host %s", flow_run.name, state.name,
                            host_config.label)
        except Exception as exc:  # noqa: BLE001
            log.error("cleanup after %s: could not release its host lock (%s); it frees itself within %.0f s",
                      flow_run.name, exc, LOCK_LEASE_S)

    return hook
