"""Tables for people: the per-level summary printed by the CLI and put in artifacts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


SUMMARY_COLUMNS = [
    ("level", None),
    ("ok/failed", None),
    ("output tok/s", "output_tokens_per_s"),
    ("peak tok/s", "peak_output_tokens_per_s"),
    ("req/s", "request_throughput_per_s"),
    ("TTFT p50 ms", "ttft_ms_median"),
    ("TTFT p99 ms", "ttft_ms_p99"),
    ("ITL p50 ms", "itl_ms_median"),
    ("TPOT p50 ms", "tpot_ms_median"),
    ("E2E p50 ms", "e2e_ms_median"),
    ("accept len", "spec_accept_length"),
    ("accept rate", "spec_acceptance_rate"),
    ("conc.", "achieved_concurrency"),
]


def level_label(row: dict[str, Any]) -> str:
    if row.get("concurrency") is not None and row.get("mode", "concurrency") == "concurrency":
        return f"C={int(row['concurrency'])}"
    return f"{row.get('request_rate_per_s'):g} req/s"


def summary_rows(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        cells = []
        for name, key in SUMMARY_COLUMNS:
            if name == "level":
                label = level_label(r)
                if r.get("repeat"):
                    label += f" #{r['repeat']}"
                cells.append(label + (" (client-bound)" if r.get("client_bottleneck") else ""))
            elif name == "ok/failed":
                cells.append(f"{r.get('completed', 0)}/{r.get('failed', 0)}")
            else:
                cells.append(_fmt(r.get(key), 2 if key and key.startswith("spec") else 1))
        out.append(cells)
    return out


def summary_table(rows: Sequence[dict[str, Any]], title: str = ""):  # type: ignore[no-untyped-def]
    from rich.table import Table

    table = Table(title=title)
    for name, _ in SUMMARY_COLUMNS:
        table.add_column(name, justify="left" if name == "level" else "right")
    for cells in summary_rows(rows):
        table.add_row(*cells)
    return table


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def summary_markdown(rows: Sequence[dict[str, Any]]) -> str:
    return markdown_table([n for n, _ in SUMMARY_COLUMNS], summary_rows(rows))
