"""Serve every specsweep deployment from this one process (no work pool or worker needed).

    PREFECT_API_URL=http://127.0.0.1:4200/api .venv/bin/python deployments/serve.py

The same deployments as deployments/prefect.yaml, with their nightly schedules inactive.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefect import serve  # noqa: E402
from prefect.deployments.runner import RunnerDeployment  # noqa: E402
from prefect.schedules import Cron  # noqa: E402

from flows.benchmark_config import benchmark_config  # noqa: E402
from flows.compare_speculation import compare_local_llamacpp, compare_sglang_eagle3, compare_speculation  # noqa: E402
from flows.sglang_benchmarks import baseline_benchmark, eagle3_benchmark  # noqa: E402
from specsweep.presets import sglang_baseline, sglang_eagle3  # noqa: E402

MODEL, DRAFT = "moonshotai/Kimi-K2.5", "lightseekorg/kimi-k2.5-eagle3"


def nightly() -> Cron:
    return Cron("0 3 * * *", timezone="UTC", active=False)


def deployments() -> list[RunnerDeployment]:
    return [
        compare_local_llamacpp.to_deployment("local", tags=["specsweep", "local"], schedules=[nightly()]),
        compare_sglang_eagle3.to_deployment("sglang", tags=["specsweep", "sglang"], schedules=[nightly()]),
        compare_speculation.to_deployment(
            "profiles", tags=["specsweep"], schedules=[nightly()],
            parameters={"baseline": sglang_baseline(MODEL, simulate=True, name="sim-baseline").model_dump(mode="json"),
                        "speculative": sglang_eagle3(MODEL, DRAFT, simulate=True, name="sim-eagle3").model_dump(mode="json")}),
        eagle3_benchmark.to_deployment("eagle3", tags=["specsweep", "sglang"], schedules=[nightly()]),
        baseline_benchmark.to_deployment("baseline", tags=["specsweep", "sglang"], schedules=[nightly()]),
        benchmark_config.to_deployment("config", tags=["specsweep"], schedules=[nightly()]),
    ]


if __name__ == "__main__":
    serve(*deployments())
