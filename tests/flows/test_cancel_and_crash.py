"""Runs stopped from outside, under a real (temporary) Prefect server: cancelled from the UI (running, or
waiting for the host), or their flow process killed outright. The server a run started is always gone
afterwards, another run's server is never touched, and the host is given back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.states import Cancelling

from tests.conftest import pids_with_marker
from tests.helpers.logs import flow_logs
from tests.helpers.runner import serving, wait_for_deployment, wait_for_state
from tests.helpers.sim import SLOW_PROFILE, sim_profiles
from tests.helpers.sshd import free_port

#: The runner kills a cancelled run's process 30 s after its SIGTERM; a run that exits by itself is cancelled well
#: before (about 5 s alone, measured; the bound leaves the loaded suite's slower runner and API room).
CANCEL_WAITING_S = 22.0

pytestmark = pytest.mark.usefixtures("prefect_harness")


def endless_level(port: int, tmp_path: Path) -> dict[str, object]:
    """Parameters of a run whose one level goes on until it is stopped from outside."""
    base, _ = sim_profiles(port, sim_profile=SLOW_PROFILE)
    return {
        "profile": base.as_parameters(),
        "benchmark": {"sweep": {"concurrency": [1], "num_requests": 100000, "warmup_requests": 1},
                      "workload": {"input_len": 8, "output_len": 64}, "results": str(tmp_path / "results")},
    }


async def until_measuring(port: int, tmp_path: Path) -> None:
    """Until the run's server runs and its level is under way. The flow run is a process of its own that the
    runner starts: on the loaded suite its start, warm-up and first level took over a minute once, so the
    wait allows three (it ends as soon as the level is under way)."""
    seen = 0
    for _ in range(720):
        # Twice in a row: the server up and the run recorded, not a moment of the start.
        seen = seen + 1 if pids_with_marker(port) and (tmp_path / "results" / "runs").exists() else 0
        if seen >= 2:
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"the run's server on port {port} was not measuring after 180 s")


async def until_gone(port: int) -> None:
    for _ in range(120):
        if not pids_with_marker(port):
            return
        await asyncio.sleep(0.25)


async def test_cancelled_run_leaves_no_server(tmp_path: Path) -> None:
    port = free_port()
    params = endless_level(port, tmp_path)
    with serving("flows.benchmark_config", "benchmark_config", "cancel-test"):
        await wait_for_deployment("benchmark-config/cancel-test")
        run = await run_deployment("benchmark-config/cancel-test", parameters=params, timeout=0)
        await wait_for_state(run.id, {"Running"})
        await until_measuring(port, tmp_path)
        assert pids_with_marker(port)
        async with get_client() as client:
            await client.set_flow_run_state(run.id, Cancelling(), force=True)
        await wait_for_state(run.id, {"Cancelled"}, timeout=60)
        await until_gone(port)
    assert pids_with_marker(port) == []
    await assert_host_given_back()


async def test_cancelling_a_run_that_waits_for_the_host_leaves_the_running_server_alone(tmp_path: Path) -> None:
    """Two runs of the same configuration on one host: the second waits for the host; cancelling it
    must not kill the first run's server (same profile, same port), which goes on measuring."""
    port = free_port()
    params = endless_level(port, tmp_path)
    with serving("flows.benchmark_config", "benchmark_config", "queued-cancel"):
        await wait_for_deployment("benchmark-config/queued-cancel")
        first = await run_deployment("benchmark-config/queued-cancel", parameters=params, timeout=0)
        await wait_for_state(first.id, {"Running"})
        await until_measuring(port, tmp_path)
        serving_pids = pids_with_marker(port)
        assert serving_pids
        second = await run_deployment("benchmark-config/queued-cancel", parameters=params, timeout=0)
        await wait_for_state(second.id, {"Running"})
        await flow_logs(second.id, until="waiting for host")
        t0 = time.monotonic()
        async with get_client() as client:
            await client.set_flow_run_state(second.id, Cancelling(), force=True)
        await wait_for_state(second.id, {"Cancelled"}, timeout=60)
        took = time.monotonic() - t0
        # The waiting run's process exits by itself (its wait for the host is given up at once), rather than when
        # the runner kills it 30 s after its SIGTERM: a run waiting in Prefect's own slot acquisition did that.
        print(f"cancelled while waiting for the host in {took:.1f} s")
        assert took < CANCEL_WAITING_S, took
        messages = await flow_logs(second.id, until="nothing to kill")
        assert any("nothing to kill" in m for m in messages), messages[-5:]
        await asyncio.sleep(2)
        assert pids_with_marker(port) == serving_pids  # the first run's server is untouched
        async with get_client() as client:
            assert (await client.read_flow_run(first.id)).state.name == "Running"  # type: ignore[union-attr]
            await client.set_flow_run_state(first.id, Cancelling(), force=True)
        await wait_for_state(first.id, {"Cancelled"}, timeout=60)
        await until_gone(port)
    assert pids_with_marker(port) == []
    await assert_host_given_back()


async def test_flow_process_killed_outright_the_crash_hook_kills_the_server(tmp_path: Path) -> None:
    """SIGKILL of the flow process: no finally runs; the runner's on_crashed hook stops the server."""
    import os
    import signal

    port = free_port()
    params = endless_level(port, tmp_path)
    with serving("flows.benchmark_config", "benchmark_config", "crash-test") as runner:
        await wait_for_deployment("benchmark-config/crash-test")
        run = await run_deployment("benchmark-config/crash-test", parameters=params, timeout=0)
        await wait_for_state(run.id, {"Running"})
        await until_measuring(port, tmp_path)
        server_pids = pids_with_marker(port)
        assert server_pids
        # The flow run's process: the runner's child that is not the server.
        children = [int(p) for p in os.popen(f"ps -o pid= --ppid {runner.pid}").read().split()]
        flow_procs = [p for p in children if p not in server_pids]
        assert flow_procs
        for p in flow_procs:
            os.kill(p, signal.SIGKILL)
        crashed = await wait_for_state(run.id, {"Crashed", "Failed", "Cancelled"}, timeout=90)
        assert crashed.state.name == "Crashed", crashed.state
        await until_gone(port)
        # The hook ran in the runner process, and said what it killed in the flow run's own log (the UI's): read
        # while the runner still runs (it sends its logs in batches; one stopped right after may not send the last).
        messages = await flow_logs(run.id, until="(Crashed): killed 1 process(es)")
    assert pids_with_marker(port) == []
    assert any("(Crashed): killed 1 process(es)" in m for m in messages), messages[-5:]
    await assert_host_given_back()


async def assert_host_given_back() -> None:
    """The hooks gave the host back: the next run need not wait for the lease to run out."""
    from orchestration.host import lock_name
    from specsweep.hosts import LocalHost

    deadline = asyncio.get_running_loop().time() + 20
    async with get_client() as client:
        while True:
            limit = await client.read_global_concurrency_limit_by_name(lock_name(LocalHost().identity()))
            leases = [v.name for v in await client.read_variables() if v.name.startswith("specsweep-lease-")]
            if limit.active_slots == 0 and not leases:
                return
            assert asyncio.get_running_loop().time() < deadline, (limit.active_slots, leases)
            await asyncio.sleep(0.25)
