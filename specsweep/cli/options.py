"""What several commands take, declared once: options, and the readers of their values."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional  # noqa: UP035 - typer reads Optional

import typer
from pydantic import ValidationError

from specsweep.errors import ConfigError
from specsweep.hosts import HostConfig
from specsweep.profiles import describe_validation_error, read_mapping
from specsweep.results import DEFAULT_ROOT

Levels = Annotated[str, typer.Option("--concurrency", "--levels", help="Concurrency levels, comma-separated.")]
NumPrompts = Annotated[int, typer.Option("--num-prompts", help="Measured requests per level (per block).")]
InputLen = Annotated[int, typer.Option("--input-len", help="Prompt length in tokens (synthetic prompts).")]
OutputLen = Annotated[int, typer.Option("--output-len", help="Tokens to generate per request.")]
Dataset = Annotated[str, typer.Option(
    help="synthetic (generated words: not real traffic), mt-bench, humaneval, sharegpt, file or bundled.")]
PromptsFile = Annotated[Optional[Path], typer.Option(
    help="JSONL (prompts or chat messages) or Parquet (with --dataset file); ShareGPT JSON (sharegpt).")]
Temperatures = Annotated[Optional[str], typer.Option(
    "--temperatures", "--temperature", help="A sampling temperature, or several comma-separated: one comparison at "
    "each (default: 0 alone).")]
RequestRates = Annotated[Optional[str], typer.Option(
    "--request-rate", help="Request rates a second, comma-separated, in place of --concurrency: open-loop levels "
    "(Poisson arrivals, or a trace file's own gaps scaled), compared by the speed a request saw.")]
Search = Annotated[Optional[str], typer.Option(
    help="MIN:MAX: let the comparison choose its levels between these (both ends, then where speculation stops "
    "paying), in place of --concurrency.")]
BudgetMinutes = Annotated[Optional[float], typer.Option(
    help="The run's time budget in minutes: a search stops within it; the plan at the start says what it buys.")]
Results = Annotated[str, typer.Option("--results", help="Results root (Parquet): a folder or a URL.")]
HostFile = Annotated[Optional[Path], typer.Option(
    "--host-config", help="Host file (JSON or TOML, as the flows' host parameter). Default: this machine.")]
Margin = Annotated[float, typer.Option("--margin", help="The worst-case loss a setting may carry and be decided "
                                       "(0.05: 5 %); ratios within ±margin count as equivalent.")]
Design = Annotated[str, typer.Option(help="alternate: baseline and speculative blocks in turn; sequential: one "
                                     "configuration, then the other.")]
SloTtft = Annotated[Optional[float], typer.Option(
    "--slo-ttft-p99-ms", help="Latency target: p99 time to first token (ms); the answer then gives each "
    "configuration's capacity within the targets and its goodput.")]
SloTpot = Annotated[Optional[float], typer.Option(
    "--slo-tpot-p99-ms", help="Latency target: p99 time per output token (ms).")]
Budget = Annotated[int, typer.Option("--max-requests-per-level",
                                     help="Budget: measured requests per level and configuration.")]
RESULTS_DEFAULT = str(DEFAULT_ROOT)


def number(text: str) -> int | float:
    """An integer where the text is one, else a float."""
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else float(text)


def numbers(text: str | None, kind: Callable[[str], Any], name: str) -> list[Any] | None:
    """A comma-separated list of numbers (``1,8,64``), or None; a ConfigError naming the option otherwise."""
    if text is None:
        return None
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{name} must be a comma-separated list of numbers, like 1,8,64 (got {text!r})") from None
    if not values:
        raise ConfigError(f"{name} is empty: give a comma-separated list of numbers, like 1,8,64")
    return values


def host_config(path: Path | None, overrides: dict[str, Any] | None = None) -> HostConfig:
    """The host from a file (and overrides), validated; this machine without one."""
    data: dict[str, Any] = read_mapping(path) if path else {}
    data.update(overrides or {})
    try:
        return HostConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "host config")) from None


def setup_logging(verbose: bool = True) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)-7s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("paramiko").setLevel(logging.WARNING)


def fail(exc: BaseException) -> NoReturn:
    """The error on stderr and the exit code: 2 for bad input, 1 otherwise."""
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(2 if isinstance(exc, ConfigError) else 1)
