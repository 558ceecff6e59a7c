"""Tasks that describe results to people: the environment, artifacts, the comparison report."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prefect import task
from prefect.artifacts import acreate_link_artifact, acreate_markdown_artifact, acreate_table_artifact
from prefect.cache_policies import NO_CACHE

from specsweep.analysis.compare import Comparison, compare_runs
from specsweep.analysis.decision import DecisionConfig
from specsweep.analysis.history import Drift, drift, history_row, kind_label, last_comparable
from specsweep.analysis.recommend import level_words
from specsweep.analysis.tuning import GridPoint, Tuning, tune_runs
from specsweep.engines import PerBatchSetting
from specsweep.errors import DriftError
from specsweep.hosts import Host
from specsweep.records import BlockRow
from specsweep.reports.folders import write_comparison_report, write_tuning_report
from specsweep.reports.markdown import comparison_markdown, temperatures_markdown, tuning_markdown
from specsweep.reports.plots import comparison_plots, data_uri, history_plot, tuning_plot
from specsweep.results import ResultsStore, comparison_folder, now_iso, tuning_folder
from specsweep.server.fingerprint import host_fingerprint, server_fingerprint
from specsweep.sweep import BenchTarget, SweepJob
from tasks._common import artifact_key, run_logger

TABLE_COLUMNS = ["concurrency", "request_rate_per_s", "repeat", "completed", "failed", "output_tokens_per_s",
                 "peak_output_tokens_per_s", "ttft_ms_median", "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99",
                 "itl_ms_median", "e2e_ms_median", "spec_accept_length", "spec_acceptance_rate", "achieved_concurrency",
                 "client_bottleneck"]


@task(name="fingerprint_environment", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5)
async def fingerprint_environment(host: Host, target: BenchTarget) -> dict[str, Any]:
    """GPU model, count and driver from the host; engine version and model from the server."""
    fp = await asyncio.to_thread(host_fingerprint, host)
    async with target.api() as api:
        fp.update(await server_fingerprint(api, target.engine))
    run_logger().info("environment: %s", ", ".join(f"{k}={v}" for k, v in fp.items() if not k.startswith("server_")))
    return fp


@task(name="publish_configuration", cache_policy=NO_CACHE)
async def publish_configuration(job: SweepJob, host_label: str, rows: list[BlockRow]) -> None:
    """A table artifact of the configuration's levels, and a link to its data."""
    table = [{c: (round(v, 3) if isinstance(v := getattr(r, c), float) else v) for c in TABLE_COLUMNS} for r in rows]
    levels_url = job.store.location.url_of(f"levels/run_id={job.run_id}")
    await acreate_table_artifact(
        table=table, key=artifact_key(job.config_name, host_label, "levels"),
        description=f"{job.config_name} on {host_label}: one row per level (run {job.run_id}). Parquet: {levels_url}/",
    )
    await acreate_link_artifact(
        link=levels_url, link_text=f"{job.config_name} levels (Parquet, run {job.run_id})",
        key=artifact_key(job.config_name, host_label, "data"),
        description=f"Read with pandas.read_parquet('{job.store.url}/levels'); requests/ and runs/ lie beside it.",
    )


@task(name="compare_configurations", cache_policy=NO_CACHE)
async def compare_configurations(
    baseline_run_id: str,
    speculative_run_id: str,
    store: ResultsStore,
    decision: DecisionConfig,
) -> Comparison:
    """Compare the two runs from the store, write the report folder, publish the report."""
    logger = run_logger()
    comp = compare_runs(store, baseline_run_id, speculative_run_id, decision=decision)
    plots = comparison_plots(comp)
    urls = await asyncio.to_thread(write_comparison_report, comp, store, plots)
    images = "\n\n".join(f"![{name}]({data_uri(png)})" for name, png in plots.items())
    folder = store.location.url_of(comparison_folder(comp.baseline_run_id, comp.speculative_run_id))
    where = (f"### Data\n\n- levels: `{store.url}/levels/run_id={baseline_run_id}/` and `.../run_id={speculative_run_id}/`\n"
             f"- requests: `{store.url}/requests/` (same partitions)\n- runs: `{store.url}/runs/`\n"
             f"- this report and its plots: `{folder}/`\n"
             f"- read them: `pandas.read_parquet('{store.url}/levels')`")
    key = artifact_key("speculation", comp.host or "", comp.baseline, "vs", comp.speculative)
    await acreate_markdown_artifact(markdown=comparison_markdown(comp) + "\n\n### Plots\n\n" + images + "\n\n" + where,
                                    key=key, description=comp.summary[:500])
    await acreate_link_artifact(link=urls["report"], link_text="report.md (with the plots and engine settings beside it)",
                                key=artifact_key(key, "report"), description=comp.summary[:500])
    rec = comp.recommendation
    logger.info("%s", rec.decision)
    logger.info("comparison (%s): %s", rec.status, rec.reason)
    for lv in comp.levels:
        logger.info("  %s%s: %s, ratio %.3f [%s], %d/%d blocks", "C=" if comp.mode == "concurrency" else "",
                    level_words(lv.concurrency), lv.verdict, lv.ratio,
                    f"{lv.ratio_low:.3f}, {lv.ratio_high:.3f}" if lv.ratio_low and lv.ratio_high else "-", *lv.blocks)
    _log_engine_setting(comp.setting, folder)
    return comp


@task(name="record_history", cache_policy=NO_CACHE)
async def record_history(comp: Comparison, store: ResultsStore, decision: DecisionConfig,
                         temperature: float = 0.0) -> Drift | None:
    """The answer appended to the results' history, read against the last comparison of the same kind: the drift
    (and the history's plot) published; with ``decision.fail_on_drift`` a flagged drift fails this stage."""
    logger = run_logger()
    assert comp.baseline_run_id is not None and comp.speculative_run_id is not None
    if comp.mode != "concurrency":
        logger.info("history: a request-rate comparison is not kept in the history (its thresholds are concurrency "
                    "levels); its report holds the answer")
        return None
    base, spec = store.run(comp.baseline_run_id), store.run(comp.speculative_run_id)
    row = history_row(comp, base, spec, date=spec.ended_at or now_iso(), temperature=temperature)
    await asyncio.to_thread(store.append_history, row)
    rows = await asyncio.to_thread(store.history, row.key)
    before = last_comparable(rows, row)
    if before is None:
        logger.info("history: the first comparison of its kind in %s (%s)", store, kind_label(row))
        return None
    found = drift(before, row)
    plot = await asyncio.to_thread(history_plot, rows)
    lines = [f"### {'Drift' if found.flagged else 'No drift'} ({kind_label(row)}, {row.model or '?'})", found.summary(),
             "", "| | earlier | this run |", "| --- | --- | --- |",
             f"| date | {before.date[:16]} | {row.date[:16]} |", f"| engine | {before.engine_version} | {row.engine_version} |",
             f"| answer | {_threshold(before.off_from)} ({before.status}) | {_threshold(row.off_from)} ({row.status}) |",
             "", f"![history]({data_uri(plot)})"]
    await acreate_markdown_artifact(markdown="\n".join(lines), key=artifact_key("drift", row.key),
                                    description=found.summary()[:500])
    (logger.warning if found.flagged else logger.info)("history: %s", found.summary())
    if found.flagged and decision.fail_on_drift:
        raise DriftError(found.summary() + " (decision.fail_on_drift)")
    return found


def _threshold(off_from: int | None) -> str:
    return "keep it on" if off_from is None else f"off from {off_from}"


@task(name="publish_temperatures", cache_policy=NO_CACHE)
async def publish_temperatures(comparisons: dict[str, Comparison], baseline: str, speculative: str) -> str:
    """The answer at each temperature side by side (a markdown artifact and the log): acceptance falls as
    temperature rises, and with it where speculation pays."""
    markdown = temperatures_markdown(comparisons)
    host = next((c.host for c in comparisons.values() if c.host), "")
    await acreate_markdown_artifact(markdown=markdown, key=artifact_key("temperatures", host, baseline, "vs",
                                                                       speculative),
                                    description="the answer at each temperature")
    for t, comp in comparisons.items():
        run_logger().info("temperature %s: %s", t, comp.summary)
    return markdown


@task(name="publish_tuning", cache_policy=NO_CACHE)
async def publish_tuning(engine: str, baseline_run_id: str, point_runs: dict[str, str], points: list[GridPoint],
                         store: ResultsStore, decision: DecisionConfig,
                         skipped: dict[str, str] | None = None) -> Tuning:
    """The grid's answer from the store: the report folder, a markdown artifact, the log."""
    logger = run_logger()
    tuning = tune_runs(store, engine, baseline_run_id, point_runs, points, decision, skipped)
    plot = tuning_plot(tuning)
    urls = await asyncio.to_thread(write_tuning_report, tuning, store, plot)
    folder = store.location.url_of(tuning_folder(tuning.baseline_run_id))
    runs = ", ".join(f"`{r}`" for r in (baseline_run_id, *point_runs.values()))
    where = (f"### Data\n\n- levels: `{store.url}/levels/` (runs {runs})\n- this report: `{folder}/`\n"
             f"- read them: `pandas.read_parquet('{store.url}/levels')`")
    key = artifact_key("tuning", tuning.host or "", tuning.baseline)
    markdown = tuning_markdown(tuning) + f"\n\n![speedup]({data_uri(plot)})\n\n" + where
    await acreate_markdown_artifact(markdown=markdown, key=key, description=tuning.summary[:500])
    await acreate_link_artifact(link=urls["report"], link_text="report.md (the engine's settings beside it)",
                                key=artifact_key(key, "report"), description=tuning.summary[:500])
    logger.info("%s", tuning.recommendation.decision)
    logger.info("tuning (%s): %s", tuning.recommendation.status, tuning.summary)
    for lv in tuning.levels:
        logger.info("  C=%d: best %s (%s, x%.3f); %s", lv.concurrency, lv.best, lv.verdict, lv.ratio,
                    ", ".join(f"{k} x{p.ratio:.3f} {p.verdict}" for k, p in lv.points.items()))
    _log_engine_setting(tuning.setting, folder)
    return tuning


def _log_engine_setting(setting: PerBatchSetting | None, folder: str) -> None:
    """The answer in the engine's own form, and where the report is, in the run's log."""
    logger = run_logger()
    if setting is not None and setting.file_name is not None:
        logger.info("%s: %s (%s)", setting.file_name, json.dumps(setting.content), setting.flags)
    logger.info("report: %s", folder)
