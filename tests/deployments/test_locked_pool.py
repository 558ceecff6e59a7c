"""The work pool specsweep documents for shared infrastructure (deployments/work-pool.json), against a real
Prefect server and process worker: a run's job variables cannot choose the command the worker runs, its
environment or its working directory. The same run on a pool with Prefect's default template does run the API
user's command (the finding of issue 46)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import DeploymentUpdate
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.helpers.prefect_server import PREFECT, REPO, prefect_cli, prefect_server

ENTRYPOINT = "tests/helpers/env_flow.py:report_env"


async def _run_on(pool: str, env: dict[str, str], tmp_path: Path, out: Path, planted: Path) -> UUID | None:
    """Create a run with the API user's job variables on ``pool``'s deployment and let one worker poll take it:
    the run's id, or None where the API refused the job variables."""
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(f"report-env/{pool}")
        try:
            run = await client.create_flow_run_from_deployment(
                deployment.id, parameters={"out": str(out)},
                job_variables={"command": f"touch {planted}", "env": {"PWNED": "1", "SPECSWEEP_POLICY": "/dev/null"},
                               "working_dir": str(tmp_path)})
        except PrefectHTTPStatusError:
            return None
    subprocess.run([PREFECT, "worker", "start", "--pool", pool, "--run-once"], env=env, cwd=tmp_path,
                   capture_output=True, text=True, timeout=180)
    return run.id


async def _final_state(run_id: UUID, timeout: float = 120) -> str:
    async with get_client() as client:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = (await client.read_flow_run(run_id)).state
            if state is not None and state.is_final():
                return state.name
            await asyncio.sleep(1)
    raise AssertionError(f"the run {run_id} did not end")


@pytest.mark.timeout(600)
async def test_a_runs_job_variables_choose_nothing_on_the_locked_pool(tmp_path: Path) -> None:
    with prefect_server(tmp_path / "home") as env, temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        for pool, template in (("open", None), ("locked", REPO / "deployments" / "work-pool.json")):
            extra = ["--base-job-template", str(template)] if template else []
            for args in (["work-pool", "create", pool, "--type", "process", *extra],
                         ["--no-prompt", "deploy", ENTRYPOINT, "--name", pool, "--pool", pool]):
                result = prefect_cli(env, *args)
                assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
        # Prefect's default template: the API user's command runs on the worker's machine, not the flow
        planted, out = tmp_path / "planted-open", tmp_path / "out-open.json"
        await _run_on("open", env, tmp_path, out, planted)
        deadline = time.monotonic() + 60
        while not planted.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert planted.exists() and not out.exists()

        planted, out = tmp_path / "planted-locked", tmp_path / "out-locked.json"
        run_id = await _run_on("locked", env, tmp_path, out, planted)
        if run_id is not None:  # accepted, and none of it used: the flow ran as deployed
            assert await _final_state(run_id) == "Completed"
            assert not planted.exists(), "the API user's command ran on the locked pool"
            seen = json.loads(out.read_text())
            assert seen["PWNED"] is None and seen["SPECSWEEP_POLICY"] != "/dev/null"
            assert seen["cwd"] != str(tmp_path)
        assert not planted.exists()


async def _plant_pull_step(name: str, planted: Path) -> None:
    """What any API user may do: PATCH a deployment's pull steps to run a shell script."""
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(name)
        await client.update_deployment(deployment.id, DeploymentUpdate(pull_steps=[
            {"prefect.deployments.steps.run_shell_script": {"script": f"touch {planted}"}}]))


@pytest.mark.timeout(600)
async def test_served_flows_run_no_pull_steps_and_no_job_variables(tmp_path: Path) -> None:
    """The documented way on shared infrastructure: a served deployment whose pull steps an API user edited, run
    with job variables, runs the flow as served and nothing else. The locked pool still runs the edited pull step
    (what docs/operations.md says it gives away)."""
    with prefect_server(tmp_path / "home") as env, temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        result = prefect_cli(env, "work-pool", "create", "locked", "--type", "process", "--base-job-template",
                             str(REPO / "deployments" / "work-pool.json"))
        assert result.returncode == 0, result.stderr
        result = prefect_cli(env, "--no-prompt", "deploy", ENTRYPOINT, "--name", "locked", "--pool", "locked")
        assert result.returncode == 0, result.stderr
        planted = tmp_path / "planted-pull-locked"
        await _plant_pull_step("report-env/locked", planted)
        async with get_client() as client:
            deployment = await client.read_deployment_by_name("report-env/locked")
            run = await client.create_flow_run_from_deployment(deployment.id, parameters={"out": str(tmp_path / "x")})
        subprocess.run([PREFECT, "worker", "start", "--pool", "locked", "--run-once"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
        await _final_state(run.id)
        assert planted.exists(), "the locked pool ran no pull step: docs/operations.md says it does"

        log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
        served = subprocess.Popen([sys.executable, str(REPO / "tests" / "helpers" / "serve_env_flow.py")], env=env,
                                  cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            async with get_client() as client:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        deployment = await client.read_deployment_by_name("report-env/served")
                        break
                    except ObjectNotFound:
                        assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-2000:]
                        await asyncio.sleep(0.5)
            planted, out = tmp_path / "planted-pull-served", tmp_path / "out-served.json"
            await _plant_pull_step("report-env/served", planted)
            async with get_client() as client:
                run = await client.create_flow_run_from_deployment(
                    deployment.id, parameters={"out": str(out)},
                    job_variables={"command": f"touch {planted}", "env": {"PWNED": "1"}})
            assert await _final_state(run.id) == "Completed", (tmp_path / "serve.log").read_text()[-2000:]
            assert not planted.exists(), "a served flow ran the API user's pull step or command"
            assert json.loads(out.read_text())["PWNED"] is None
        finally:
            served.terminate()
            try:
                served.wait(20)
            except subprocess.TimeoutExpired:
                served.kill()
            log.close()
