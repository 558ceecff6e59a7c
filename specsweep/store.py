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
        return self._write(pa.Table.from_pylist([row]), self.root / "runs" / f"run_id={run_id}" / "run.parquet")

    def write_level(self, run_id: str, level_key: str, level_row: dict[str, Any], request_rows: Sequence[dict[str, Any]]) -> Path:
        req = [{k: v for k, v in r.items() if k != "run_id"} for r in request_rows]
        self._write(pa.Table.from_pylist(req) if req else pa.table({}),
                    self.root / "requests" / f"run_id={run_id}" / f"{level_key}.parquet")
        row = {k: v for k, v in level_row.items() if k != "run_id"}
        return self._write(pa.Table.from_pylist([row]), self.root / "levels" / f"run_id={run_id}" / f"{level_key}.parquet")

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


