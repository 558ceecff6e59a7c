"""A run's row kept as the run goes: written when it starts ("running") and when it ends, however it ends
(completed, failed, cancelled), with the environment it was measured in; a run an earlier try finished."""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any

from specsweep.records import BlockRow, RunRow, RunStatus
from specsweep.results.store import ResultsStore, now_iso


def describe_error(exc: BaseException) -> str:
    """An exception as the run row keeps it: its message and any notes added on the way out."""
    notes = getattr(exc, "__notes__", None) or []
    return "; ".join([str(exc) or type(exc).__name__, *notes])[:2000]

class RunRecorder:
    """Writes a run's row when it starts ("running") and when it ends, however it ends."""

    def __init__(self, store: ResultsStore, run_id: str, row: RunRow) -> None:
        self.store, self.run_id, self.row = store, run_id, row

    def update(self, **fields: Any) -> None:
        self.row = self.row.model_copy(update=fields)
        self.store.write_run(self.run_id, self.row)

    def record_fingerprint(self, fp: dict[str, Any]) -> None:
        """The environment: GPU, driver, engine version and model as columns, the rest as JSON."""
        fp = dict(fp)
        columns = {k: fp.pop(k, None) for k in ("gpu", "gpu_count", "driver", "engine_version", "model")}
        fp.pop("host", None)
        self.update(**columns, fingerprint_json=json.dumps(fp, sort_keys=True, default=str))

    def __enter__(self) -> RunRecorder:
        self.update(status="running", started_at=self.row.started_at or now_iso())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        status: RunStatus = "completed"
        if exc is not None:
            cancelled = exc_type is not None and (issubclass(exc_type, KeyboardInterrupt)
                                                  or exc_type.__name__ == "CancelledError")
            status = "cancelled" if cancelled else "failed"
        self.update(status=status, ended_at=now_iso(), error=describe_error(exc) if exc is not None else None)

def finished_run(store: ResultsStore, run_id: str) -> list[BlockRow] | None:
    """The levels of a run that completed (in an earlier try of the same flow run), else None."""
    if not store.has_run(run_id) or store.run(run_id).status != "completed":
        return None
    return store.level_rows(run_id)
