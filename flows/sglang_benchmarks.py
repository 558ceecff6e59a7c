"""baseline-benchmark and eagle3-benchmark: SGLang without and with EAGLE-3 through the pipeline."""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from typing import Literal

from flows.pipeline import ConfigurationResult, ServersOf, benchmark_flow, measure_configurations
from specsweep.bench.config import SweepConfig
from specsweep.hosts import HostConfig
from specsweep.settings import BenchmarkSettings, SGLangSettings

#: The sweep an SGLang GPU host gets by default: up to 64 in flight.
SGLANG_BENCHMARK = BenchmarkSettings(sweep=SweepConfig(concurrency=[1, 2, 4, 8, 16, 32, 64]))


def sglang_servers(kind: Literal["baseline", "eagle3"]) -> ServersOf:
    return lambda params: [SGLangSettings.model_validate(params.get("sglang") or {}).profile(kind)]


@benchmark_flow("baseline-benchmark", servers=sglang_servers("baseline"))
async def baseline_benchmark(sglang: SGLangSettings = SGLangSettings(), host: HostConfig = HostConfig(),
                             benchmark: BenchmarkSettings = SGLANG_BENCHMARK) -> ConfigurationResult:
    """SGLang without speculation, measured at every concurrency level."""
    (result,) = await measure_configurations([sglang.profile("baseline")], host, benchmark)
    return result


@benchmark_flow("eagle3-benchmark", servers=sglang_servers("eagle3"))
async def eagle3_benchmark(sglang: SGLangSettings = SGLangSettings(), host: HostConfig = HostConfig(),
                           benchmark: BenchmarkSettings = SGLANG_BENCHMARK) -> ConfigurationResult:
    """SGLang with EAGLE-3 speculative decoding, measured at every concurrency level."""
    (result,) = await measure_configurations([sglang.profile("eagle3")], host, benchmark)
    return result
