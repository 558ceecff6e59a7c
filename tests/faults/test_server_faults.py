"""Every way the server misbehaves, through the whole benchmark-config flow.

The server is the simulator, a real process that misbehaves on purpose (its faults are
product options). Each case ends with nothing lost (what was measured is in the store,
failed requests are rows with their error, the run row says how it ended) and nothing
left running.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from flows.benchmark_config import benchmark_config
from specsweep.bench.config import RequestParams, SweepConfig, WorkloadConfig
from specsweep.engines.sglang import baseline as sglang_baseline
from specsweep.parameters import BenchmarkSettings, LifecycleConfig
from specsweep.results.store import ResultsStore
from specsweep.sweep import MAX_SET_ASIDE
from tests.conftest import pids_with_marker
from tests.helpers.logs import flow_logs
from tests.helpers.sshd import free_port

pytestmark = pytest.mark.usefixtures("prefect_harness")


@dataclass
class Case:
    flags: list[str]
    completed: bool  # the flow run's end state
    levels: dict[int, tuple[str, str]]  # concurrency -> ("clean" | "failures", error type expected among failures)
    message: str = ""  # in the flow run's failure message
    startup_timeout_s: float = 30.0
    sweep: dict[str, object] = field(default_factory=dict)
    timeout_s: float = 5.0


CASES = {
    "crash during startup": Case(["--fault-crash-on-start"], False, {}, "exited while starting"),
    "never healthy": Case(["--fault-never-healthy"], False, {}, "was not ready after 3 s", startup_timeout_s=3),
    # 1 warm-up + 4 at C=1, then 1 warm-up + 2 at C=2, then it dies.
    "dies in the middle of a level": Case(["--fault-die-after", "8"], False,
                                          {1: ("clean", ""), 2: ("failures", "")}, "exited during level C=2"),
    "hangs while /health stays 200": Case(["--fault-hang-after", "3"], True,
                                          {1: ("failures", "Timeout"), 2: ("failures", "Timeout")},
                                          sweep={"warmup_requests": 0}, timeout_s=1.0),
    "answers 500s": Case(["--fault-error-rate", "0.5", "--seed", "3"], True,
                         {1: ("failures", "HTTPStatus"), 2: ("failures", "HTTPStatus")}, sweep={"warmup_requests": 0}),
    "cuts streams": Case(["--fault-cut-rate", "0.5", "--seed", "3"], True,
                         {1: ("failures", "CutOff"), 2: ("failures", "CutOff")}, sweep={"warmup_requests": 0}),
    "malformed SSE": Case(["--fault-malformed-rate", "0.5", "--seed", "3"], True,
                          {1: ("failures", "MalformedSSE"), 2: ("failures", "MalformedSSE")}, sweep={"warmup_requests": 0}),
    # One byte every 20 ms: every read gets data at once, the answer would take ~10 s.
    "trickles slower than the request timeout": Case(["--fault-trickle-s", "0.02"], True,
                                                     {1: ("failures", "Timeout"), 2: ("failures", "Timeout")},
                                                     sweep={"warmup_requests": 0, "num_requests": 2}, timeout_s=1.0),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_server_fault(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    port = free_port()
    profile = sglang_baseline("/models/kimi", host="127.0.0.1", port=port, simulate=True, sim_profile="tiny-fast",
                              sim_startup_s=0.3, extra_args=case.flags)
    profile = profile.model_copy(update={"startup_timeout_s": case.startup_timeout_s,
                                         "kill_grace_s": 2.0})
    results = tmp_path / "results"
    # Blocks of exactly num_requests (none raised to 2 per slot): the counts below are the faults' own.
    sweep = {"concurrency": [1, 2], "num_requests": 4, "warmup_requests": 1, "requests_per_slot": 0, **case.sweep}
    t0 = time.monotonic()
    state = await benchmark_config(
        profile, return_state=True, benchmark=BenchmarkSettings(
            workload=WorkloadConfig(input_len=8, output_len=32), sweep=SweepConfig.model_validate(sweep),
            request=RequestParams(timeout_s=case.timeout_s), results=str(results),
            # No warm-up after the start: the faults count requests from the first measured one.
            stages=LifecycleConfig(warm_up_requests=0)),
    )
    took = time.monotonic() - t0
    assert state.is_completed() is case.completed, state.message
    if case.message:
        assert case.message in (state.message or ""), state.message
    # Nothing left running, whatever happened.
    assert pids_with_marker(port) == []
    # Nothing lost: every level that ran is stored, with its failures as rows.
    store = ResultsStore(results)
    if not case.levels:
        assert not (results / "levels").exists()
    else:
        levels = pd.read_parquet(results / "levels").set_index("concurrency")
        assert sorted(set(levels.index)) == sorted(case.levels)
        requests = store.requests(list(store.runs()["run_id"]))
        for concurrency, (kind, error) in case.levels.items():
            blocks = levels.loc[[concurrency]]
            if kind == "clean":
                assert len(blocks) == 1 and blocks["disturbed"].isna().all()
                assert (blocks["failed"] == 0).all() and (blocks["completed"] == sweep["num_requests"]).all()
                continue
            assert (blocks["failed"] >= 1).all(), blocks["errors"]
            assert all(error in e for e in blocks["errors"]), blocks["errors"]
            # A block with failures is set aside and measured again once; failing again, they are the
            # server's, and that block counts (a run cut short keeps the one it had, set aside).
            assert "request(s) failed" in blocks["disturbed"].iloc[0]
            if case.completed and (blocks["completed"] > 0).all():
                assert len(blocks) == 2 and blocks["disturbed"].iloc[1:].isna().all(), blocks["disturbed"]
            elif case.completed:  # nothing completed: never counted, measured again up to the cap
                assert len(blocks) == MAX_SET_ASIDE + 1 and blocks["disturbed"].notna().all(), blocks["disturbed"]
        measured = requests[~requests["warmup"]]
        assert len(measured) == len(levels) * int(sweep["num_requests"])  # type: ignore[call-overload]
        assert measured["error_type"].notna().sum() == levels["failed"].sum()
    runs = store.runs()
    if len(runs):
        run = runs.iloc[0]
        assert run["status"] == ("completed" if case.completed else "failed")
        if not case.completed:
            assert case.message in run["error"]
    if name.startswith(("hangs", "trickles")):
        # A stuck or trickling request is cut at the request timeout (1 s), not when the server gives up: never
        # (hangs) or after ~10 s (trickles). Alone they end 1.000-1.003 s after they were sent; among four tests
        # at once on two cores one took over 2 s (the client starved), so the bound is half the trickle's 10 s.
        failed = requests[requests["error_type"] == "Timeout"]
        assert (failed["e2e_ms"] < (case.timeout_s + 4.0) * 1000).all(), sorted(failed["e2e_ms"].tolist())[-3:]
        assert took < 60
    logs = await flow_logs(state.state_details.flow_run_id)
    # The kill ran at the start (leftovers) and again at the end, whatever happened in between.
    kills = [m for m in logs if re.search(r"killed \d+ process\(es\)|nothing was running for port", m)]
    assert len(kills) >= 2, logs
