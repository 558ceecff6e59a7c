"""compare-speculation: baseline, then speculative, on the same host; then the comparison.

The two configurations run one after the other, never both at once on the same GPUs.
Retrying a failed flow run keeps whatever finished (a finished baseline, finished levels).
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from typing import Any

from prefect import flow, get_run_logger
from pydantic import BaseModel

from flows.host_lock import host_lock
from flows.pipeline import ConfigurationResult, cleanup_hook, run_configuration
from specsweep.bench.config import RequestParams, SweepConfig, WorkloadConfig
from specsweep.compare import Comparison
from specsweep.hosts.config import HostConfig
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.settings import LlamaCppSettings, SGLangSettings
from specsweep.stages import LifecycleOptions
from specsweep.store import DEFAULT_ROOT
from tasks.blocks import aresolve_host, aresolve_profile
from tasks.results import compare_configurations


class ComparisonResult(BaseModel):
    baseline: ConfigurationResult
    speculative: ConfigurationResult
    comparison: Comparison
    results_dir: str


async def run_comparison(
    baseline: ProfileParams,
    speculative: ProfileParams,
    host: HostConfig,
    workload: WorkloadConfig,
    sweep: SweepConfig,
    request: RequestParams,
    stages: LifecycleOptions,
    results_dir: str,
    allow_mismatch: bool = False,
) -> ComparisonResult:
    logger = get_run_logger()
    # Both secrets are read before anything starts: a missing one is refused up front.
    baseline = await aresolve_profile(baseline, "baseline")
    speculative = await aresolve_profile(speculative, "speculative")
    logger.info("comparing %s (baseline) with %s (speculative) on %s", baseline.name, speculative.name, host.label)
    async with host_lock(host):  # both configurations, back to back, with nobody else on the host
        base = await run_configuration(baseline, host, workload, sweep, request, stages, results_dir, lock=False)
        spec = await run_configuration(speculative, host, workload, sweep, request, stages, results_dir, lock=False)
    comp = await compare_configurations(base.run_id, spec.run_id, results_dir, allow_mismatch)
    return ComparisonResult(baseline=base, speculative=spec, comparison=comp, results_dir=results_dir)


def _profiles(params: dict[str, Any]) -> list[ServerProfile]:
    return [ServerProfile.model_validate(params["baseline"]), ServerProfile.model_validate(params["speculative"])]


_cleanup = cleanup_hook(_profiles)


@flow(name="compare-speculation", persist_result=True, on_failure=[_cleanup], on_cancellation=[_cleanup],
      on_crashed=[_cleanup])
async def compare_speculation(
    baseline: ProfileParams,
    speculative: ProfileParams,
    host: HostConfig = HostConfig(),
    host_block: str | None = None,
    workload: WorkloadConfig = WorkloadConfig(),
    sweep: SweepConfig = SweepConfig(),
    request: RequestParams = RequestParams(),
    stages: LifecycleOptions = LifecycleOptions(),
    results_dir: str = str(DEFAULT_ROOT),
    allow_mismatch: bool = False,
) -> ComparisonResult:
    """Measure both configurations one after the other and say where speculation stops paying."""
    host = await aresolve_host(host, host_block)
    return await run_comparison(baseline, speculative, host, workload, sweep, request, stages, results_dir, allow_mismatch)


def _sglang_profiles(params: dict[str, Any]) -> list[ServerProfile]:
    s = SGLangSettings.model_validate(params.get("sglang") or {})
    return [s.profile("baseline"), s.profile("eagle3")]


_sglang_cleanup = cleanup_hook(_sglang_profiles)


@flow(name="compare-sglang-eagle3", persist_result=True, on_failure=[_sglang_cleanup],
      on_cancellation=[_sglang_cleanup], on_crashed=[_sglang_cleanup])
async def compare_sglang_eagle3(
    sglang: SGLangSettings = SGLangSettings(),
    host: HostConfig = HostConfig(),
    host_block: str | None = None,
    workload: WorkloadConfig = WorkloadConfig(),
    sweep: SweepConfig = SweepConfig(concurrency=[1, 2, 4, 8, 16, 32, 64]),
    request: RequestParams = RequestParams(),
    stages: LifecycleOptions = LifecycleOptions(),
    results_dir: str = str(DEFAULT_ROOT),
    allow_mismatch: bool = False,
) -> ComparisonResult:
    """SGLang baseline vs EAGLE-3 from a few fields (model paths, TP, port); simulate=true rehearses it."""
    host = await aresolve_host(host, host_block)
    return await run_comparison(sglang.profile("baseline"), sglang.profile("eagle3"), host, workload, sweep, request,
                                stages, results_dir, allow_mismatch)


def _local_profiles(params: dict[str, Any]) -> list[ServerProfile]:
    s = LlamaCppSettings.model_validate(params.get("llamacpp") or {})
    return [s.profile("baseline"), s.profile("speculative")]


_local_cleanup = cleanup_hook(_local_profiles)


@flow(name="compare-local-llamacpp", persist_result=True, on_failure=[_local_cleanup],
      on_cancellation=[_local_cleanup], on_crashed=[_local_cleanup])
async def compare_local_llamacpp(
    llamacpp: LlamaCppSettings = LlamaCppSettings(),
    workload: WorkloadConfig = WorkloadConfig(input_len=16, output_len=96),
    sweep: SweepConfig = SweepConfig(concurrency=[1, 2, 4, 8], num_requests=12, warmup_requests=2, repeats=2),
    stages: LifecycleOptions = LifecycleOptions(),
    results_dir: str = str(DEFAULT_ROOT),
) -> ComparisonResult:
    """llama.cpp on this machine's CPU: baseline vs draft speculation, with tiny generated models."""
    return await run_comparison(llamacpp.profile("baseline"), llamacpp.profile("speculative"), HostConfig(), workload,
                                sweep, RequestParams(), stages, results_dir)
