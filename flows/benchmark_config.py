"""benchmark-config: one server configuration through the whole pipeline."""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from typing import Any

from prefect import flow

from flows.pipeline import ConfigurationResult, cleanup_hook, run_configuration
from specsweep.bench.config import RequestParams, SweepConfig, WorkloadConfig
from specsweep.hosts.config import HostConfig
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.stages import LifecycleOptions
from specsweep.store import DEFAULT_ROOT
from tasks.blocks import aresolve_host


def _profiles(params: dict[str, Any]) -> list[ServerProfile]:
    return [ServerProfile.model_validate(params["profile"])]


_cleanup = cleanup_hook(_profiles)


@flow(name="benchmark-config", persist_result=True, on_failure=[_cleanup], on_cancellation=[_cleanup], on_crashed=[_cleanup])
async def benchmark_config(
    profile: ProfileParams,
    host: HostConfig = HostConfig(),
    host_block: str | None = None,
    workload: WorkloadConfig = WorkloadConfig(),
    sweep: SweepConfig = SweepConfig(),
    request: RequestParams = RequestParams(),
    stages: LifecycleOptions = LifecycleOptions(),
    results_dir: str = str(DEFAULT_ROOT),
) -> ConfigurationResult:
    """Kill leftovers, start the server, wait until healthy, measure every level, kill the server."""
    host = await aresolve_host(host, host_block)
    return await run_configuration(profile, host, workload, sweep, request, stages, results_dir)
