"""What every level of a run shares: where requests go (``BenchTarget``), which run and store (``SweepJob``),
and the levels in the order they are measured."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from specsweep import engines
from specsweep.bench.config import RequestSpec, SweepConfig, WorkloadConfig
from specsweep.records import Block, Mode, RunRow
from specsweep.results import ResultsStore, now_iso
from specsweep.server.api import ServerAPI


class BenchTarget(BaseModel):
    """Where and how to send requests."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="Server address, e.g. http://127.0.0.1:30000.", pattern=r"^https?://[^\s/]+")
    request: RequestSpec = Field(default_factory=RequestSpec, description="Endpoint, API key, sampling.")
    engine: str = Field(engines.CUSTOM, description="The engine behind the URL (what its requests ask for, what its "
                        "answers carry).")
    #: What the server said of its optional endpoints (its /tokenize form, its cache reset), learnt once per target:
    #: every block's ServerAPI shares it instead of asking again (and waiting again on one that never answers).
    _known: dict[str, Any] = PrivateAttr(default_factory=dict)

    def api(self) -> ServerAPI:
        return ServerAPI(self.base_url, self.request.api_key, known=self._known)

@dataclass(frozen=True)
class SweepJob:
    """What every level of one run shares: which run, where it is stored, what to send. ``own_prompts``: this
    configuration shares its servers with others measured beside it (the verify stage's router, on the fixed
    policies' servers), so its prompts carry a mark of their own (``sweep.prompts.marked``)."""

    run_id: str
    config_name: str
    store: ResultsStore
    workload: WorkloadConfig
    sweep: SweepConfig
    own_prompts: bool = False

@dataclass(frozen=True)
class Level:
    """A level of the sweep before its blocks: where it stands, closed or open loop, how much load."""

    index: int
    mode: Mode
    value: float

    def block(self, repeat: int) -> Block:
        return Block(index=self.index, mode=self.mode, value=self.value, repeat=repeat)

    @property
    def label(self) -> str:
        return self.block(0).label

def sweep_levels(sweep: SweepConfig) -> list[Level]:
    """The sweep's levels in the order they are measured."""
    return [Level(i, mode, value) for i, (mode, value) in enumerate(sweep.levels())]  # type: ignore[arg-type]


def new_run_row(*, config_name: str, engine: str, job: SweepJob, host: str, base_url: str | None = None,
                command: str | None = None, flow_run_id: str | None = None, design: str | None = None,
                decision: BaseModel | None = None, verifies: tuple[str, str] | None = None) -> RunRow:
    """``verifies``: (comparison, arm) for a run of the verify stage."""
    return RunRow(config_name=config_name, engine=engine, command=command, host=host, base_url=base_url,
                  flow_run_id=flow_run_id, workload_json=job.workload.model_dump_json(),
                  sweep_json=job.sweep.model_dump_json(), design=design,
                  decision_json=decision.model_dump_json() if decision is not None else None, started_at=now_iso(),
                  verifies=verifies[0] if verifies else None, verify_arm=verifies[1] if verifies else None)
