"""The engine's own Prometheus ``/metrics`` around and during a level.

Each engine names the same things its own way (its module lists its names); ``snapshot`` reads a
page into one vocabulary:

    gauges    running, waiting (requests), kv_cache (fraction used), prefix_cache_hit_rate
    counters  preemptions, prompt_tokens, generation_tokens, spec_drafts, spec_draft_tokens,
              spec_accepted_tokens, spec_accepted_pos<i> (accepted tokens per draft position),
              prefix_cache_queries, prefix_cache_hits (prompt tokens looked up, found)

Where one engine serves a quantity under two names at once, the first name listed is taken.
Counters are cumulative over the server's life: a level's figure is the difference of the
readings at its start and end, never one reading. Gauges move within a level, so they are
sampled while it runs (``Sampler``): the running batch it reached is what per-batch-size
speculation settings key on. Values are summed over label sets (several engines of one
server), except the draft position.
"""

from __future__ import annotations

import asyncio
import math
import re
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from specsweep import engines
from specsweep.server.periodic import Periodic

GAUGE_KEYS = ("running", "waiting", "kv_cache", "prefix_cache_hit_rate")
COUNTER_KEYS = ("preemptions", "prompt_tokens", "generation_tokens", "spec_drafts", "spec_draft_tokens",
                "spec_accepted_tokens", "prefix_cache_queries", "prefix_cache_hits")


def _vocabulary() -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]], tuple[str, ...]]:
    """Each key's names over every engine (``specsweep.engines``: each engine lists its own)."""
    gauges: dict[str, tuple[str, ...]] = {k: () for k in GAUGE_KEYS}
    counters: dict[str, tuple[str, ...]] = {k: () for k in COUNTER_KEYS}
    positions: tuple[str, ...] = ()
    for names in engines.metric_names():
        for key, listed in names.gauges.items():
            gauges[key] += listed
        for key, listed in names.counters.items():
            counters[key] += listed
        positions += names.per_position
    return gauges, counters, positions


GAUGES, COUNTERS, PER_POSITION = _vocabulary()
_NAMES = {name: key for key, names in (GAUGES | COUNTERS).items() for name in names}
_PRIORITY = {name: i for names in (GAUGES | COUNTERS).values() for i, name in enumerate(names)}
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POSITION = re.compile(r'position="(\d+)"')


def snapshot(text: str) -> dict[str, float]:
    """A Prometheus text page in specsweep's vocabulary (see the module's docstring); names the page
    does not have are absent."""
    by_name: dict[tuple[str, str], float] = {}  # (key, metric name) -> summed over label sets
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels, raw = m.groups()
        if name in PER_POSITION:
            pos = _POSITION.search(labels or "")
            key = f"spec_accepted_pos{pos.group(1)}" if pos else None
        else:
            key = _NAMES.get(name)
        if key is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isfinite(value):
            by_name[key, name] = by_name.get((key, name), 0.0) + value
    # A quantity that a version of an engine serves under two names at once (an old name beside its
    # new one) is taken once: from the name listed first.
    out: dict[str, float] = {}
    for (key, _name), value in sorted(by_name.items(), key=lambda kv: _PRIORITY.get(kv[0][1], 0)):
        out.setdefault(key, value)
    return out


def is_counter(key: str) -> bool:
    return key in COUNTERS or key.startswith("spec_accepted_pos")


def differences(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each counter's growth over a level (a counter that went down means the server restarted: left out)."""
    return {k: after[k] - before.get(k, 0.0) for k in after
            if is_counter(k) and after[k] >= before.get(k, 0.0)}


@dataclass
class Samples:
    """Gauge readings taken while a level ran: (wall-clock time, snapshot)."""

    pages: list[tuple[float, str]] = field(default_factory=list)  # (wall-clock time, the page as read)

    @property
    def readings(self) -> list[tuple[float, dict[str, float]]]:
        """The gauges of each page that has any. Pages are read into the vocabulary only here, after the
        level: while it runs, the reading costs the client's event loop one request and nothing more."""
        parsed = [(t, {k: v for k, v in snapshot(text).items() if k in GAUGES}) for t, text in self.pages]
        return [(t, gauges) for t, gauges in parsed if gauges]

    def within(self, start: float, end: float) -> list[dict[str, float]]:
        return [s for t, s in self.readings if start <= t <= end]


def level_figures(before: dict[str, float], after: dict[str, float],
                  during: list[dict[str, float]]) -> dict[str, Any]:
    """A level's engine figures as stored in its row: counters as differences, gauges as mean and
    maximum over the readings taken while it ran (none when no reading fell inside it: the end reading
    would show the engine idle)."""
    diff = differences(before, after)
    out: dict[str, Any] = {
        "engine_preemptions": diff.get("preemptions"),
        "engine_prompt_tokens": diff.get("prompt_tokens"),
        "engine_generation_tokens": diff.get("generation_tokens"),
        "spec_drafts": diff.get("spec_drafts"),
        "spec_draft_tokens": diff.get("spec_draft_tokens"),
        "spec_accepted_tokens": diff.get("spec_accepted_tokens"),
    }
    for gauge in GAUGES.keys() - {"prefix_cache_hit_rate"}:  # (a rate: the one figure below)
        values = [r[gauge] for r in during if gauge in r]
        out[f"engine_{gauge}_mean"] = statistics.fmean(values) if values else None
        out[f"engine_{gauge}_max"] = max(values) if values else None
    # The prefix cache's hits over the level: from its counters where the engine counts them, else its gauge.
    queried = diff.get("prefix_cache_queries")
    rates = [r["prefix_cache_hit_rate"] for r in during if "prefix_cache_hit_rate" in r]
    out["engine_prefix_cache_hit_rate"] = ((diff.get("prefix_cache_hits") or 0.0) / queried if queried
                                           else statistics.fmean(rates) if rates else None)
    drafts = diff.get("spec_drafts") or 0.0
    positions = sorted((int(k.removeprefix("spec_accepted_pos")), v) for k, v in diff.items()
                       if k.startswith("spec_accepted_pos"))
    # Of the drafts, the share whose i-th drafted token was accepted.
    out["spec_acceptance_per_position"] = [round(v / drafts, 4) for _, v in positions] if drafts > 0 else None
    out["engine_metrics"] = "/metrics" if after else None
    return out


class Sampler(Periodic):
    """Reads ``/metrics`` every ``interval_s`` while a level runs (``async with``). ``read`` returns the
    page or None (no answer, no metrics: then nothing is kept and reading stops after three misses)."""

    def __init__(self, read: Callable[[], Awaitable[str | None]], interval_s: float = 1.0) -> None:
        self.read, self.interval_s = read, interval_s
        self.samples = Samples()

    async def _loop(self) -> None:
        misses = 0
        while misses < 3:
            text = await self.read()
            if text:
                misses = 0
                self.samples.pages.append((time.time(), text))
            else:
                misses += 1
            await asyncio.sleep(self.interval_s)
