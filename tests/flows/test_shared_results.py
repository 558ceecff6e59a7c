"""Results any worker can read: an S3-compatible store (a real moto server process) as the results
root, the artifacts linking to it, and a retry that lands on another worker reusing what finished."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterId
from prefect.deployments import run_deployment
from prefect.states import Scheduled

from flows.compare_speculation import compare_speculation
from orchestration.blocks import ResultsBlock
from specsweep.results import ResultsLocation, ResultsStore
from tests.conftest import pids_with_marker
from tests.flows.test_compare_flow import sim_profiles
from tests.helpers.logs import flow_logs
from tests.helpers.runner import serving, wait_for_deployment, wait_for_state
from tests.helpers.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server, s3_server
from tests.helpers.sshd import free_port

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


async def save_block(s3: S3Server, name: str, prefix: str) -> ResultsBlock:
    block = ResultsBlock(url=s3.url(prefix), endpoint_url=s3.endpoint, region=REGION,
                         access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)  # type: ignore[arg-type]
    await block.asave(name, overwrite=True)
    return block


async def test_comparison_writes_to_s3_and_its_artifacts_link_there(s3: S3Server, tmp_path: Path) -> None:
    await save_block(s3, "s3-results", "compare")
    base, spec = sim_profiles(free_port())
    state = await compare_speculation(
        base, spec, return_state=True,
        benchmark={"results_block": "s3-results", "workload": {"input_len": 8, "output_len": 16},  # type: ignore[arg-type]
                   "sweep": {"concurrency": [1, 4], "num_requests": 8, "warmup_requests": 1}},
        decision={"min_blocks": 2, "max_requests_per_level": 16},  # type: ignore[arg-type]  # two blocks each
    )
    result = await state.result()
    assert result.results == "s3://specsweep-results/compare"
    keys = s3.keys("compare")
    for dataset in ("runs", "levels", "requests"):
        assert any(k.startswith(f"specsweep-results/compare/{dataset}/run_id=") for k in keys), keys
    assert any(k.endswith("/report.md") for k in keys) and any(k.endswith("/speedup.png") for k in keys)
    assert not (Path.cwd() / "data" / "results" / "reports" / f"{result.baseline.run_id}--{result.speculative.run_id}").exists()
    # Read back as a user on any machine would: pyarrow (or pandas) on the bucket.
    levels = pq.read_table("specsweep-results/compare/levels", filesystem=s3.filesystem()).to_pandas()
    assert set(levels["concurrency"]) == {1, 4} and len(levels) == sum(sum(lv.blocks) + sum(lv.set_aside)
                                                                    for lv in result.comparison.levels)
    async with get_client() as client:
        arts = await client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    by_key = {a.key: a.data for a in arts if a.key}
    assert "](s3://specsweep-results/compare/levels/run_id=" in by_key["sglang-baseline-local-data"]
    assert "s3://specsweep-results/compare/reports/" in by_key["speculation-local-sglang-baseline-vs-sglang-eagle3"]
    # The command line reads the same store, credentials from the environment, endpoint in the URL.
    url = f"{s3.url('compare')}?endpoint_override={s3.endpoint}&scheme=http&region={REGION}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    out = subprocess.run([sys.executable, "-m", "specsweep.cli", "runs", "--results", url], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0 and result.baseline.run_id in out.stdout, out.stderr
    assert ACCESS_KEY not in out.stdout + out.stderr


async def test_a_retry_on_another_worker_reuses_the_levels_that_finished(s3: S3Server, tmp_path: Path) -> None:
    """Worker A measures two levels, then the server dies; the UI's Retry is picked up by worker B
    (its own Prefect home and local storage, as another machine has), which finds A's finished
    levels in the shared results and measures only the third."""
    await save_block(s3, "s3-retry", "retry")
    port = free_port()
    once = tmp_path / "fault-fired"
    base, _ = sim_profiles(port, "--fault-die-after", "24", "--fault-once-file", str(once))
    params = {"profile": base.as_parameters(),
              "benchmark": {"sweep": {"concurrency": [1, 2, 4], "num_requests": 10, "warmup_requests": 2},
                      "stages": {"warm_up_requests": 0},  # the fault counts requests from the first level on
                            "workload": {"input_len": 8, "output_len": 16}, "results_block": "s3-retry"}}

    def worker(name: str) -> dict[str, str]:
        home = tmp_path / name
        return {"PREFECT_HOME": str(home), "PREFECT_LOCAL_STORAGE_PATH": str(home / "storage")}

    with serving("flows.benchmark_config", "benchmark_config", "shared-retry", env=worker("a")):
        await wait_for_deployment("benchmark-config/shared-retry")
        run = await run_deployment("benchmark-config/shared-retry", parameters=params, timeout=0)
        failed = await wait_for_state(run.id, {"Failed", "Completed", "Crashed"})
        assert failed.state is not None and failed.state.name == "Failed", failed.state
    first = s3.keys("retry/levels")
    assert len(first) >= 2  # levels 1 and 2 (and any block set aside as disturbed, measured again)
    with serving("flows.benchmark_config", "benchmark_config", "shared-retry", env=worker("b")):
        async with get_client() as client:
            await client.set_flow_run_state(run.id, Scheduled(name="AwaitingRetry"), force=True)
        done = await wait_for_state(run.id, {"Completed", "Failed", "Crashed"})
        assert done.state is not None and done.state.name == "Completed", done.state
    async with get_client() as client:
        task_runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    states: dict[str, list[str]] = {}
    for tr in task_runs:
        if tr.name.startswith("benchmark ") and tr.state is not None:
            states.setdefault(tr.name, []).append(tr.state.name)
    kept = [name for name, st in states.items() if st == ["Completed", "Completed"]]
    assert "benchmark sglang-baseline C=1 #0" in kept and len(kept) == len(first), states
    # B could not read A's disk (each has its own Prefect home): the levels it kept are the ones in the
    # bucket, read back as data (nothing of Prefect's pickled results is written or read).
    assert s3.keys("retry/.prefect-results") == []
    logs = "\n".join(await flow_logs(run.id))
    assert logs.count("measured in an earlier try of this flow run: kept") == len(first), logs
    store = ResultsStore(ResultsLocation(url=s3.url("retry"), endpoint_url=s3.endpoint, region=REGION,
                                         access_key_id=ACCESS_KEY,  # type: ignore[arg-type]
                                         secret_access_key=SECRET_KEY))  # type: ignore[arg-type]
    levels = store.levels()
    assert sorted(levels.loc[levels["disturbed"].isna(), "concurrency"]) == [1, 2, 4]
    assert set(store.runs()["status"]) == {"completed"}
    assert pids_with_marker(port) == []
