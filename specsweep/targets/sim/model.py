"""The performance model: one engine loop steps every running request together.

A step's time grows with the batch: ``t(b) = sqrt(t1² + (b / R)²)`` — about ``t1`` for a
single stream (memory-bound decode) and ``b / R`` once compute-bound, so throughput
rises with concurrency and flattens at ``R`` steps·requests per second. Without
speculation a step emits one token per request. With speculation (EAGLE-style) a verify
step costs more and emits 1..(steps+1) tokens per request: the first token always, then
each draft token while the previous ones were accepted, with a per-token acceptance
probability solved so that the mean matches the profile's accept length.

A profile's speculative figures hold at ``CALIBRATION_STEPS`` draft steps. Other step counts
(``--speculative-num-steps``, or SGLang's per-batch candidate steps) cost in proportion: each
draft step adds an equal share of the verify step's extra time and work over a plain decode
step, and the per-token acceptance probability stays the same, so longer drafts emit more
tokens per step at a higher price. Zero steps is a plain decode step.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class SimProfile:
    name: str
    description: str
    base_step_s: float  # t1 without speculation
    base_rate: float  # R without speculation (requests·steps per second when compute-bound)
    spec_step_s: float  # t1 of a verify step
    spec_rate: float  # R of verify steps
    accept_length: float  # mean tokens per verify step per request
    max_running_requests: int = 256
    direct: bool = False  # stream without the engine loop, as fast as possible (client speed tests)
    token_interval_s: float | None = None  # fixed pacing per token, batch-independent (timing tests)


PROFILES: dict[str, SimProfile] = {
    # Calibrated to the published runs (SGLang, TP8, PCIe): baseline 92.6 tok/s single stream,
    # ~773 saturated; EAGLE-3 96.1 single stream, ~340-354 saturated (C >= 70), accept length 2.
    "kimi-k2.5-int4-8x-rtx-pro-6000": SimProfile(
        name="kimi-k2.5-int4-8x-rtx-pro-6000",
        description="Kimi-K2.5 1T INT4 MoE on 8x RTX PRO 6000 Blackwell (PCIe, TP8), SGLang",
        base_step_s=0.01072,
        base_rate=773.0,
        spec_step_s=0.02000,
        spec_rate=173.5,
        accept_length=2.0,
    ),
    "instant": SimProfile(
        name="instant", description="streams every token at once, one per SSE event (client speed tests)",
        base_step_s=0.0, base_rate=math.inf, spec_step_s=0.0, spec_rate=math.inf, accept_length=1.0, direct=True,
    ),
    "paced-5ms": SimProfile(
        name="paced-5ms", description="one token every 5 ms per request, whatever the load (timing tests)",
        base_step_s=0.005, base_rate=math.inf, spec_step_s=0.005, spec_rate=math.inf, accept_length=1.0,
        direct=True, token_interval_s=0.005,
    ),
    "tiny-fast": SimProfile(
        # Speculation well ahead for one stream (x1.5), behind from C=4 (x0.9) and far behind at 16 (x0.55):
        # a crossover that a noisy 2-core CI machine cannot blur.
        name="tiny-fast", description="a fast small model for quick tests: 360 tok/s single stream",
        base_step_s=0.0025, base_rate=4000.0, spec_step_s=0.003, spec_rate=600.0, accept_length=2.5,
    ),
    "tiny-pays": SimProfile(
        # Verify steps nearly as cheap as plain ones at every batch: speculation pays at every level (x2 and more).
        name="tiny-pays", description="speculation pays at every batch size (no crossover)",
        base_step_s=0.0025, base_rate=4000.0, spec_step_s=0.003, spec_rate=4000.0, accept_length=2.5,
    ),
    "tiny-never": SimProfile(
        # Verify steps cost far more than they emit: speculation is slower at every level (x0.8 and less).
        name="tiny-never", description="speculation does not pay at any batch size (no crossover)",
        base_step_s=0.0025, base_rate=4000.0, spec_step_s=0.008, spec_rate=600.0, accept_length=2.5,
    ),
}


#: The draft steps a profile's spec_step_s, spec_rate and accept_length were measured with.
CALIBRATION_STEPS = 3


def spec_step_params(profile: SimProfile, steps: int) -> tuple[float, float]:
    """(t1, R) of a verify step that drafts ``steps`` tokens (0: a plain decode step)."""
    if steps <= 0:
        return profile.base_step_s, profile.base_rate
    share = steps / CALIBRATION_STEPS
    t1 = profile.base_step_s + (profile.spec_step_s - profile.base_step_s) * share
    work = 1 / profile.base_rate + (1 / profile.spec_rate - 1 / profile.base_rate) * share  # 1/inf is 0.0
    return t1, (1 / work if work > 0 else math.inf)


def mean_accept_length(p: float, steps: int) -> float:
    """Tokens one verify step emits per request on average: 1 + p + ... + p^steps."""
    return sum(p**i for i in range(max(0, steps) + 1))


def step_time(b: int, t1: float, rate: float) -> float:
    if b <= 0:
        return 0.0
    compute = 0.0 if math.isinf(rate) else b / rate
    return math.sqrt(t1 * t1 + compute * compute)


def acceptance_probability(mean_length: float, max_draft: int) -> float:
    """p such that 1 + p + p² + ... + p^max_draft = mean_length (bisection)."""
    if mean_length <= 1.0 or max_draft <= 0:
        return 0.0
    if mean_length >= max_draft + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(max_draft + 1)) < mean_length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def sample_accepted(rng: random.Random, p: float, max_draft: int) -> int:
    """Tokens one verify step emits for one request: 1 + consecutive accepted drafts."""
    n = 1
    while n <= max_draft and rng.random() < p:
        n += 1
    return n


def speedup_at(points: dict[int, float], b: int) -> float:
    """The speedup a profile of speedups by batch gives at batch ``b``: log-linear between its points, flat beyond."""
    keys = sorted(points)
    if b <= keys[0]:
        return points[keys[0]]
    for lo, hi in zip(keys, keys[1:], strict=False):
        if lo <= b <= hi:
            w = math.log(b / lo) / math.log(hi / lo)
            return math.exp((1 - w) * math.log(points[lo]) + w * math.log(points[hi]))
    return points[keys[-1]]


def expected_throughput(profile: SimProfile, b: int, speculative: bool, steps: int = CALIBRATION_STEPS) -> float:
    """Steady-state output tokens/s at batch b (for calibration checks, and the adaptive choice)."""
    if not speculative or steps <= 0:
        return b / step_time(b, profile.base_step_s, profile.base_rate)
    p = acceptance_probability(profile.accept_length, CALIBRATION_STEPS)
    return b * mean_accept_length(p, steps) / step_time(b, *spec_step_params(profile, steps))
