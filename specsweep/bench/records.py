"""One row per request: raw monotonic timestamps and counts, never derived figures.

Timestamps are ``time.perf_counter()`` values (CLOCK_MONOTONIC, shared by all processes
on the machine). A failed, timed-out or cut-off request is a record with an error, kept
with whatever it received before the failure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class RequestRecord:
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
    spec_draft_tokens: int | None = None  # llama.cpp timings.draft_n
    spec_accepted_tokens: int | None = None  # llama.cpp timings.draft_n_accepted
    spec_verify_ct: int | None = None  # SGLang meta_info.spec_verify_ct
    response_id: str | None = None  # the server's id for the response (first event's "id")
    warmup: bool = False

    @property
    def ok(self) -> bool:
        return self.error_type is None

    def as_row(self) -> dict[str, Any]:
        return asdict(self)
