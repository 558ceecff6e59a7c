"""What a flow run reads and checks before it touches a host, and what it keeps of each configuration.

``prepare_run`` resolves what the parameters name (Secret blocks, the ssh-host and results blocks),
checks what can be checked (the host's allow-list, the results location writable, the prompts
readable) and refuses bad input naming the field. ``Run.configuration`` then gives each server
profile its job (run id, store, workload, sweep) and its run row's recorder.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from pydantic import BaseModel, SecretStr

from orchestration.blocks import aresolve_host, aresolve_profile, aresolve_results, aresolve_secret, check_allowed
from orchestration.host import hold_host
from specsweep import engines, policy
from specsweep.analysis.decision import DecisionConfig
from specsweep.bench.config import RequestSpec
from specsweep.bench.workload import check_source
from specsweep.hosts import Host, HostConfig
from specsweep.parameters import BenchmarkSettings, LifecycleConfig
from specsweep.profiles import ProfileParams, ServerProfile
from specsweep.records import BlockRow
from specsweep.results import ResultsStore
from specsweep.results.run_record import RunRecorder, finished_run
from specsweep.sweep import Level, SweepJob, new_run_row, sweep_levels
from tasks._common import artifact_key


def flow_run() -> FlowRun:
    context = FlowRunContext.get()
    assert context is not None and context.flow_run is not None, "a benchmark runs inside a flow run"
    return context.flow_run


@dataclass
class Configuration:
    """One server configuration of a run: its profile, its job, its run row, its progress artifact."""

    profile: ServerProfile
    job: SweepJob
    recorder: RunRecorder
    progress: Callable[[BlockRow, int, int], Awaitable[None]]
    ready_s: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.profile.name

    def finished(self) -> list[BlockRow] | None:
        """Every block, when an earlier try of this flow run measured this configuration whole."""
        return finished_run(self.job.store, self.job.run_id)


@dataclass
class Run:
    """A flow run's inputs, read and checked: the benchmark settings, the request with its API key, the
    results store, the resolved host and server profiles."""

    settings: BenchmarkSettings
    request: RequestSpec
    store: ResultsStore
    host: HostConfig
    host_block: str | None
    servers: list[ServerProfile]
    decision: DecisionConfig | None = None

    def hold(self) -> AbstractAsyncContextManager[Host]:
        """The run's host held (its machine's lock) and connected, as ``orchestration.host.hold_host`` holds it, with the
        ssh-host block it came from named in what it logs."""
        return hold_host(self.host, self.host_block)

    @property
    def marker(self) -> str:
        """The flow run's id: it names the run's tunnels and its records of server starts (the cleanup
        hooks of a run that crashed find them by it)."""
        return str(flow_run().id)

    @property
    def stages(self) -> LifecycleConfig:
        return self.settings.stages

    @property
    def levels(self) -> list[Level]:
        return sweep_levels(self.settings.sweep)

    def request_for(self, profile: ServerProfile) -> RequestSpec:
        """The run's request options; the profile's own key when the run names none."""
        if self.request.api_key or not profile.api_key:
            return self.request
        return self.request.model_copy(update={"api_key": profile.api_key})

    async def configuration(self, profile: ServerProfile, host_label: str, *,
                            verifies: tuple[str, str] | None = None, own_prompts: bool = False) -> Configuration:
        """The configuration's job and run row (the same run id on every retry of the flow run). ``verifies``:
        (comparison, arm) for the verify stage's runs; ``own_prompts``: it shares its servers with the others
        (``SweepJob``)."""
        job = SweepJob(run_id=run_id_for(profile, "verify" if verifies else ""), config_name=profile.name,
                       store=self.store, workload=self.settings.workload, sweep=self.settings.sweep,
                       own_prompts=own_prompts)
        design = None if self.decision is None else (
            self.decision.design if self.decision.design == "sequential" and not verifies
            else f"alternate-{self.decision.alternate_by}")
        base_url = (self.host.http_url(profile.port) if self.host.traffic_mode == "direct"
                    else f"tunnel to {profile.host}:{profile.port} on {host_label}")
        if self.host.load_generator == "host":
            base_url += f" (load generated on the host by {self.host.host_python})"
        row = new_run_row(config_name=profile.name, engine=profile.engine, job=job, host=host_label, base_url=base_url,
                          command=profile.masked_command(), flow_run_id=self.marker, design=design,
                          decision=self.decision, verifies=verifies)
        return Configuration(profile, job, RunRecorder(self.store, job.run_id, row), await progress_bar(profile.name))


def run_id_for(profile: ServerProfile, stage: str = "") -> str:
    """The same id on every retry of a flow run (so finished levels line up), a new one per flow run."""
    run = flow_run()
    created = run.created or run.expected_start_time
    stamp = created.strftime("%Y%m%dT%H%M%SZ") if created else "run"
    return f"{stamp}-{profile.name}{'-' + stage if stage else ''}-{run.id.hex[:8]}"


async def progress_bar(name: str) -> Callable[[BlockRow, int, int], Awaitable[None]]:
    """A progress artifact for one configuration, and the hook that moves it after each level."""
    progress = await acreate_progress_artifact(0.0, key=artifact_key(name, "progress"), description=f"{name}: levels done")

    async def advance(_row: BlockRow, done: int, total: int) -> None:
        await aupdate_progress_artifact(progress, 100.0 * done / total, description=f"{name}: {done}/{total} levels done")

    return advance


async def prepare_run(profiles: Sequence[ProfileParams], host: HostConfig, benchmark: BenchmarkSettings,
                      decision: DecisionConfig | None = None) -> Run:
    """Everything a run needs before it touches a host: secrets read, the host resolved and its allow-list
    checked, results writable, prompts readable (inside the policy's ``read`` folders, of a bounded size).
    Anything missing is refused here, naming the field."""
    request = RequestSpec.model_validate(benchmark.request.model_dump())
    key = await aresolve_secret(benchmark.request.api_key_secret, "benchmark.request.api_key_secret")
    if key:
        request = request.model_copy(update={"api_key": SecretStr(key)})
    fields = [f"profiles[{i}]" if len(profiles) > 1 else "profile" for i in range(len(profiles))]
    for f, p in zip(fields, profiles, strict=True):
        engines.check_name(p.engine, f"{f}.engine")
    servers = [await aresolve_profile(p, f) for f, p in zip(fields, profiles, strict=True)]
    for f, server in zip(fields, servers, strict=True):  # the engine's launch rules: refused here, or warned
        for finding in engines.check_launch(server, f):
            logging.getLogger("specsweep.run").warning("%s (%s): %s", f, server.name, finding)
    resolved = await aresolve_host(host)
    check_allowed(resolved, servers)
    store = ResultsStore(await aresolve_results(benchmark.results, benchmark.results_block))
    workload = benchmark.workload
    rules = policy.load()
    if workload.prompts_file is not None and workload.source in ("file", "sharegpt"):
        rules.check_read(workload.prompts_file, "benchmark.workload.prompts_file")
    if workload.tokenizer is not None:
        rules.check_read(workload.tokenizer, "benchmark.workload.tokenizer", folder=True)
    store.check_writable()
    check_source(workload)
    return Run(benchmark, request, store, resolved, host.block, servers, decision)


class ConfigurationResult(BaseModel):
    """What a flow returns of one configuration: its run id and every block's figures."""

    config_name: str
    run_id: str
    levels: list[BlockRow]
    time_to_ready_s: float | None

    @classmethod
    def of(cls, config: Configuration, rows: list[BlockRow]) -> ConfigurationResult:
        ready = config.ready_s[0] if config.ready_s else config.job.store.run(config.job.run_id).time_to_ready_s
        return cls(config_name=config.name, run_id=config.job.run_id, levels=rows, time_to_ready_s=ready)
