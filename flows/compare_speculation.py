"""The comparison flows: a baseline and a speculative configuration on the same host, one after
the other (never both at once on the same GPUs), then where speculation stops paying.

    compare-speculation      any two server profiles
    compare-sglang-eagle3    SGLang baseline vs EAGLE-3 from a few fields (simulate: rehearse)
    compare-vllm             vLLM baseline vs its speculation (EAGLE-3, draft model, n-gram) from a few fields
    compare-local-llamacpp   llama.cpp on this machine's CPU (the main job)

Retrying a failed flow run keeps whatever finished (a finished baseline, finished levels).
"""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from typing import Any

from flows.pipeline import ComparisonResult, benchmark_flow, compare_configurations_on
from flows.sglang_benchmarks import SGLANG_BENCHMARK
from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.decision import DecisionConfig
from specsweep.hosts import HostConfig
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.settings import BenchmarkSettings, LlamaCppSettings, SGLangSettings, VLLMSettings

#: The main job's defaults: tiny models on two CPU cores.
LOCAL_BENCHMARK = BenchmarkSettings(
    workload=WorkloadConfig(input_len=16, output_len=64),
    sweep=SweepConfig(concurrency=[1, 2, 4, 8], num_requests=12, warmup_requests=2),
)
#: Both small servers fit side by side: blocks alternate between them without restarts.
LOCAL_DECISION = DecisionConfig(design="alternate", alternate_by="side-by-side")


@benchmark_flow("compare-speculation", servers=lambda p: [ServerProfile.model_validate(p[k])
                                                          for k in ("baseline", "speculative")])
async def compare_speculation(baseline: ProfileParams, speculative: ProfileParams, host: HostConfig = HostConfig(),
                              benchmark: BenchmarkSettings = BenchmarkSettings(),
                              decision: DecisionConfig = DecisionConfig()) -> ComparisonResult:
    """Measure both configurations, level by level until each is decided, and say where speculation stops paying."""
    return await compare_configurations_on(baseline, speculative, host, benchmark, decision)


def _sglang_servers(params: dict[str, Any]) -> list[ServerProfile]:
    s = SGLangSettings.model_validate(params.get("sglang") or {})
    return [s.profile("baseline"), s.profile("eagle3")]


@benchmark_flow("compare-sglang-eagle3", servers=_sglang_servers)
async def compare_sglang_eagle3(sglang: SGLangSettings = SGLangSettings(), host: HostConfig = HostConfig(),
                                benchmark: BenchmarkSettings = SGLANG_BENCHMARK,
                                decision: DecisionConfig = DecisionConfig()) -> ComparisonResult:
    """SGLang baseline vs EAGLE-3 from a few fields (model paths, TP, port); simulate=true rehearses it."""
    return await compare_configurations_on(sglang.profile("baseline"), sglang.profile("eagle3"),
                                           host, benchmark, decision)


def _vllm_servers(params: dict[str, Any]) -> list[ServerProfile]:
    s = VLLMSettings.model_validate(params["vllm"])
    return [s.profile("baseline"), s.profile("speculative")]


@benchmark_flow("compare-vllm", servers=_vllm_servers)
async def compare_vllm(vllm: VLLMSettings, host: HostConfig = HostConfig(),
                       benchmark: BenchmarkSettings = BenchmarkSettings(),
                       decision: DecisionConfig = DecisionConfig()) -> ComparisonResult:
    """vLLM baseline vs its speculation (method, draft model, K) from a few fields."""
    return await compare_configurations_on(vllm.profile("baseline"), vllm.profile("speculative"), host, benchmark,
                                           decision)


def _local_servers(params: dict[str, Any]) -> list[ServerProfile]:
    s = LlamaCppSettings.model_validate(params.get("llamacpp") or {})
    return [s.profile("baseline"), s.profile("speculative")]


@benchmark_flow("compare-local-llamacpp", servers=_local_servers)
async def compare_local_llamacpp(llamacpp: LlamaCppSettings = LlamaCppSettings(),
                                 benchmark: BenchmarkSettings = LOCAL_BENCHMARK,
                                 decision: DecisionConfig = LOCAL_DECISION) -> ComparisonResult:
    """llama.cpp on this machine's CPU: baseline vs draft speculation, with tiny generated models."""
    return await compare_configurations_on(llamacpp.profile("baseline"), llamacpp.profile("speculative"), HostConfig(),
                                           benchmark, decision)
