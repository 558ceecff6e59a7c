"""The results store: three Parquet datasets under one root, partitioned by run id.

    <root>/runs/run_id=<id>/run.parquet            one row per run
    <root>/levels/run_id=<id>/<level>.parquet      one row per level and repeat
    <root>/requests/run_id=<id>/<level>.parquet    one row per request

Read them with ``pandas.read_parquet(root / "levels")`` or DuckDB
(``read_parquet('<root>/levels/*/*.parquet', hive_partitioning=true)``). Each file is
written whole to a hidden temporary name and renamed into place, so a reader never sees
half a file (readers skip names starting with '.'), and a crash loses at most the level
in progress. A level's requests are written before its level row, so a level row always
has its requests.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specsweep.errors import StoreError

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "data" / "results"


_F, _I, _S, _B = pa.float64(), pa.int64(), pa.string(), pa.bool_()
# Columns that can be empty (None) in one file and set in another: a fixed type for each,
# so the files of a dataset always share one schema and read back together.
COLUMN_TYPES: dict[str, pa.DataType] = {
    # runs
    "flow_run_id": _S, "config_name": _S, "engine": _S, "command": _S, "host": _S, "base_url": _S, "gpu": _S,
    "gpu_count": _I, "driver": _S, "engine_version": _S, "model": _S, "fingerprint_json": _S, "workload_json": _S,
    "sweep_json": _S, "started_at": _S, "ended_at": _S, "status": _S, "time_to_ready_s": _F, "error": _S,
    # levels
    "level_index": _I, "mode": _S, "concurrency": _I, "request_rate_per_s": _F, "repeat": _I, "spec_source": _S,
    "spec_acceptance_rate": _F, "spec_accept_length": _F, "errors": _S, "output_tokens_source": _S,
    "client_loop_lag_p99_ms": _F, "client_loop_lag_max_ms": _F, "client_cpu_s": _F, "client_cpu_share": _F,
    "client_workers": _I, "client_connections": _I, "client_bottleneck": _B, "input_tokens_exact": _B,
    # requests
    "index": _I, "scheduled_s": _F, "sent_s": _F, "first_token_s": _F, "last_token_s": _F, "end_s": _F,
    "prompt_tokens": _I, "prompt_tokens_exact": _B, "output_tokens": _I, "chunk_times_s": pa.list_(_F),
    "chunk_tokens": pa.list_(_I), "status_code": _I, "error_type": _S, "error_message": _S, "spec_draft_tokens": _I,
    "spec_accepted_tokens": _I, "spec_verify_ct": _I, "response_id": _S, "warmup": _B, "ttft_ms": _F, "e2e_ms": _F,
    "tpot_ms": _F, "send_delay_ms": _F, "level_value": _F,
}
_STAT_COLUMN = ("_ms_mean", "_ms_median", "_ms_p90", "_ms_p99", "_per_s", "duration_s", "achieved_concurrency")


def _column_type(name: str) -> pa.DataType | None:
    if name in COLUMN_TYPES:
        return COLUMN_TYPES[name]
    return _F if name.endswith(_STAT_COLUMN) else None


def to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows to an Arrow table whose nullable columns have fixed types."""
    table = pa.Table.from_pylist(list(rows))
    fields = []
    for f in table.schema:
        want = _column_type(f.name)
        fields.append(pa.field(f.name, want) if want is not None and f.type != want else f)
    return table.cast(pa.schema(fields))


def new_run_id(config_name: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe = "".join(c if c.isalnum() or c in "-." else "-" for c in config_name)[:40]
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


class ResultsStore:
    def __init__(self, root: Path | str = DEFAULT_ROOT) -> None:
        self.root = Path(root)

    # -- writing ----------------------------------------------------------------------------

    def _write(self, table: pa.Table, path: Path) -> Path:
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            raise StoreError(
                f"cannot write results to {path}: {exc.strerror or exc}. Earlier results are intact; "
                "free space or fix permissions on the results folder (or choose another with --results)."
            ) from None
        return path

    def check_writable(self) -> None:
        """Fail early, before a server is started, when the results folder cannot be written."""
        probe = self.root / f".write-probe-{os.getpid()}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            raise StoreError(f"the results folder {self.root} is not writable: {exc.strerror or exc}") from None

    def write_run(self, run_id: str, row: dict[str, Any]) -> Path:
        row = {k: v for k, v in row.items() if k != "run_id"}
        return self._write(to_table([row]), self.root / "runs" / f"run_id={run_id}" / "run.parquet")

    def write_level(self, run_id: str, level_key: str, level_row: dict[str, Any], request_rows: Sequence[dict[str, Any]]) -> Path:
        req = [{k: v for k, v in r.items() if k != "run_id"} for r in request_rows]
        if req:
            self._write(to_table(req), self.root / "requests" / f"run_id={run_id}" / f"{level_key}.parquet")
        row = {k: v for k, v in level_row.items() if k != "run_id"}
        return self._write(to_table([row]), self.root / "levels" / f"run_id={run_id}" / f"{level_key}.parquet")

    # -- reading ----------------------------------------------------------------------------

    def _read(self, name: str, run_ids: Sequence[str] | None = None) -> pd.DataFrame:
        base = self.root / name
        if run_ids:
            frames = []
            for rid in run_ids:
                d = base / f"run_id={rid}"
                files = sorted(p for p in d.glob("*.parquet") if not p.name.startswith("."))
                for f in files:
                    df = pd.read_parquet(f)
                    df.insert(0, "run_id", rid)
                    frames.append(df)
            return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if not base.exists() or not any(base.glob("run_id=*/*.parquet")):
            return pd.DataFrame()
        df = pd.read_parquet(base)
        df["run_id"] = df["run_id"].astype(str)
        return df

    def runs(self) -> pd.DataFrame:
        return self._read("runs")

    def run(self, run_id: str) -> dict[str, Any]:
        df = self._read("runs", [run_id])
        if df.empty:
            raise StoreError(f"run {run_id!r} is not in {self.root}: list runs with 'specsweep runs'")
        return df.iloc[0].to_dict()

    def levels(self, run_ids: Sequence[str] | None = None) -> pd.DataFrame:
        df = self._read("levels", run_ids)
        if not df.empty and "level_index" in df.columns:
            df = df.sort_values(["run_id", "level_index", "repeat"]).reset_index(drop=True)
        return df

    def requests(self, run_ids: Sequence[str]) -> pd.DataFrame:
        return self._read("requests", run_ids)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def epoch_iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


