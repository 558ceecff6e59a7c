"""What every benchmark flow has: the hooks that kill its servers when it fails, is cancelled or
crashes (``benchmark_flow`` declares a flow with them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Flow, flow
from prefect.client.schemas.objects import FlowRun, State
from prefect.flows import FlowStateHook
from prefect.logging.loggers import flow_run_logger

from orchestration.blocks import resolve_host
from orchestration.host import LOCK_LEASE_S, release_recorded_lease
from specsweep.engines import EngineSettings
from specsweep.hosts import HostConfig, open_host
from specsweep.hosts.tunnel import stop_marked_tunnels
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.server import lifecycle
from tasks.started import StartRecord, forget_recorded, recorded_starts

# -- declaring a benchmark flow ------------------------------------------------------------------

P = ParamSpec("P")
R = TypeVar("R")


def benchmark_flow(name: str) -> Callable[[Callable[P, R]], Flow[P, R]]:
    """``@flow`` with the hooks that kill its servers when it fails, is cancelled or crashes (the servers
    read back from its parameters, ``run_servers``). Nothing of the run is persisted by Prefect (its results
    are pickles): a retry finds what finished in the results store."""
    hook = cleanup_hook()

    return flow(name=name, persist_result=False, on_failure=[hook], on_cancellation=[hook], on_crashed=[hook])


def run_servers(flow: Flow[Any, Any], params: dict[str, Any]) -> list[ServerProfile]:
    """The server profiles a flow run's parameters hold, whatever the flow: each server profile, and both
    profiles (baseline, speculative) of each engine's settings, read by the flow's own parameter types (an
    engine's settings through the engine registry)."""
    out: list[ServerProfile] = []
    for value in flow.validate_parameters(params).values():
        if isinstance(value, ServerProfile):
            out.append(value)
        elif isinstance(value, ProfileParams):
            out.append(ServerProfile.model_validate(value.model_dump()))
        elif isinstance(value, EngineSettings):
            out += [value.profile("baseline"), value.profile("speculative")]
    return out


def profile_of(start: StartRecord, profiles: list[ServerProfile]) -> ServerProfile | None:
    """The profile a start was made from. A run's derived configurations are named after the profile they
    derive from, its name and a suffix (a grid point's label, a temperature, ``-as-recommended``): the
    profile of that name, else of the longest name that begins the start's."""
    by_name = {p.name: p for p in profiles}
    if start.profile in by_name:
        return by_name[start.profile]
    stems = [name for name in by_name if start.profile.startswith(name + "-")]
    return by_name[max(stems, key=len)] if stems else None


def cleanup_hook() -> FlowStateHook[..., Any]:
    """A flow hook that kills the servers this flow run started, and only those, and says so in the
    flow run's own log.

    Cancellation and crash hooks run in the runner process, not the flow's: they cannot use
    anything the flow held in memory, only what the flow run records: its parameters (the host,
    the profiles or engine settings: ``run_servers``) and its record of each start
    (``tasks.started``: the start's token, by which the kill finds that server's processes). Never
    by port or name: a run cancelled while it waited for the host started nothing, and must leave
    the running benchmark's server alone.
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
            _kill_recorded(flow, flow_run, state, starts, log)
        # Only once its servers are gone may another run have the host.
        try:
            if release_recorded_lease(flow_run.id):
                log.warning("cleanup after %s (%s): released its hold on its host", flow_run.name, state.name)
        except Exception as exc:  # noqa: BLE001
            log.error("cleanup after %s: could not release its host lock (%s); it frees itself within %.0f s",
                      flow_run.name, exc, LOCK_LEASE_S)

    return hook


def _kill_recorded(flow: Flow[Any, Any], flow_run: FlowRun, state: State, starts: list[StartRecord],
                   log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
    """Kill the servers of the recorded starts: each by its start's token, on the run's host."""
    params = flow_run.parameters or {}
    try:
        host_config = resolve_host(HostConfig.model_validate(params.get("host") or {}))
        profiles = run_servers(flow, params)
    except Exception as exc:  # noqa: BLE001 - a hook must not raise
        log.error("cleanup of flow run %s: cannot rebuild its host and servers from the parameters: %s",
                  flow_run.id, exc)
        return
    with open_host(host_config) as host:
        for start in starts:
            profile = profile_of(start, profiles)
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
