"""baseline-benchmark and eagle3-benchmark: SGLang without and with EAGLE-3 through the pipeline."""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from flows.benchmark_config import benchmark_config
from orchestration.cleanup import benchmark_flow
from orchestration.run import ConfigurationResult
from specsweep.engines.sglang import SGLangSettings
from specsweep.hosts import HostConfig
from specsweep.parameters import GPU_BENCHMARK, BenchmarkSettings


@benchmark_flow("baseline-benchmark")
async def baseline_benchmark(sglang: SGLangSettings = SGLangSettings(), host: HostConfig = HostConfig(),
                             benchmark: BenchmarkSettings = GPU_BENCHMARK) -> ConfigurationResult:
    """SGLang without speculation, measured at every concurrency level."""
    return await benchmark_config.fn(sglang.profile("baseline"), host, benchmark)


@benchmark_flow("eagle3-benchmark")
async def eagle3_benchmark(sglang: SGLangSettings = SGLangSettings(), host: HostConfig = HostConfig(),
                           benchmark: BenchmarkSettings = GPU_BENCHMARK) -> ConfigurationResult:
    """SGLang with EAGLE-3 speculative decoding, measured at every concurrency level."""
    return await benchmark_config.fn(sglang.profile("speculative"), host, benchmark)
