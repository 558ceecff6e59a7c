"""The results store: three Parquet datasets under one root, partitioned by run id.

    <root>/runs/run_id=<id>/run.parquet            one row per run (RunRow)
    <root>/levels/run_id=<id>/<level>.parquet      one row per level and repeat (BlockRow)
    <root>/requests/run_id=<id>/<level>.parquet    one row per request (RequestRow)
    <root>/history/identity=<key>/<date>-<run>.parquet  one row per comparison (HistoryRow), by what makes two comparable
    <root>/reports/<name>/                         comparison reports: report.md, plots, engine configs

The root is a local folder or a filesystem URL (``specsweep.results.location``). Read the datasets
with ``pandas.read_parquet("<root>/levels")`` (``storage_options``/``filesystem`` for a
remote root) or DuckDB (``read_parquet('<root>/levels/*/*.parquet', hive_partitioning=true)``).
Each file is written whole and atomically, so a reader never sees half a file and a crash
loses at most the level in progress. A level's requests are written before its level
row, so a level row always has its requests.
"""

from __future__ import annotations

import io
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specsweep.errors import StoreError
from specsweep.records import BlockRow, HistoryRow, RequestRow, Row, RunRow, arrow_schema
from specsweep.results.location import DEFAULT_ROOT, ResultsLocation

_SCHEMAS = {RunRow: arrow_schema(RunRow), BlockRow: arrow_schema(BlockRow), RequestRow: arrow_schema(RequestRow)}


def to_table(rows: Sequence[Row]) -> pa.Table:
    """Typed rows to an Arrow table with the schema of their model."""
    model = type(rows[0])
    return pa.Table.from_pylist([r.to_record() for r in rows], schema=_SCHEMAS.get(model) or arrow_schema(model))


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


class ResultsStore:
    def __init__(self, where: ResultsLocation | str | Path = DEFAULT_ROOT) -> None:
        self.where = where if isinstance(where, ResultsLocation) else ResultsLocation(url=str(where))
        self.location = self.where.open()

    @property
    def url(self) -> str:
        """Where the store is, for people: a file:// URL or the remote URL."""
        return self.location.url

    @property
    def local_root(self) -> Path | None:
        """The root as a local path, or None for a remote store."""
        return Path(self.location.base) if self.location.local else None

    def __str__(self) -> str:
        return str(self.local_root) if self.local_root else self.url

    # -- writing ----------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Fail early, before a server is started, when the results location cannot be written."""
        self.location.check_writable()

    def write_run(self, run_id: str, row: RunRow) -> None:
        self.location.write_bytes(f"runs/run_id={run_id}/run.parquet", _parquet_bytes(to_table([row])))

    def write_level(self, run_id: str, level_key: str, row: BlockRow, requests: Sequence[RequestRow]) -> None:
        if requests:
            self.location.write_bytes(f"requests/run_id={run_id}/{level_key}.parquet", _parquet_bytes(to_table(requests)))
        self.location.write_bytes(f"levels/run_id={run_id}/{level_key}.parquet", _parquet_bytes(to_table([row])))

    def write_level_row(self, run_id: str, level_key: str, row: BlockRow) -> None:
        """A level's row again (its requests unchanged): a block set aside after it was stored. A row stored
        already as it is (a retry judging a block its first try judged) is left as it was."""
        rel, data = f"levels/run_id={run_id}/{level_key}.parquet", _parquet_bytes(to_table([row]))
        try:
            if self.location.exists(rel) and self.location.read_bytes(rel) == data:
                return
        except StoreError:
            pass  # not read back: written again
        self.location.write_bytes(rel, data)

    def append_history(self, row: HistoryRow) -> None:
        """One comparison's answer, appended to the history dataset (a file of its own: nothing is rewritten)."""
        # Named by the comparison's runs: a retried flow run writes its row again in place, never twice.
        name = f"{row.baseline_run_id}--{row.speculative_run_id}.parquet"
        self.location.write_bytes(f"history/identity={row.key}/{name}", _parquet_bytes(to_table([row])))

    def history(self, key: str | None = None) -> list[HistoryRow]:
        """The history rows (of one key, or all), oldest first."""
        keys = [key] if key else [d.split("=", 1)[1] for d in self.location.list_dirs("history") if d.startswith("identity=")]
        rows = []
        for k in keys:
            for rel in self.location.list_files(f"history/identity={k}", ".parquet"):
                with self.location.fs.open_input_file(self.location.path(rel)) as f:
                    rows += [HistoryRow.from_record(r) for r in pq.read_table(f).to_pylist()]
        return sorted(rows, key=lambda r: r.date)

    def write_file(self, relative: str, data: bytes) -> str:
        """Any other file under the root (reports, plots); returns its URL."""
        self.location.write_bytes(relative, data)
        return self.location.url_of(relative)

    # -- reading ----------------------------------------------------------------------------

    def _tables(self, name: str, run_id: str) -> list[pa.Table]:
        tables = []
        for rel in self.location.list_files(f"{name}/run_id={run_id}", ".parquet"):
            with self.location.fs.open_input_file(self.location.path(rel)) as f:
                tables.append(pq.read_table(f))
        return tables

    def run_ids(self, name: str = "runs") -> list[str]:
        """The run ids a dataset holds (from its partition folders; nothing is read)."""
        return [d.split("=", 1)[1] for d in self.location.list_dirs(name) if d.startswith("run_id=")]

    def _read(self, name: str, run_ids: Sequence[str] | None = None) -> pd.DataFrame:
        ids = list(run_ids) if run_ids else self.run_ids(name)
        frames = []
        for rid in ids:
            for table in self._tables(name, rid):
                df = table.to_pandas()
                df.insert(0, "run_id", rid)
                frames.append(df)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def runs(self) -> pd.DataFrame:
        return self._read("runs")

    def run(self, run_id: str) -> RunRow:
        tables = self._tables("runs", run_id)
        if not tables:
            raise StoreError(f"run {run_id!r} is not in {self}: list runs with 'specsweep runs'")
        return RunRow.from_record(tables[0].to_pylist()[0])

    def has_run(self, run_id: str) -> bool:
        return bool(self.location.list_files(f"runs/run_id={run_id}", ".parquet"))

    def levels(self, run_ids: Sequence[str] | None = None) -> pd.DataFrame:
        df = self._read("levels", run_ids)
        if not df.empty and "level_index" in df.columns:
            df = df.sort_values(["run_id", "level_index", "repeat"]).reset_index(drop=True)
        return df

    def level_rows(self, run_id: str) -> list[BlockRow]:
        """A run's levels as typed rows, in sweep order."""
        rows = [BlockRow.from_record(r) for t in self._tables("levels", run_id) for r in t.to_pylist()]
        return sorted(rows, key=lambda r: (r.level_index, r.repeat))

    def level_row(self, run_id: str, level_key: str) -> BlockRow | None:
        """One stored level of a run, or None when it was not stored (whole: a level is written last)."""
        rel = f"levels/run_id={run_id}/{level_key}.parquet"
        if not self.location.exists(rel):
            return None
        with self.location.fs.open_input_file(self.location.path(rel)) as f:
            rows = pq.read_table(f).to_pylist()
        return BlockRow.from_record(rows[0]) if rows else None

    def requests(self, run_ids: Sequence[str]) -> pd.DataFrame:
        return self._read("requests", run_ids)

    def request_fields(self, run_id: str, columns: Sequence[str]) -> list[dict[str, Any]]:
        """Some columns of a run's requests, one dict per request (the rest, such as chunk times, not read)."""
        out: list[dict[str, Any]] = []
        for rel in self.location.list_files(f"requests/run_id={run_id}", ".parquet"):
            with self.location.fs.open_input_file(self.location.path(rel)) as f:
                names = set(pq.read_schema(f).names)
                f.seek(0)
                out += pq.read_table(f, columns=[c for c in columns if c in names]).to_pylist()
        return out


def comparison_folder(baseline_run_id: str | None, speculative_run_id: str | None) -> str:
    """Where a comparison's report lies under the root."""
    return f"reports/{baseline_run_id}--{speculative_run_id}"


def tuning_folder(baseline_run_id: str) -> str:
    """Where a grid's report lies under the root."""
    return f"reports/tune-{baseline_run_id}"


def new_run_id(config_name: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    safe = "".join(c if c.isalnum() or c in "-." else "-" for c in config_name)[:40]
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
