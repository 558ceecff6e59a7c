"""``specsweep runs``, ``report`` and ``compare``: what the results store holds, read back."""

from __future__ import annotations

from typing import Annotated, Any, Optional  # noqa: UP035 - typer reads Optional

import typer
from rich.table import Table

from specsweep.analysis.compare import compare_runs
from specsweep.analysis.decision import DecisionConfig
from specsweep.cli.app import app
from specsweep.cli.options import RESULTS_DEFAULT, Results, fail
from specsweep.errors import ConfigError, SpecsweepError
from specsweep.reports.tables import console, print_comparison, summary_table
from specsweep.results import ResultsStore


@app.command("runs")
def runs_cmd(results: Results = RESULTS_DEFAULT) -> None:
    """List the runs in the store."""
    store = ResultsStore(results)
    df = store.runs()
    if df.empty:
        typer.echo(f"no runs in {store}")
        return
    levels = store.levels()
    counts = levels.groupby("run_id").size().to_dict() if not levels.empty else {}
    table = Table(title=f"runs in {store}")
    for col in ("run id", "started", "configuration", "engine", "host", "levels", "status"):
        table.add_column(col)
    for _, r in df.sort_values("started_at").iterrows():
        table.add_row(str(r["run_id"]), str(r["started_at"]), str(r["config_name"]), str(r["engine"]),
                      str(r["host"]), str(counts.get(r["run_id"], 0)), str(r["status"]))
    console().print(table)


@app.command("report")
def report_cmd(
    run_ids: Annotated[Optional[list[str]], typer.Argument(help="Run ids; default the latest run.")] = None,
    results: Results = RESULTS_DEFAULT,
) -> None:
    """Print the per-level tables of runs, and compare them when two are given (baseline first)."""
    store = ResultsStore(results)
    try:
        if not run_ids:
            runs = store.runs()
            if runs.empty:
                raise ConfigError(f"no runs in {results}")
            run_ids = [str(runs.sort_values("started_at").iloc[-1]["run_id"])]
        for rid in run_ids:
            run = store.run(rid)
            console().print(summary_table(store.level_rows(rid), title=f"{run.config_name} — {rid} ({run.status})"))
        if len(run_ids) == 2:
            _compare(store, run_ids[0], run_ids[1], allow_mismatch=False, margin=None)
    except SpecsweepError as exc:
        fail(exc)


def _compare(store: ResultsStore, a: str, b: str, *, allow_mismatch: bool, margin: float | None) -> None:
    spec_run = store.run(b)
    decision = (DecisionConfig.model_validate_json(spec_run.decision_json) if spec_run.decision_json
                else DecisionConfig())
    update: dict[str, Any] = {"allow_mismatch": allow_mismatch or decision.allow_mismatch}
    if margin is not None:
        update["margin"] = margin
    # Plots (matplotlib) load with the commands that draw them, not with every command's start.
    from specsweep.reports.folders import write_comparison_report

    comp = compare_runs(store, a, b, decision=decision.model_copy(update=update))
    print_comparison(comp, console())
    urls = write_comparison_report(comp, store)
    typer.echo("report: " + ", ".join(urls.values()))


@app.command("history")
def history_cmd(
    kind: Annotated[Optional[str], typer.Option(
        help="Only this hardware kind (a part of its label, e.g. H100 or '8x NVIDIA H100').")] = None,
    plot: Annotated[Optional[str], typer.Option(help="Also draw the threshold and ratios over time into this PNG "
                                                "(one kind of comparison: give --kind when there are several).")] = None,
    results: Results = RESULTS_DEFAULT,
) -> None:
    """The answers of earlier comparisons, oldest first, by kind of comparison (hardware, engine, model, draft,
    workload): the threshold, its status and worst case, the ratio per level; and the drift of the latest."""
    from specsweep.analysis.history import drift, history_table, kind_label, last_comparable

    store = ResultsStore(results)
    rows = [r for r in store.history() if kind is None or kind.lower() in kind_label(r).lower()]
    if not rows:
        typer.echo(f"no comparisons in the history of {store}" + (f" for kind {kind!r}" if kind else ""))
        return
    by_key: dict[str, list[Any]] = {}
    for r in rows:
        by_key.setdefault(r.key, []).append(r)
    for key, group in by_key.items():
        last = group[-1]
        table = Table(title=f"{kind_label(last)} · {last.model or '?'} · {last.draft} · {last.workload} ({key})")
        lines = history_table(group)
        for col in lines[0]:
            table.add_column(col)
        for line in lines:
            table.add_row(*map(str, line.values()))
        console().print(table)
        if (before := last_comparable(group, last)) is not None:
            typer.echo(drift(before, last).summary())
    if plot:
        if len(by_key) > 1:
            fail(ConfigError(f"--plot draws one kind of comparison and the history holds {len(by_key)}: choose one "
                             "with --kind"))
        from specsweep.reports.plots import history_plot

        with open(plot, "wb") as f:
            f.write(history_plot(rows))
        typer.echo(f"plot: {plot}")


@app.command("compare")
def compare_cmd(
    baseline_run: Annotated[str, typer.Argument(help="Run id of the baseline.")],
    speculative_run: Annotated[str, typer.Argument(help="Run id of the speculative configuration.")],
    allow_mismatch: Annotated[bool, typer.Option(
        "--allow-mismatch", help="Compare even if GPU, driver, engine or model differ.")] = False,
    margin: Annotated[Optional[float], typer.Option(
        help="Margin (0.05: 5 %): the worst-case loss a decided setting may carry; default the run's own.")] = None,
    results: Results = RESULTS_DEFAULT,
) -> None:
    """Compare two stored runs: per-level verdicts, the answer, the engine's setting, the report folder."""
    try:
        _compare(ResultsStore(results), baseline_run, speculative_run, allow_mismatch=allow_mismatch, margin=margin)
    except SpecsweepError as exc:
        fail(exc)
