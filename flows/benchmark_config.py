"""benchmark-config: one server configuration through the whole pipeline."""

# No "from __future__ import annotations" here: Prefect builds the parameter schema and
# validates runs from the real annotation objects of a flow's signature.
from flows.pipeline import ConfigurationResult, benchmark_flow, measure_configurations
from specsweep.hosts import HostConfig
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.settings import BenchmarkSettings


@benchmark_flow("benchmark-config", servers=lambda p: [ServerProfile.model_validate(p["profile"])])
async def benchmark_config(profile: ProfileParams, host: HostConfig = HostConfig(),
                           benchmark: BenchmarkSettings = BenchmarkSettings()) -> ConfigurationResult:
    """Kill leftovers, start the server, wait until healthy, measure every level, kill the server."""
    (result,) = await measure_configurations([profile], host, benchmark)
    return result
