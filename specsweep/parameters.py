"""The parameters every benchmark flow shares (shown as forms in the Prefect UI): the prompts, the
load, how requests are made, the stages' retries and timeouts, and where results go.

What to run is each engine's own form (``specsweep.engines``) or a server profile
(``specsweep.profiles``); the host is ``specsweep.hosts.HostConfig``."""

from __future__ import annotations

from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field

from specsweep.analysis.decision import DecisionConfig
from specsweep.bench.config import RequestParams, SweepConfig, WorkloadConfig
from specsweep.results import DEFAULT_ROOT


class TaskOptions(TypedDict):
    retries: int
    retry_delay_seconds: float
    timeout_seconds: float | None


class StageConfig(BaseModel):
    """How often a stage is retried and how long one try may take."""

    model_config = ConfigDict(extra="forbid")

    retries: int = Field(0, ge=0, le=20, description="Retries after a failed try.")
    retry_delay_s: float = Field(5.0, ge=0, le=3600, description="Seconds between tries.")
    timeout_s: float | None = Field(None, gt=0, le=24 * 3600, description="Limit of one try in seconds; empty for none.")

    def task_options(self) -> TaskOptions:
        """Keyword arguments for Prefect's ``Task.with_options``."""
        return {"retries": self.retries, "retry_delay_seconds": self.retry_delay_s, "timeout_seconds": self.timeout_s}


class LifecycleConfig(BaseModel):
    """Retries and timeouts of the server lifecycle stages."""

    model_config = ConfigDict(extra="forbid")

    kill: StageConfig = Field(
        default_factory=lambda: StageConfig(retries=2, retry_delay_s=5, timeout_s=900),
        description="kill_server: stop the server and its leftovers.",
    )
    start: StageConfig = Field(
        default_factory=lambda: StageConfig(retries=1, retry_delay_s=10, timeout_s=300),
        description="start_server: launch the server.",
    )
    wait: StageConfig = Field(
        default_factory=lambda: StageConfig(retries=0, timeout_s=None),
        description="wait_for_health: poll until ready. Without a timeout, the profile's startup_timeout_s applies.",
    )
    warm_up_seconds: float = Field(
        60.0, gt=0, le=3600, description="After each start, the warm-up's time cap (it ends sooner once the TTFT "
        "settles).")
    warm_up_requests: int = Field(
        24, ge=0, le=10_000, description="After each start, single requests until the server's TTFT settles, at most "
        "this many (0: no warm-up; each level still has its own sweep.warmup_requests).")
    kill_port_holder: bool = Field(
        False, description="If the port is busy at start, kill whatever holds it instead of failing."
    )
    benchmark: StageConfig = Field(
        default_factory=lambda: StageConfig(retries=0, timeout_s=None),
        description="run_concurrency_benchmark: one level. A retry measures the level again.",
    )


class BenchmarkSettings(BaseModel):
    """What every benchmark flow shares: the prompts, the load, how requests are made, the
    stages' retries and timeouts, and where results go."""

    model_config = ConfigDict(extra="forbid")

    workload: WorkloadConfig = Field(default_factory=WorkloadConfig, description="Which prompts to send.")
    sweep: SweepConfig = Field(default_factory=SweepConfig, description="The levels and how much load at each.")
    request: RequestParams = Field(default_factory=RequestParams, description="How each request is made.")
    stages: LifecycleConfig = Field(default_factory=LifecycleConfig, description="Retries and timeouts per stage.")
    results: str = Field(str(DEFAULT_ROOT), min_length=1,
                         description="Results root: a folder every worker can read, or a URL (s3://bucket/prefix, gs://…).")
    results_block: str | None = Field(
        None, description="Or: the name of a specsweep-results block (a URL with the credentials it needs).")


#: The main job's defaults: tiny models on two CPU cores.
LOCAL_BENCHMARK = BenchmarkSettings(
    # Real traffic by default: the MT-Bench questions through the chat endpoint (the model's own template).
    workload=WorkloadConfig(source="mt-bench", input_len=16, output_len=64),
    # A block at C=8 holds 24 requests (3 per slot): ramp-up and drain stay a small part of it.
    sweep=SweepConfig(concurrency=[1, 2, 4, 8], num_requests=12, warmup_requests=2, requests_per_slot=3),
    # Small CPU servers have no kernels to compile: a warm-up past 20 s is this machine's noise, not a cold server.
    stages=LifecycleConfig(warm_up_seconds=20.0),
)
#: Both small servers fit side by side: blocks alternate between them without restarts.
LOCAL_DECISION = DecisionConfig(design="alternate", alternate_by="side-by-side")
#: The sweep a GPU host gets by default: up to 64 in flight.
GPU_BENCHMARK = BenchmarkSettings(sweep=SweepConfig(concurrency=[1, 2, 4, 8, 16, 32, 64]))
