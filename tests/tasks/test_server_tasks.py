"""The lifecycle tasks inside real flow runs (a temporary Prefect server)."""

from __future__ import annotations

import time

import pytest
from prefect import flow
from prefect.context import get_run_context

from flows.server_lifecycle import server_lifecycle
from specsweep.bench.config import RequestSpec
from specsweep.hosts import HostConfig, open_host
from specsweep.parameters import LifecycleConfig, StageConfig
from specsweep.server import lifecycle
from specsweep.server.lifecycle import kill_server as kill_server_now
from tasks.server import kill_server, start_server, wait_for_health
from tests.conftest import MakeToy, pids_alive, pids_with_marker, wait_ready
from tests.helpers.logs import flow_logs

pytestmark = pytest.mark.usefixtures("prefect_harness")


async def test_lifecycle_flow_logs_progress_and_leaves_nothing(make_toy: MakeToy) -> None:
    profile = make_toy("--listen-after", "0.3", "--warmup", "0.5", "--api-key", "sk-flow-secret-987")
    state = await server_lifecycle(profile, return_state=True)
    report = await state.result()
    assert report.ready and report.time_to_ready_s > 0.7
    assert pids_with_marker(profile.port) == []
    messages = await flow_logs(state.state_details.flow_run_id)
    joined = "\n".join(messages)
    assert "health attempt" in joined and "is ready after" in joined
    assert "[server] toy server pid" in joined  # server log lines forwarded into the run log
    assert "sk-flow-secret-987" not in joined and "--api-key ***" in joined


async def test_wait_timeout_option_fails_the_flow_and_kills_the_server(make_toy: MakeToy) -> None:
    profile = make_toy("--warmup", "1000", startup_timeout_s=600)
    stages = LifecycleConfig(wait=StageConfig(timeout_s=1.5))
    state = await server_lifecycle(profile, stages=stages, return_state=True)
    assert state.is_failed()
    with pytest.raises(Exception) as err:
        await state.result()
    assert "timed out" in str(err.value).lower() or "TimedOut" in repr(err.value)
    assert pids_with_marker(profile.port) == []


async def test_startup_crash_fails_flow_with_log_tail(make_toy: MakeToy) -> None:
    profile = make_toy("--crash-after", "0.3")
    state = await server_lifecycle(profile, return_state=True)
    assert state.is_failed()
    messages = "\n".join(await flow_logs(state.state_details.flow_run_id))
    assert "CUDA out of memory" in messages


async def test_tasks_over_ssh(ssh_host_config: HostConfig, make_toy: MakeToy) -> None:
    profile = make_toy("--spawn-grandchild")

    @flow
    async def over_ssh() -> list[int]:
        host = open_host(ssh_host_config)
        await kill_server(host, profile)
        async with start_server(host, profile, RequestSpec(), LifecycleConfig(), marker="test") as server:
            assert server.path.tunnel is not None  # an SSH host's server is reached through a tunnel
            await wait_for_health(server)
        host.close()
        assert get_run_context() is not None and server.killed is not None
        assert server.path.tunnel.problem() is not None  # the tunnel closed with the block
        return [k.pid for k in server.killed.killed]

    killed = await over_ssh()
    assert len(killed) >= 3 and pids_alive(killed) == []


async def test_a_start_that_timed_out_starts_nothing_after_its_final_kill(make_toy: MakeToy) -> None:
    # The port is held by a stray that ignores SIGTERM: taking the port (kill_port_holder) outlasts the start's
    # 1 s timeout. The thread of the start runs on after the timeout; it must not launch the server once the
    # run has given up (nobody would kill it: the final kill has run, the start's record is forgotten).
    stray = make_toy("--ignore-sigterm", name="stray")
    profile = make_toy(port=stray.port, kill_grace_s=3)
    host = open_host(HostConfig())
    stray_handle = lifecycle.start_server(host, stray)
    await wait_ready(host, stray, stray_handle)  # listening, its SIGTERM handler set (a loaded machine starts it late)
    stages = LifecycleConfig(start=StageConfig(timeout_s=1, retries=0), kill_port_holder=True)

    @flow
    async def start_times_out() -> None:
        async with start_server(host, profile, RequestSpec(), stages, marker="timed-out-start"):
            raise AssertionError("the start cannot have succeeded within its timeout")

    try:
        state = await start_times_out(return_state=True)
        assert state.is_failed()
        with pytest.raises(Exception, match="(?i)timed out"):
            await state.result()
        assert pids_alive([stray_handle.pid]) == []  # the port's holder was taken, as asked
        time.sleep(2 * profile.kill_grace_s)  # past the moment the thread would have sent the start
        assert pids_with_marker(profile.port) == []  # and no server was started after the run gave up
        messages = "\n".join(await flow_logs(state.state_details.flow_run_id))
        assert "the start of toy was given up (its task timed out or was cancelled): the start was not sent" \
            in messages, messages
        assert "starting toy" not in messages  # nor said to be
    finally:
        kill_server_now(host, stray)
        kill_server_now(host, profile)
