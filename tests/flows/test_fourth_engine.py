"""A fourth engine added in the tests alone (tests/helpers/toy_engine.py: one module, ``engines.register``)
runs a comparison through the compare-engine flow and through the command line, and its servers are what
the cleanup hooks find: nothing outside engines/ names an engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.compare_speculation import compare_engine
from flows.tune_speculation import tune_speculation
from orchestration.cleanup import profile_of, run_servers
from specsweep.analysis.decision import DecisionConfig
from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.parameters import BenchmarkSettings
from specsweep.results.store import ResultsStore
from tasks.started import StartRecord
from tests.conftest import pids_with_marker
from tests.helpers.cli import invoke
from tests.helpers.sshd import free_port
from tests.helpers.toy_engine import toy_engine

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def toy() -> Iterator[None]:
    with toy_engine():
        yield


def small(results: Path) -> BenchmarkSettings:
    return BenchmarkSettings(workload=WorkloadConfig(input_len=16, output_len=32), results=str(results),
                             sweep=SweepConfig(concurrency=[1, 8], num_requests=8, warmup_requests=1))


@pytest.mark.usefixtures("toy")
async def test_a_fourth_engine_compares_through_the_flow(tmp_path: Path) -> None:
    port = free_port(span=2)  # side by side: the speculative server on the next port
    state = await compare_engine(
        settings={"engine": "toy", "port": port},  # type: ignore[arg-type]  # JSON, as a deployment's run gives it
        benchmark=small(tmp_path / "results"),
        decision=DecisionConfig(design="alternate", alternate_by="side-by-side", min_blocks=2,
                                max_requests_per_level=16),  # two blocks each: no verdict asserted
        return_state=True)
    assert state.is_completed(), state.message
    result = await state.result()
    assert [lv.concurrency for lv in result.comparison.levels] == [1, 8]
    assert all(lv.ratio is not None for lv in result.comparison.levels)
    runs = ResultsStore(tmp_path / "results").runs()
    assert sorted(runs["config_name"]) == ["toy-baseline", "toy-speculative"]
    assert set(runs["engine"]) == {"toy"} and set(runs["status"]) == {"completed"}
    assert pids_with_marker(port) == [] and pids_with_marker(port + 1) == []


@pytest.mark.usefixtures("toy")
def test_a_fourth_engine_compares_through_the_command_line(tmp_path: Path) -> None:
    port = free_port(span=2)
    settings = tmp_path / "toy.json"
    settings.write_text(json.dumps({"engine": "toy", "port": port}))  # the file names its engine: no --engine
    done = invoke("compare-speculation", "--settings", str(settings), "--concurrency", "1", "--num-prompts", "8",
                  "--output-len", "32", "--max-requests-per-level", "16", "--results", str(tmp_path / "results"))
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "toy-baseline" in done.stdout and "(speculative)" in done.stdout
    runs = ResultsStore(tmp_path / "results").runs()
    assert set(runs["engine"]) == {"toy"} and len(runs) == 2
    assert pids_with_marker(port) == [] and pids_with_marker(port + 1) == []


@pytest.mark.usefixtures("toy")
def test_the_hooks_find_a_fourth_engines_servers_in_the_parameters() -> None:
    """What a cancellation or crash hook rebuilds from a run's parameters, the toy's grid points included."""
    servers = run_servers(compare_engine, {"settings": {"engine": "toy", "port": 18001}})
    assert [(p.name, p.engine, p.port) for p in servers] == [("toy-baseline", "toy", 18001),
                                                            ("toy-speculative", "toy", 18001)]
    servers = run_servers(tune_speculation, {"settings": {"engine": "toy", "port": 18001}, "grid": {"num_steps": [1, 2]}})

    def start(profile: str) -> StartRecord:
        return StartRecord(flow_run="r", host="local", profile=profile, port=18002, token="t")

    # A grid point, a temperature's configuration, the recommended setting: named after the profile they derive from.
    for name in ("toy-speculative-steps1", "toy-baseline-t0.7", "toy-speculative-as-recommended"):
        found = profile_of(start(name), servers)
        assert found is not None and name.startswith(found.name + "-"), name
    assert profile_of(start("other-baseline"), servers) is None


def test_settings_of_an_engine_no_longer_registered_are_refused(tmp_path: Path) -> None:
    done = invoke("compare-speculation", "--engine", "toy", "--results", str(tmp_path / "results"))
    assert done.returncode == 2 and "--engine 'toy' is not an engine specsweep knows" in done.stderr, done.stderr
