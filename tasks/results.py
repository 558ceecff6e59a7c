"""Tasks that describe results to people: run records, artifacts, the comparison report."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.cache_policies import NO_CACHE

from specsweep.compare import Comparison, check_fingerprints, compare_levels, comparison_markdown, speculative_tokens_from_command
from specsweep.fingerprint import host_fingerprint, server_fingerprint
from specsweep.hosts.config import HostConfig, build_host
from specsweep.plots import comparison_plots, data_uri
from specsweep.store import ResultsStore
from tasks._common import run_logger


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes only."""
    key = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return re.sub(r"-{2,}", "-", key)[:100] or "specsweep"


@task(name="fingerprint_environment", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5)
async def fingerprint_environment(host: HostConfig, base_url: str) -> dict[str, Any]:
    """GPU model, count and driver from the host; engine version and model from the server."""
    def from_host() -> dict[str, Any]:
        with build_host(host) as h:
            return host_fingerprint(h)

    fp = await asyncio.to_thread(from_host)
    fp.update(await server_fingerprint(base_url))
    run_logger().info("environment: %s", ", ".join(f"{k}={v}" for k, v in fp.items() if not k.startswith("server_")))
    return fp


@task(name="publish_configuration", cache_policy=NO_CACHE)
async def publish_configuration(config_name: str, run_id: str, rows: list[dict[str, Any]], results_dir: str) -> None:
    """A table artifact of the configuration's levels, and where its data lies."""
    cols = ["concurrency", "request_rate_per_s", "repeat", "completed", "failed", "output_tokens_per_s",
            "peak_output_tokens_per_s", "ttft_ms_median", "ttft_ms_p99", "itl_ms_median", "itl_ms_p99", "tpot_ms_median",
            "e2e_ms_median", "spec_accept_length", "spec_acceptance_rate", "achieved_concurrency", "client_bottleneck"]
    table = [{c: (round(r[c], 3) if isinstance(r.get(c), float) else r.get(c)) for c in cols} for r in rows]
    await acreate_table_artifact(
        table=table, key=artifact_key(config_name, "levels"),
        description=f"{config_name}: one row per level (run {run_id}). Parquet: {Path(results_dir).resolve()}/levels/run_id={run_id}/",
    )


@task(name="compare_configurations", cache_policy=NO_CACHE)
async def compare_configurations(
    baseline_run_id: str,
    speculative_run_id: str,
    results_dir: str,
    allow_mismatch: bool = False,
) -> Comparison:
    """Compare the two runs from the store, write the plots, publish the report."""
    logger = run_logger()
    store = ResultsStore(results_dir)
    base_run, spec_run = store.run(baseline_run_id), store.run(speculative_run_id)
    diffs = check_fingerprints(base_run, spec_run, allow_mismatch)
    comp = compare_levels(store.levels([baseline_run_id]), store.levels([speculative_run_id]),
                          baseline_name=str(base_run["config_name"]), speculative_name=str(spec_run["config_name"]),
                          num_speculative_tokens=speculative_tokens_from_command(spec_run.get("command")))
    if diffs:
        comp.notes.append("Compared despite different environments: " + "; ".join(diffs))
    plot_dir = Path(results_dir) / "plots" / f"{baseline_run_id}--{speculative_run_id}"
    plots = await asyncio.to_thread(comparison_plots, comp, plot_dir)
    report = comparison_markdown(comp)
    (plot_dir / "report.md").write_text(report + "\n")
    images = "\n\n".join(f"![{name}]({data_uri(path)})" for name, path in plots.items())
    root = Path(results_dir).resolve()
    where = (f"### Data\n\n- levels: `{root}/levels/run_id={baseline_run_id}/` and `.../run_id={speculative_run_id}/`\n"
             f"- requests: `{root}/requests/` (same partitions)\n- runs: `{root}/runs/`\n"
             f"- plots and this report: `{plot_dir.resolve()}/`\n"
             f"- read them: `pandas.read_parquet('{root}/levels')`")
    await acreate_markdown_artifact(
        markdown=report + "\n\n### Plots\n\n" + images + "\n\n" + where,
        key=artifact_key("speculation-comparison"),
        description=comp.recommendation,
    )
    logger.info("comparison: %s", comp.recommendation)
    logger.info("crossover: %s; vLLM num_speculative_tokens_per_batch_size: %s; router: %s",
                comp.crossover, comp.vllm_num_speculative_tokens_per_batch_size, comp.router)
    logger.info("plots and report: %s", plot_dir.resolve())
    return comp

