"""baseline-benchmark and eagle3-benchmark: SGLang without and with EAGLE-3 through the pipeline."""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from typing import Literal

from flows.benchmark_config import benchmark_config
from specsweep.engines.sglang import SGLangSettings
from specsweep.hosts import HostConfig
from specsweep.parameters import GPU_BENCHMARK, BenchmarkSettings
from tasks.cleanup import ServersOf, benchmark_flow
from tasks.run import ConfigurationResult


def sglang_servers(kind: Literal["baseline", "speculative"]) -> ServersOf:
    return lambda params: [SGLangSettings.model_validate(params.get("sglang") or {}).profile(kind)]


@benchmark_flow("baseline-benchmark", servers=sglang_servers("baseline"))
async def baseline_benchmark(sglang: SGLangSettings = SGLangSettings(), host: HostConfig = HostConfig(),
                             benchmark: BenchmarkSettings = GPU_BENCHMARK) -> ConfigurationResult:
    """SGLang without speculation, measured at every concurrency level."""
    return await benchmark_config.fn(sglang.profile("baseline"), host, benchmark)


@benchmark_flow("eagle3-benchmark", servers=sglang_servers("speculative"))
async def eagle3_benchmark(sglang: SGLangSettings = SGLangSettings(), host: HostConfig = HostConfig(),
                           benchmark: BenchmarkSettings = GPU_BENCHMARK) -> ConfigurationResult:
    """SGLang with EAGLE-3 speculative decoding, measured at every concurrency level."""
    return await benchmark_config.fn(sglang.profile("speculative"), host, benchmark)
