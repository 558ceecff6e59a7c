"""The deployment path as users take it: a real Prefect server (SQLite, then PostgreSQL), blocks,
a process work pool, `prefect deploy`, a worker, runs created through the API."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.settings import PREFECT_API_URL, temporary_settings

from specsweep.results.store import ResultsStore
from tests.conftest import pids_with_marker
from tests.helpers.logs import read_all_logs
from tests.helpers.prefect_server import PREFECT, REPO, postgres, prefect_cli, prefect_server
from tests.helpers.processes import stop_process
from tests.helpers.sshd import free_port

DEPLOYMENTS = {"compare-engine/local", "compare-engine/sglang", "compare-speculation/profiles",
               "benchmark-config/config", "compare-engine/vllm", "tune-speculation/llamacpp",
               "eagle3-benchmark/eagle3", "baseline-benchmark/baseline", "campaign/fleet", "server-lifecycle/smoke"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def deployed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A Prefect server on the given database, with blocks registered, the deployments deployed, a worker."""
    work = tmp_path_factory.mktemp(f"prefect-{request.param}")
    if request.param == "postgresql":
        db_cm = postgres(work / "pg")
        db_url = db_cm.__enter__()
    else:
        db_cm, db_url = None, None
    try:
        with prefect_server(work / "home", db_url) as env:
            for args in (["block", "register", "-m", "orchestration.blocks"],
                         ["work-pool", "create", "specsweep", "--type", "process"],
                         ["--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"]):
                result = prefect_cli(env, *args)
                assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
            worker_log = open(work / "worker.log", "wb")  # noqa: SIM115
            # The worker starts elsewhere: the deployments' pull step takes each run into the checkout.
            elsewhere = work / "elsewhere"
            elsewhere.mkdir()
            worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "specsweep", "--limit", "4"], env=env,
                                      cwd=elsewhere, stdout=worker_log, stderr=subprocess.STDOUT)
            try:
                with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
                    yield env
            finally:
                # Every run has ended by now; a worker under load can take a minute to stop on SIGTERM (it
                # waits on its polling loops): it is killed after 10 s, so the teardown holds no slot long.
                stop_process(worker)
                worker_log.close()
    finally:
        if db_cm is not None:
            db_cm.__exit__(None, None, None)


async def wait_done(flow_run_id: object, timeout: float = 240) -> object:
    deadline = time.monotonic() + timeout
    async with get_client() as client:
        while time.monotonic() < deadline:
            run = await client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
            if run.state and run.state.is_final():
                return run
            await asyncio.sleep(1)
    raise TimeoutError(f"flow run {flow_run_id} did not finish: {run.state}")


def sim_settings(port: int) -> dict[str, object]:
    return {"model_path": "/models/kimi", "draft_model_path": "/models/eagle3", "tp": 8, "port": port,
            "bind_host": "127.0.0.1", "simulate": True, "sim_profile": "tiny-fast", "python": ".venv/bin/python",
            "extra_args": ["--startup-s", "0.3"]}


async def test_deployments_register_with_schedules(deployed: dict[str, str]) -> None:
    async with get_client() as client:
        deployments = await client.read_deployments()
        names = set()
        for d in deployments:
            flow = await client.read_flow(d.flow_id)
            names.add(f"{flow.name}/{d.name}")
            assert d.schedules and all(not s.active for s in d.schedules)  # nightly, defined but off
            assert d.schedules[0].schedule.cron == "0 3 * * *"
            # No deployment records the deploying machine's path: each run enters the worker's own checkout.
            assert d.pull_steps == [{"deployments.steps.enter_checkout": {}}], d.pull_steps
            assert str(REPO) not in str(d.pull_steps) and str(REPO) not in str(d.path or "")
        blocks = await client.read_block_types()
    assert names >= DEPLOYMENTS
    assert {"ssh-host", "specsweep-results"} <= {b.slug for b in blocks}


async def test_run_with_custom_parameters_completes_with_artifacts_and_logs(deployed: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    params = {"settings": {"engine": "sglang", **sim_settings(port)},
              "benchmark": {"sweep": {"concurrency": [1, 16], "num_requests": 12, "warmup_requests": 2},
                            "workload": {"input_len": 8, "output_len": 24}, "results": str(tmp_path / "results")},
              "decision": {"min_blocks": 2, "max_requests_per_level": 24}}  # two blocks each: no verdict asserted
    async with get_client() as client:
        dep = await client.read_deployment_by_name("compare-engine/sglang")
        run = await client.create_flow_run_from_deployment(dep.id, parameters=params)
    done = await wait_done(run.id)
    assert done.state.is_completed(), done.state  # type: ignore[attr-defined]
    async with get_client() as client:
        arts = await client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
        # The flow process sends its logs in batches, the last ones as it exits, which can be
        # after the run is marked Completed: read until the run's last words are there.
        for _ in range(60):
            text = "\n".join(await read_all_logs(client, run.id))
            if "report: " in text:
                break
            await asyncio.sleep(0.5)
    keys = {a.key for a in arts}
    assert {"speculation-local-sim-baseline-vs-sim-eagle3", "sim-baseline-local-levels", "sim-eagle3-local-levels"} <= keys
    # The recommendation itself depends on timing on a busy 2-core machine; that it is there does not.
    assert "comparison (" in text and "  C=1: " in text and "report: " in text
    assert "[server] " in text and "health attempt" in text
    assert len(ResultsStore(tmp_path / "results").runs()) == 2
    assert pids_with_marker(port) == []


async def test_two_runs_on_one_host_do_not_overlap(deployed: dict[str, str], tmp_path: Path) -> None:
    if "postgresql" in deployed.get("PREFECT_API_DATABASE_CONNECTION_URL", ""):
        pytest.skip("checked once, on SQLite")
    results = tmp_path / "results"
    runs = []
    async with get_client() as client:
        dep = await client.read_deployment_by_name("eagle3-benchmark/eagle3")
        for _ in range(2):  # different ports: only the host lock keeps them apart
            # Long enough (~15 s each) that the second run is started while the first holds the host.
            params = {"sglang": sim_settings(free_port()),
                      "benchmark": {"sweep": {"concurrency": [1, 4], "num_requests": 48, "warmup_requests": 1},
                                    "workload": {"input_len": 8, "output_len": 64}, "results": str(results)}}
            runs.append(await client.create_flow_run_from_deployment(dep.id, parameters=params))
    for run in runs:
        done = await wait_done(run.id, timeout=480)
        assert done.state.is_completed(), done.state  # type: ignore[attr-defined]
    table = ResultsStore(results).runs().sort_values("started_at")
    assert len(table) == 2
    first, second = table.iloc[0], table.iloc[1]
    assert first["ended_at"] <= second["started_at"], table[["started_at", "ended_at"]]
    async with get_client() as client:
        texts = []
        for run in runs:
            texts.append("\n".join(await read_all_logs(client, run.id)))
    assert any("waiting for host local: another benchmark is running on it" in t for t in texts)


async def test_bad_parameters_are_refused_when_the_run_is_created(deployed: dict[str, str]) -> None:
    """As the UI's form does: the server checks parameters against the flow's schema, so a bad
    run never reaches a worker, and a key typed into a parameter is never stored."""
    if "postgresql" in deployed.get("PREFECT_API_DATABASE_CONNECTION_URL", ""):
        pytest.skip("checked once, on SQLite")
    from prefect.exceptions import PrefectHTTPStatusError

    async with get_client() as client:
        dep = await client.read_deployment_by_name("compare-speculation/profiles")
        before = len(await client.read_flow_runs())
        for params, needle in (
            ({"benchmark": {"sweep": {"repeats": 0}}}, "repeats"),
            ({"benchmark": {"request": {"api_key": "sk-typed-into-the-form"}}}, "api_key"),
            ({"baseline": {"name": "b", "argv": ["srv"], "port": "eighty"}}, "port"),
        ):
            with pytest.raises(PrefectHTTPStatusError) as err:
                await client.create_flow_run_from_deployment(dep.id, parameters=params)
            assert err.value.response.status_code in (409, 422)
            assert needle in err.value.response.text, err.value.response.text
        assert len(await client.read_flow_runs()) == before


async def test_serve_builds_the_same_deployments_as_prefect_yaml() -> None:
    """deployments/serve.py reads prefect.yaml: one definition for both ways of running them."""
    import sys

    import yaml

    sys.path.insert(0, str(REPO / "deployments"))
    import serve  # type: ignore[import-not-found]

    served = {d.name: d for d in await serve.deployments()}
    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["deployments"]
    assert set(served) == {d["name"] for d in spec}
    for d in spec:
        assert served[d["name"]].entrypoint == d["entrypoint"]
        assert served[d["name"]].parameters == (d.get("parameters") or {})
        assert all(not s.active for s in served[d["name"]].schedules)


def test_compare_engine_takes_a_form_per_engine_that_the_server_checks() -> None:
    """The schema the server checks a run's parameters against (and the UI draws): one settings form per
    registered engine, chosen by settings.engine. Each compare-engine entry of prefect.yaml passes it."""
    import yaml
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import ValidationError, validate

    from flows.compare_speculation import compare_engine

    schema = parameter_schema(compare_engine).model_dump_for_openapi()
    settings = schema["properties"]["settings"]
    assert settings["discriminator"]["propertyName"] == "engine"
    assert set(settings["discriminator"]["mapping"]) == {"sglang", "vllm", "llamacpp"}
    assert settings["default"]["engine"] == "llamacpp"  # no parameters: the main job
    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["deployments"]
    presets = {d["name"]: d.get("parameters") or {} for d in spec if d["entrypoint"].endswith(":compare_engine")}
    assert set(presets) == {"local", "sglang", "vllm"}
    for name, params in presets.items():
        assert validate(params, schema, raise_on_error=True) == [], name
    for bad in ({"settings": {"engine": "tensorrt-llm"}},
                {"settings": {"engine": "sglang", "model": "/m/llama"}},  # a vLLM field in SGLang's form
                {"settings": {"model_path": "/m/kimi"}}):  # no engine
        with pytest.raises(ValidationError, match="settings"):
            validate(bad, schema, raise_on_error=True)


async def test_serve_serves_only_the_deployments_the_workers_policy_names(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    sys.path.insert(0, str(REPO / "deployments"))
    import serve  # type: ignore[import-not-found]

    every = await serve.deployments()
    chosen = every[0]
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(f'deployments = ["{chosen.flow_name}/{chosen.name}"]\n')
    monkeypatch.setenv("SPECSWEEP_POLICY", str(policy_file))
    assert [(d.flow_name, d.name) for d in await serve.deployments()] == [(chosen.flow_name, chosen.name)]
