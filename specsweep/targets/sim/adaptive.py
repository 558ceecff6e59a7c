"""A model of SGLang's documented adaptive speculation controller (``--speculative-adaptive``).

A model of the engine, never evidence about it: it follows what SGLang's documentation and PRs
(#21599, #23336; batch-size bands in #24055) say the controller does, not its code, and no figure
measured against it says anything about a real SGLang.

What the documentation gives: tiers of draft steps (``candidate_steps``), an exponential moving average
of the drafts each verify step accepts (``ema_alpha``), a decision every ``update_interval`` verify
batches once ``warmup_batches`` have run, hysteresis on the way down and up, and a separate list of tiers
per batch-size band. What it does not give, and this model chooses (the simulator's reading, so labelled):

- how the average becomes a tier. Here: the average accepted drafts ``a`` at the current depth ``c`` is
  turned into a per-draft acceptance ``p`` (solving p + p² + ... + p^c = a, the chain drafter's shape),
  whose unbounded depth would accept ``s = p / (1 - p)`` drafts. The controller moves up one tier when
  ``s > c + up_hysteresis``, down one when ``s < lower + down_hysteresis`` (``lower`` the next tier down);
  in between it stays, so it does not swing between two tiers on steady traffic;
- each band keeps its own average, counters and tier; the spelling of the band key in a config file
  (``batch_size_bands: [[lo, hi, [steps...]], ...]``, ``hi`` null for no upper end).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

#: The documented defaults (SGLang PR #24055's bands; the scalar keys from #21599).
DEFAULT_CONTROLLER: dict[str, Any] = {
    "candidate_steps": [1, 3, 7],
    "ema_alpha": 0.2,
    "update_interval": 5,
    "warmup_batches": 10,
    "down_hysteresis": -0.25,
    "up_hysteresis": 0.0,
    "batch_size_bands": [[1, 64, [1, 3, 7]], [64, 128, [1, 2, 5]], [128, None, [1, 2, 6]]],
}

#: The keys that mark a file as the controller's config (not the per-batch-size table the tune writes).
CONTROLLER_KEYS = frozenset(DEFAULT_CONTROLLER)


@dataclass
class Band:
    lo: int
    hi: float  # math.inf for no upper end
    steps: list[int]
    tier: int = 0  # index into steps
    ema: float | None = None
    batches: int = 0


@dataclass
class Controller:
    ema_alpha: float
    update_interval: int
    warmup_batches: int
    down_hysteresis: float
    up_hysteresis: float
    bands: list[Band] = field(default_factory=list)
    active_steps: int = 0  # the tier of the last verify step, as /server_info shows it
    changes: int = 0

    def band_for(self, b: int) -> Band:
        for band in self.bands:
            if band.lo <= b < band.hi:
                return band
        return self.bands[0] if b < self.bands[0].lo else self.bands[-1]

    def steps_for(self, b: int) -> int:
        """The draft steps of the next verify step for a batch of ``b``."""
        self.active_steps = (band := self.band_for(b)).steps[band.tier]
        return self.active_steps

    def observe(self, b: int, steps: int, accepted_drafts: float) -> None:
        """After a verify step of ``steps`` drafts at batch ``b`` whose requests accepted ``accepted_drafts``
        drafts on average: update the band's average and, on its interval after warm-up, its tier."""
        band = self.band_for(b)
        if steps <= 0 or steps != band.steps[band.tier]:
            return  # a step taken before the band's tier changed says nothing about the new tier
        band.ema = accepted_drafts if band.ema is None else (
            self.ema_alpha * accepted_drafts + (1 - self.ema_alpha) * band.ema)
        band.batches += 1
        if band.batches < self.warmup_batches or (band.batches - self.warmup_batches) % self.update_interval:
            return
        s = unbounded_accepted(band.ema, steps)
        if band.tier + 1 < len(band.steps) and s > steps + self.up_hysteresis:
            band.tier += 1
            self.changes += 1
        elif band.tier > 0 and s < band.steps[band.tier - 1] + self.down_hysteresis:
            band.tier -= 1
            self.changes += 1


def unbounded_accepted(accepted: float, depth: int) -> float:
    """Drafts a chain would accept without a depth limit, from ``accepted`` per step at ``depth`` drafts."""
    if accepted >= depth:
        return math.inf
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, depth + 1)) < accepted:
            lo = mid
        else:
            hi = mid
    p = (lo + hi) / 2
    return p / (1 - p)


def _steps_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(x, int) and x >= 1 for x in value):
        raise ValueError(f"{where}: candidate_steps must be a non-empty list of integers >= 1 (got {value!r})")
    return sorted(set(value))


def controller_from(data: dict[str, Any], initial_steps: int) -> Controller:
    """The controller from a config object (missing keys take the documented defaults). Each band starts at
    the tier nearest ``initial_steps`` (``--speculative-num-steps``). Raises ValueError naming the key."""
    unknown = sorted(set(data) - CONTROLLER_KEYS)
    if unknown:
        raise ValueError(f"unknown adaptive config keys {unknown}: expected some of {sorted(CONTROLLER_KEYS)}")
    cfg = {**DEFAULT_CONTROLLER, **data}
    for key in ("ema_alpha",):
        if not isinstance(cfg[key], (int, float)) or not 0 < cfg[key] <= 1:
            raise ValueError(f"{key} must be a number in (0, 1] (got {cfg[key]!r})")
    for key in ("update_interval", "warmup_batches"):
        if not isinstance(cfg[key], int) or cfg[key] < (1 if key == "update_interval" else 0):
            raise ValueError(f"{key} must be a whole number (got {cfg[key]!r})")
    for key in ("down_hysteresis", "up_hysteresis"):
        if not isinstance(cfg[key], (int, float)):
            raise ValueError(f"{key} must be a number (got {cfg[key]!r})")
    if "batch_size_bands" in data:
        raw_bands = data["batch_size_bands"]
    elif "candidate_steps" in data:
        raw_bands = [[1, None, data["candidate_steps"]]]  # one list for every batch size
    else:
        raw_bands = DEFAULT_CONTROLLER["batch_size_bands"]
    if not isinstance(raw_bands, list) or not raw_bands:
        raise ValueError("batch_size_bands must be a non-empty list of [lo, hi, [steps...]]")
    bands: list[Band] = []
    for i, entry in enumerate(raw_bands):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], int)
                and (entry[1] is None or isinstance(entry[1], int))):
            raise ValueError(f"batch_size_bands[{i}] must be [lo, hi or null, [steps...]] (got {entry!r})")
        steps = _steps_list(entry[2], f"batch_size_bands[{i}]")
        hi = math.inf if entry[1] is None else float(entry[1])
        if hi <= entry[0] or (bands and entry[0] != bands[-1].hi):
            raise ValueError(f"batch_size_bands[{i}]: bands must be increasing and adjoining (got {entry!r})")
        start = min(range(len(steps)), key=lambda j: (abs(steps[j] - initial_steps), steps[j]))
        bands.append(Band(lo=entry[0], hi=hi, steps=steps, tier=start))
    return Controller(ema_alpha=float(cfg["ema_alpha"]), update_interval=cfg["update_interval"],
                      warmup_batches=cfg["warmup_batches"], down_hysteresis=float(cfg["down_hysteresis"]),
                      up_hysteresis=float(cfg["up_hysteresis"]), bands=bands)


def is_controller_config(text: str) -> bool:
    """Whether a config file is the controller's (its documented keys), not a table keyed by batch size."""
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and bool(set(data) & CONTROLLER_KEYS)
