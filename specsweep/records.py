"""What a sweep produces, as types: a block of a level to measure, the raw record of one request, and
the rows of the three datasets (runs, levels, requests). A level (``specsweep.sweep.Level``) is one point of the
sweep; it is measured in blocks (``Block``), each stored as one row of the ``levels`` dataset (``BlockRow``: the
dataset and its columns keep their names, so data stored before still reads).

    Block          one measurement block of a level: (index, mode, value, repeat), frozen
    RequestRecord  one request's raw monotonic timestamps and counts (the load generator fills it)
    BlockRun       one block's raw records plus what the client measured of itself
    RequestRow     a request as stored: the raw record, its level, derived per-request figures
    BlockRow       a block as stored (a row of the levels dataset): every figure, units in the names
    RunRow         a run (one configuration on one host) as stored

Rows are pydantic models; ``arrow_schema`` derives each dataset's Parquet schema from the
model's annotations, so a column that is empty in one file and set in another always has
one type and the files of a dataset read back together.
"""

from __future__ import annotations

import types
import typing
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Self

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

Mode = Literal["concurrency", "rate"]


class Block(BaseModel):
    """One measurement block of a level (its ``repeat``-th). Frozen: it is a task input, hashed for the retry
    cache."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, description="Position of the level in the sweep (repeats share it).")
    mode: Mode = Field(description="concurrency: closed loop; rate: open loop (Poisson arrivals).")
    value: float = Field(gt=0, description="Requests in flight (concurrency) or requests per second (rate).")
    repeat: int = Field(0, ge=0, description="Which measurement of this level (0 for the first).")

    @property
    def concurrency(self) -> int | None:
        return int(self.value) if self.mode == "concurrency" else None

    @property
    def label(self) -> str:
        """C=8 or 2.5 req/s, as the logs and tables write a level."""
        return f"C={int(self.value)}" if self.mode == "concurrency" else f"{self.value:g} req/s"

    @property
    def key(self) -> str:
        """The level's file name in the store: sorts in sweep order, unique per repeat."""
        return f"L{self.index:03d}-{self.mode}-{self.value:g}-r{self.repeat}"

    def __str__(self) -> str:
        return f"{self.label} #{self.repeat}"


@dataclass(slots=True)
class RequestRecord:
    """One request: raw ``time.perf_counter()`` stamps (CLOCK_MONOTONIC, shared by all processes
    on the machine) and counts, never derived figures. A failed, timed-out or cut-off request
    is a record with an error, kept with whatever it received before the failure."""

    index: int
    scheduled_s: float  # when the request was due (open loop) or sent (closed loop)
    sent_s: float | None = None  # None: never sent
    first_token_s: float | None = None
    last_token_s: float | None = None
    end_s: float | None = None
    prompt_tokens: int | None = None
    prompt_tokens_exact: bool = False
    output_tokens: int | None = None
    output_tokens_source: str = "none"  # usage | chunks | meta_info
    chunk_times_s: list[float] = field(default_factory=list)  # arrival of each chunk with text
    chunk_tokens: list[int] = field(default_factory=list)  # tokens each such chunk carried
    status_code: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    spec_draft_tokens: int | None = None  # drafted tokens, where the engine's answer says (its module reads them)
    spec_accepted_tokens: int | None = None  # of them, accepted
    spec_verify_ct: int | None = None  # verify steps, where the engine's answer says
    spec_accept_length: float | None = None  # the engine's own per-request accept length (bonus token included)
    spec_accept_histogram: list[int] | None = None  # steps that accepted exactly j drafts, by j (where said)
    response_id: str | None = None  # the server's id for the response (first event's "id")
    warmup: bool = False
    endpoint: str | None = None  # completions, chat or generate
    prompt_index: int | None = None  # which of the level's prompts (the same index in each configuration)
    category: str | None = None  # the prompt's category in its set (MT-Bench's writing, coding, ...)
    phase: int | None = None  # its phase in traffic that shifts (workload.phases): 0, 1, 2, ...
    finish_reason: str | None = None  # stop (its natural end) or length (max_tokens), as the server says
    output_digest: str | None = None  # a hash of the generated text: equal digests, equal outputs

    @property
    def ok(self) -> bool:
        return self.error_type is None

    def as_dict(self) -> dict[str, Any]:
        """For crossing a process boundary (client worker processes)."""
        return asdict(self)


@dataclass
class BlockRun:
    """One block's raw outcome: the records, and what the client measured of itself."""

    level: Block
    records: list[RequestRecord]
    started_at: float  # wall clock, for labels
    client_cpu_s: float = 0.0
    client_wall_s: float = 0.0
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    workers: int = 1
    engine_before: dict[str, float] = field(default_factory=dict)  # the engine's /metrics (engine_metrics.snapshot)
    engine_after: dict[str, float] = field(default_factory=dict)  # right before and right after the timed load
    engine_during: list[dict[str, float]] = field(default_factory=list)  # its gauges, sampled while the level ran
    connections_opened: int = 0

    #: A level is flagged when the client used this share of one core, or its loop lagged this much.
    CPU_BOTTLENECK = 0.90
    LAG_BOTTLENECK_MS = 20.0

    @property
    def client_cpu_share(self) -> float:
        return self.client_cpu_s / self.client_wall_s / self.workers if self.client_wall_s > 0 else 0.0

    @property
    def client_bottleneck(self) -> bool:
        """The client set the pace: it used most of a core, or its loop lagged. Only said of a level that
        served something (a level whose requests all failed at once used the client's CPU and nothing else)."""
        if not any(r.ok and not r.warmup for r in self.records):
            return False
        return self.client_cpu_share >= self.CPU_BOTTLENECK or (self.loop_lag_p99_ms or 0.0) >= self.LAG_BOTTLENECK_MS


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def to_record(self) -> dict[str, Any]:
        """The row as one Parquet record (the only conversion there is)."""
        return self.model_dump()

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Self:
        """A row read back from Parquet; columns this version does not know are left out."""
        return cls.model_validate({k: v for k, v in record.items() if k in cls.model_fields})


class RequestRow(Row):
    """A request as stored (the ``requests`` dataset): raw stamps, its level, derived figures.

    It repeats RequestRecord's fields on purpose: the record is the timed path's plain mutable
    dataclass (filled chunk by chunk, no validation), the row the validated stored form. A test
    holds the two together (every record field is a row field)."""

    index: int
    mode: Mode
    level_value: float
    repeat: int
    warmup: bool = False
    scheduled_s: float
    sent_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    end_s: float | None = None
    prompt_tokens: int | None = None
    prompt_tokens_exact: bool = False
    output_tokens: int | None = None
    output_tokens_source: str = "none"
    chunk_times_s: list[float] = Field(default_factory=list, description="Arrival of each chunk, seconds after the send.")
    chunk_tokens: list[int] = Field(default_factory=list)
    status_code: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int | None = None
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = Field(None, description="The engine's own accept length for this request "
                                             "(tokens per verify step, the bonus token included), where it says.")
    spec_accept_histogram: list[int] | None = Field(
        None, description="Verify steps that accepted exactly j drafts, index j, where the engine's answer counts them.")
    response_id: str | None = None
    endpoint: str | None = None
    prompt_index: int | None = None
    category: str | None = None
    phase: int | None = Field(None, description="Its phase in traffic that shifts (workload.phases), from 0: "
                              "phase n sent the categories' (n mod their number)-th. None: no phases.")
    finish_reason: str | None = Field(None, description="stop (the natural end) or length (max_tokens).")
    output_digest: str | None = Field(None, description="Hash of the generated text (equal: the same output).")
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    send_delay_ms: float | None = Field(None, description="Send minus schedule (open loop: the client's lateness).")


class BlockRow(Row):
    """A block as stored (the ``levels`` dataset): one row per level and repeat."""

    config_name: str
    level_index: int
    mode: Mode
    concurrency: int | None = None
    request_rate_per_s: float | None = None
    repeat: int = 0
    started_at: str | None = None
    requests: int = 0
    completed: int = 0
    failed: int = 0
    errors: str = ""
    duration_s: float = 0.0
    request_throughput_per_s: float = 0.0
    input_tokens_total: int = 0
    output_tokens_total: int = 0
    input_tokens_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    total_tokens_per_s: float = 0.0
    achieved_concurrency: float = 0.0
    peak_output_tokens_per_s: float = 0.0
    request_speed_tokens_per_s: float | None = Field(
        None, description="The speed a request saw: the completed requests' output tokens over the seconds all the "
        "block's requests took from their scheduled send to their end. What a request-rate comparison counts.")
    steady_output_tokens_per_s: float | None = Field(
        None, description="Output tok/s while the level's full concurrency was in flight (ramp-up and drain "
        "excluded); None where there was no such span.")
    steady_share: float | None = Field(None, description="That span's share of the block's duration.")
    reached_concurrency: bool | None = Field(
        None, description="Whether the block ever had its level's C requests in flight at once (closed loop; None for "
        "open loop): a block of fewer requests than C, or one whose first answers came back before the C-th was "
        "sent, never measured the level it is labelled with.")
    disturbed: str | None = Field(None, description="Why this block was set aside (and measured again): the machine, "
                                  "not the server under test, shaped it. None: it counts.")
    input_tokens_exact: bool = False
    output_tokens_source: str = "none"
    ttft_ms_mean: float | None = None
    ttft_ms_median: float | None = None
    ttft_ms_p90: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_mean: float | None = None
    tpot_ms_median: float | None = None
    tpot_ms_p90: float | None = None
    tpot_ms_p99: float | None = None
    itl_ms_mean: float | None = None
    itl_ms_median: float | None = None
    itl_ms_p90: float | None = None
    itl_ms_p99: float | None = None
    e2e_ms_mean: float | None = None
    e2e_ms_median: float | None = None
    e2e_ms_p90: float | None = None
    e2e_ms_p99: float | None = None
    spec_acceptance_rate: float | None = None
    spec_accept_length: float | None = None
    spec_source: str | None = Field(None, description="Where the spec_* figures came from: per-request (the engine's "
                                    "answers) or /metrics difference (its counters around the level).")
    spec_accept_length_step_weighted: float | None = Field(
        None, description="Accept length over all the level's verify steps together (per-request figures, or the "
        "counters): tokens per step, each step counting once.")
    spec_accept_length_request_weighted: float | None = Field(
        None, description="Accept length as the mean of each request's own (per-request figures): each request "
        "counting once, however many steps it took. It differs from the step-weighted figure where long and short "
        "answers accept differently. Per-request figures only.")
    spec_drafted_per_step: float | None = Field(
        None, description="Draft tokens per verify step, mean over the level's steps: the depth an engine's own "
        "controller (adaptive tiers, a per-batch table) ran at. Per-request figures, else counters.")
    controller_tier_mean: float | None = Field(
        None, description="An engine's own speculation controller: its active tier (draft steps, where the "
        "engine shows it: Engine.tier_at) sampled while the block ran, mean over the samples.")
    controller_tiers: str | None = Field(
        None, description="The same samples' distribution, as JSON: draft steps to the share of samples at them "
        "(e.g. {\"1\": 0.25, \"7\": 0.75}).")
    spec_drafts: float | None = Field(None, description="Drafts the engine made in the level (/metrics difference).")
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    spec_acceptance_per_position: list[float] | None = Field(
        None, description="Of the level's drafts, the share whose i-th drafted token was accepted (engines that "
        "count per draft position).")
    engine_metrics: str | None = Field(None, description="Where the engine_* figures came from (/metrics), or none.")
    engine_running_mean: float | None = Field(None, description="Requests the engine ran at once (its batch), mean.")
    engine_running_max: float | None = None
    engine_waiting_mean: float | None = Field(None, description="Requests queued in the engine, mean.")
    engine_waiting_max: float | None = None
    engine_kv_cache_mean: float | None = Field(None, description="KV-cache share in use (0-1), mean.")
    engine_kv_cache_max: float | None = None
    engine_preemptions: float | None = None
    engine_prefix_cache_hit_rate: float | None = Field(
        None, description="Share of the level's prompt tokens the engine found in its prefix cache (its /metrics).")
    cache_reset: str | None = Field(None, description="How the level kept caches from helping: the engine's reset "
                                    "endpoint, or unique prompts (where it has none).")
    engine_prompt_tokens: float | None = None
    engine_generation_tokens: float | None = None
    gpu_samples: int | None = Field(None, description="nvidia-smi readings taken while the level ran (its GPUs).")
    gpu_count: int | None = Field(None, description="GPUs of the server's that nvidia-smi reported.")
    gpu_utilization_mean_pct: float | None = Field(None, description="GPU utilisation, mean over its GPUs and readings.")
    gpu_utilization_max_pct: float | None = None
    gpu_memory_used_max_mib: float | None = Field(None, description="Most memory its GPUs held together (MiB).")
    gpu_power_mean_w: float | None = Field(None, description="Power draw of its GPUs together, mean (W).")
    gpu_energy_j: float | None = Field(None, description="Energy its GPUs drew over the measured span: the mean "
                                       "sampled power times the span's duration (J).")
    joules_per_output_token: float | None = Field(None, description="gpu_energy_j per output token of the level.")
    joules_per_accepted_token: float | None = Field(
        None, description="gpu_energy_j per accepted draft token (speculative configurations; per-request figures, "
        "else the engine's counters).")
    prompts_digest: str | None = Field(None, description="Hash of the level's prompt texts, in order.")
    prompt_source: str | None = Field(None, description="The prompt set: synthetic, mt-bench, humaneval, sharegpt, "
                                      "file or bundled.")
    endpoint: str | None = Field(None, description="completions, chat or generate.")
    ignore_eos: bool | None = Field(None, description="Outputs forced to their full length past the model's end.")
    temperature: float | None = None
    top_p: float | None = None
    stop_share: float | None = Field(None, description="Share of completed requests that ended at their natural end "
                                     "(finish_reason stop) rather than at max_tokens.")
    prompt_tokens_by: str | None = Field(None, description="How prompt lengths were counted: local, server, approximate.")
    client_cpu_s: float | None = None
    client_cpu_share: float | None = None
    client_loop_lag_p99_ms: float | None = None
    client_loop_lag_max_ms: float | None = None
    client_workers: int | None = None
    client_connections: int | None = None
    client_bottleneck: bool = False

    @property
    def throughput(self) -> float:
        """Output tok/s as a comparison counts it. At a concurrency level: while the full concurrency was in
        flight where the block had such a span, else over the whole block. At a request-rate level, where both
        configurations are sent the same requests at the same moments and deliver the same tokens as long as they
        keep up, the speed a request saw (``request_speed_tokens_per_s``): queueing, stalls and failures slow it."""
        if self.mode == "rate":
            return self.request_speed_tokens_per_s or 0.0
        if self.steady_output_tokens_per_s is not None and self.steady_output_tokens_per_s > 0:
            return self.steady_output_tokens_per_s
        return self.output_tokens_per_s

    @property
    def load(self) -> int | float | None:
        """The level's value in its mode: requests in flight (an int), or requests a second (a float)."""
        return self.concurrency if self.mode == "concurrency" else self.request_rate_per_s

    @property
    def level(self) -> Block:
        value = float(self.concurrency) if self.mode == "concurrency" and self.concurrency else self.request_rate_per_s
        return Block(index=self.level_index, mode=self.mode, value=value or 1.0, repeat=self.repeat)

    @property
    def label(self) -> str:
        return self.level.label


RunStatus = Literal["running", "completed", "failed", "cancelled"]

#: The environment a run was measured in, kept as the run row's own columns (the rest of its fingerprint as JSON);
#: runs that differ in one of them are not compared by accident.
FINGERPRINT_COLUMNS = ("gpu", "gpu_count", "driver", "engine_version", "model")


class RunRow(Row):
    """A run as stored (the ``runs`` dataset): one configuration measured on one host."""

    config_name: str
    engine: str = "unknown"
    status: RunStatus = "running"
    flow_run_id: str | None = None
    command: str | None = Field(None, description="The launch command, secrets masked.")
    host: str | None = None
    base_url: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    driver: str | None = None
    engine_version: str | None = None
    model: str | None = None
    fingerprint_json: str = "{}"
    workload_json: str = "{}"
    sweep_json: str = "{}"
    design: str | None = Field(None, description="How a comparison took its blocks: sequential, alternate-restart or "
                               "alternate-side-by-side; None outside comparisons.")
    decision_json: str | None = Field(None, description="The comparison's decision settings (margin, budget).")
    verifies: str | None = Field(None, description="The verify stage: the comparison whose recommendation this run "
                                 "measured ('<baseline run id>--<speculative run id>').")
    verify_arm: str | None = Field(None, description="The verify stage: off, on, schedule (the recommendation) or "
                                      "controller (the engine's own).")
    started_at: str | None = None
    ended_at: str | None = None
    time_to_ready_s: float | None = None
    error: str | None = None


class HistoryRow(Row):
    """A comparison's answer as the ``history`` dataset keeps it (``specsweep.analysis.history``): one row per
    comparison, so that tonight's answer can be read against last night's."""

    key: str = Field(description="What two comparable answers share (the kind, engine, model, draft, workload, "
                     "temperature and settings; not the engine version or driver), as a digest.")
    date: str = Field(description="When the comparison ended (ISO 8601, UTC).")
    baseline_run_id: str
    speculative_run_id: str
    flow_run_id: str | None = None
    host: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    driver: str | None = None
    engine: str = "unknown"
    engine_version: str | None = None
    model: str | None = None
    draft: str = Field("none", description="What the speculative configuration drafts: method, draft model, K.")
    workload: str = Field("", description="The prompt set and what of it was sent.")
    temperature: float = 0.0
    settings: str = Field("", description="The speculative configuration's launch command (secrets masked, port out).")
    status: str = ""
    off_from: int | None = Field(None, description="The threshold: speculation off from this concurrency (None: on).")
    worst_case_loss: float | None = None
    threshold_low: int | None = Field(None, description="The lowest threshold within the margin (None: past the "
                                      "last level).")
    threshold_high: int | None = Field(None, description="The highest threshold within the margin.")
    threshold_ranged: bool = Field(True, description="Whether the intervals bound a range of thresholds at all "
                                   "(False: none was bounded, or none fits; the range above then says nothing).")
    margin: float = 0.0
    levels_json: str = Field("[]", description="Per level: concurrency, ratio, its interval, verdict.")
    acceptance_json: str = Field("{}", description="Per category: accepted tokens per step, mean and spread over "
                                 "the levels.")


_ARROW: dict[type, pa.DataType] = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def _arrow_type(annotation: Any) -> pa.DataType:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _arrow_type(args[0])
    if origin is list:
        return pa.list_(_arrow_type(args[0]))
    if origin is Literal:
        return pa.string()
    if annotation in _ARROW:
        return _ARROW[annotation]
    raise TypeError(f"no Parquet type for {annotation!r}")


def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    """The Parquet schema of a row model, from its field annotations."""
    return pa.schema([pa.field(name, _arrow_type(f.annotation)) for name, f in model.model_fields.items()])
