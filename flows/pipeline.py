"""The stages every benchmark flow runs, in order, inside the calling flow run.

These are plain async functions, not subflows: their tasks belong to the calling flow
run, so retrying that run reuses every finished level (persisted results, default cache
policy) whichever configuration it belonged to.

    kill_server (leftovers) → start_server → wait_for_health → fingerprint
      → run_concurrency_benchmark per level (and repeat) → kill_server
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.client.schemas.objects import FlowRun, State
from prefect.context import get_run_context
from pydantic import BaseModel, SecretStr, ValidationError

from flows.host_lock import LOCK_LEASE_S, host_lock, release_recorded_lease
from specsweep import lifecycle
from specsweep.bench.config import RequestOptions, RequestParams, SweepConfig, WorkloadConfig
from specsweep.bench.measure import BenchTarget, merge_repeats, run_row, saturated
from specsweep.bench.workload import check_source
from specsweep.errors import ServerCrashedError
from specsweep.health import LOG_TAIL_LINES
from specsweep.hosts.config import HostConfig, build_host
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.report import level_label
from specsweep.stages import LifecycleOptions
from specsweep.store import ResultsStore, now_iso
from tasks.benchmark import run_concurrency_benchmark
from tasks.blocks import aresolve_profile, aresolve_secret
from tasks.results import artifact_key, fingerprint_environment, publish_configuration
from tasks.server import kill_server, start_server, wait_for_health


async def resolve_request(request: RequestParams) -> RequestOptions:
    """The request options with the API key read from its Secret block, if one is named."""
    options = request if isinstance(request, RequestOptions) else RequestOptions.model_validate(request.model_dump())
    key = await aresolve_secret(request.api_key_secret, "request.api_key_secret")
    return options.model_copy(update={"api_key": SecretStr(key)}) if key else options


class ConfigurationResult(BaseModel):
    config_name: str
    run_id: str
    levels: list[dict[str, Any]]
    time_to_ready_s: float | None


def run_id_for(profile: ServerProfile) -> str:
    """The same id on every retry of a flow run (so cached levels line up), a new one per flow run."""
    ctx = get_run_context()
    flow_run = ctx.flow_run  # type: ignore[union-attr]
    assert flow_run is not None
    created = flow_run.created or flow_run.expected_start_time
    stamp = created.strftime("%Y%m%dT%H%M%SZ") if created else "run"
    return f"{stamp}-{profile.name}-{flow_run.id.hex[:8]}"


async def run_configuration(
    profile: ProfileParams,
    host: HostConfig,
    workload: WorkloadConfig,
    sweep: SweepConfig,
    request: RequestParams,
    stages: LifecycleOptions,
    results_dir: str,
    *,
    lock: bool = True,
) -> ConfigurationResult:
    """One configuration through the pipeline; with ``lock``, holding the host's lock throughout."""
    if lock:
        async with host_lock(host):
            return await run_configuration(profile, host, workload, sweep, request, stages, results_dir, lock=False)
    logger = get_run_logger()
    request = await resolve_request(request)
    profile = await aresolve_profile(profile)
    store = ResultsStore(results_dir)
    store.check_writable()  # before anything touches the host
    check_source(workload)  # a bad prompts file is refused before a server starts
    run_id = run_id_for(profile)
    flow_run_id = str(get_run_context().flow_run.id)  # type: ignore[union-attr]
    request = request if request.api_key or not profile.api_key else request.model_copy(update={"api_key": profile.api_key})
    target = BenchTarget(base_url=f"http://{host.address}:{profile.port}", request=request)
    kill = kill_server.with_options(**stages.kill.task_options())
    started = now_iso()
    meta: dict[str, Any] = dict(config_name=profile.name, engine=profile.engine, base_url=target.base_url,
                                workload=workload, sweep=sweep, started_at=started, command=profile.masked_command(),
                                host=host.label, flow_run_id=flow_run_id)
    levels = sweep.levels()
    total = len(levels) * sweep.repeats
    done_before = _finished_earlier(store, run_id)
    if done_before is not None:
        # A retry of this flow run: this configuration finished in an earlier try. Its
        # results are kept, and its server is not started again for nothing.
        logger.info("%s finished in an earlier try of this flow run (run id %s): keeping its %d level(s)",
                    profile.name, run_id, len(done_before.levels))
        return done_before
    logger.info("%s: %d level(s) × %d repeat(s) on %s; run id %s", profile.name, len(levels), sweep.repeats, host.label, run_id)
    await kill(host, profile)
    handle = None
    status, error, ready_s, fp = "failed", None, None, {}
    rows: list[dict[str, Any]] = []
    try:
        handle = await start_server.with_options(**stages.start.task_options())(host, profile, stages.kill_port_holder)
        health = await wait_for_health.with_options(**stages.wait.task_options())(host, profile, handle)
        ready_s = health.time_to_ready_s
        fp = await fingerprint_environment(host, target.base_url)
        store.write_run(run_id, run_row(status="running", fingerprint=fp, time_to_ready_s=ready_s, **meta))
        progress = await acreate_progress_artifact(0.0, key=artifact_key(profile.name, "progress"),
                                                   description=f"{profile.name}: levels done")
        bench = run_concurrency_benchmark.with_options(**stages.benchmark.task_options())
        merged: list[dict[str, Any]] = []
        tokens = 0
        done = 0
        for index, (mode, value) in enumerate(levels):
            reps = []
            for repeat in range(sweep.repeats):
                try:
                    row = await bench(target, workload, sweep, results_dir, run_id, profile.name, index, mode, value,
                                      repeat, tokens)
                except Exception:
                    await _raise_if_server_died(host, profile, handle, "while a level was measured")
                    raise
                tokens += int(row["output_tokens_total"])
                reps.append(row)
                rows.append(row)
                done += 1
                if row["failed"]:
                    await _raise_if_server_died(host, profile, handle, f"during level {level_label(row)}")
                await aupdate_progress_artifact(progress, 100.0 * done / total,
                                                description=f"{profile.name}: {done}/{total} levels done")
            merged.append(merge_repeats(reps))
            if sweep.stop_at_saturation and saturated(merged):
                logger.info("%s: throughput stopped rising for two levels while latency grew: stopping the sweep",
                            profile.name)
                break
        status = "completed"
    except BaseException as exc:
        error = str(exc)[:2000]
        status = "cancelled" if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)) else "failed"
        raise
    finally:
        not_killed = await _kill_at_the_end(kill, host, profile, handle)
        if not_killed is not None:
            status = "failed"
            error = f"{error + '; ' if error else ''}the server may still be running: {not_killed}"
        store.write_run(run_id, run_row(status=status, fingerprint=fp, time_to_ready_s=ready_s, ended_at=now_iso(),
                                        error=error, **meta))
    if not_killed is not None:
        raise not_killed
    await publish_configuration(profile.name, run_id, rows, results_dir)
    return ConfigurationResult(config_name=profile.name, run_id=run_id, levels=rows, time_to_ready_s=ready_s)


def _finished_earlier(store: ResultsStore, run_id: str) -> ConfigurationResult | None:
    try:
        run = store.run(run_id)
    except Exception:  # noqa: BLE001 - not in the store: not finished
        return None
    if run.get("status") != "completed":
        return None
    rows = store.levels([run_id]).to_dict("records")
    ready = run.get("time_to_ready_s")
    return ConfigurationResult(config_name=str(run["config_name"]), run_id=run_id, levels=rows,
                               time_to_ready_s=None if ready is None or ready != ready else float(ready))


async def _raise_if_server_died(host: HostConfig, profile: ServerProfile, handle: lifecycle.ServerHandle | None,
                                when: str) -> None:
    """After failed requests: if the server process is gone, stop the sweep and say so, with its
    log's last lines (rather than measuring nothing level after level)."""
    if handle is None:
        return

    def check() -> str | None:
        with build_host(host) as h:
            if h.pid_alive(handle.pid):
                return None
            return profile.redactor()(h.tail(handle.log_path, LOG_TAIL_LINES).rstrip()) or "(the log is empty)"

    try:
        tail = await asyncio.to_thread(check)
    except Exception:  # noqa: BLE001 - cannot tell: carry on as before
        return
    if tail is not None:
        raise ServerCrashedError(f"server {profile.name} (pid {handle.pid}) on {host.label} exited {when}. "
                                 f"The levels measured before are kept. Last lines of {handle.log_path}:\n{tail}")


def _kill_directly(host: HostConfig, profile: ServerProfile) -> None:
    with build_host(host) as h:
        lifecycle.kill_server(h, profile)


async def _kill_at_the_end(kill: Any, host: HostConfig, profile: ServerProfile, handle: Any) -> Exception | None:
    """The final kill, however the run ends; the error when the server could not be reached."""
    logger = get_run_logger()
    try:
        await kill(host, profile, handle)
        return None
    except BaseException as kill_exc:  # noqa: BLE001 - the server must go even if Prefect cannot run a task now
        logger.warning("kill_server task could not run (%s): killing directly", kill_exc)
    try:
        await asyncio.to_thread(_kill_directly, host, profile)
        return None
    except Exception as exc:  # noqa: BLE001
        logger.error("could not kill %s on %s (%s). It may still be running there: the next run on this host "
                     "kills it before it starts, or run `specsweep server kill` with this profile.",
                     profile.name, host.label, exc)
        return exc


def cleanup_hook(profiles_from: Callable[[dict[str, Any]], list[ServerProfile]]):  # type: ignore[no-untyped-def]
    """A flow hook that kills the flow's servers, rebuilt from the flow run's parameters.

    Cancellation and crash hooks run in the runner process, not the flow's: they cannot use
    anything the flow held in memory, only what the flow run records.
    """

    def hook(flow: Any, flow_run: FlowRun, state: State) -> None:
        from tasks.blocks import resolve_host

        log = logging.getLogger("specsweep.cleanup")
        params = flow_run.parameters or {}
        try:
            host = resolve_host(HostConfig.model_validate(params.get("host") or {}), params.get("host_block"))
            profiles = profiles_from(params)
        except ValidationError:
            # Parameters that do not validate were refused before the flow body ran: nothing started.
            log.info("cleanup of flow run %s: its parameters were refused, so no server was started", flow_run.id)
            return
        except Exception as exc:  # noqa: BLE001 - a hook must not raise
            log.error("cleanup of flow run %s: cannot rebuild its servers from the parameters: %s", flow_run.id, exc)
            return
        for profile in profiles:
            try:
                with build_host(host) as h:
                    report = lifecycle.kill_server(h, profile)
                log.warning("cleanup after %s (%s): %s", flow_run.name, state.name, report.summary())
            except Exception as exc:  # noqa: BLE001
                log.error("cleanup of %s after %s failed: %s", profile.name, flow_run.name, exc)
        # Only once the servers are gone may another run have the host.
        try:
            if release_recorded_lease(flow_run.id):
                log.warning("cleanup after %s (%s): released its hold on host %s", flow_run.name, state.name,
                            host.label)
        except Exception as exc:  # noqa: BLE001
            log.error("cleanup after %s: could not release its host lock (%s); it frees itself within %.0f s",
                      flow_run.name, exc, LOCK_LEASE_S)

    return hook
