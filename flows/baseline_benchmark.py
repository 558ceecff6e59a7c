"""baseline-benchmark: the SGLang baseline (no speculation) through the pipeline."""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from typing import Any

from prefect import flow

from flows.pipeline import ConfigurationResult, cleanup_hook, run_configuration
from specsweep.bench.config import RequestParams, SweepConfig, WorkloadConfig
from specsweep.hosts.config import HostConfig
from specsweep.profiles import ServerProfile
from specsweep.settings import SGLangSettings
from specsweep.stages import LifecycleOptions
from specsweep.store import DEFAULT_ROOT
from tasks.blocks import aresolve_host


def _profiles(params: dict[str, Any]) -> list[ServerProfile]:
    return [SGLangSettings.model_validate(params.get("sglang") or {}).profile("baseline")]


_cleanup = cleanup_hook(_profiles)


@flow(name="baseline-benchmark", persist_result=True, on_failure=[_cleanup], on_cancellation=[_cleanup], on_crashed=[_cleanup])
async def baseline_benchmark(
    sglang: SGLangSettings = SGLangSettings(),
    host: HostConfig = HostConfig(),
    host_block: str | None = None,
    workload: WorkloadConfig = WorkloadConfig(),
    sweep: SweepConfig = SweepConfig(concurrency=[1, 2, 4, 8, 16, 32, 64]),
    request: RequestParams = RequestParams(),
    stages: LifecycleOptions = LifecycleOptions(),
    results_dir: str = str(DEFAULT_ROOT),
) -> ConfigurationResult:
    """SGLang without speculation, measured at every concurrency level."""
    host = await aresolve_host(host, host_block)
    return await run_configuration(sglang.profile("baseline"), host, workload, sweep, request, stages, results_dir)
