"""The interval method on generated data with a known ratio: coverage, narrowing, and the verdicts."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from specsweep.analysis.decision import DecisionConfig, pair_needs_more
from specsweep.analysis.stats import RatioInterval, ratio_interval, simultaneous_confidence, t_quantile, verdict
from specsweep.records import BlockRow

TRUE_RATIOS = (0.8, 0.95, 1.0, 1.02, 1.1, 1.3)


def test_t_quantiles_match_the_tables() -> None:
    for df, want in ((1, 12.7062), (2, 4.3027), (5, 2.5706), (10, 2.2281), (30, 2.0423), (1000, 1.9623)):
        assert t_quantile(0.975, df) == pytest.approx(want, abs=1e-4)
    assert t_quantile(0.995, 4) == pytest.approx(4.6041, abs=1e-4)
    assert t_quantile(0.025, 5) == pytest.approx(-2.5706, abs=1e-4)


def blocks(rng: random.Random, ratio: float, n: int, *, noise: float = 0.08, drift: float = 0.3,
           paired: bool = True) -> tuple[list[float], list[float]]:
    """n blocks of each configuration: a machine whose speed drifts from block to block (shared by the
    two blocks of a pair when paired), plus each block's own noise (log-normal)."""
    base, spec = [], []
    for _ in range(n):
        d = rng.gauss(0, drift)
        base.append(500 * math.exp(d + rng.gauss(0, noise)))
        spec.append(500 * ratio * math.exp((d if paired else rng.gauss(0, drift)) + rng.gauss(0, noise)))
    return base, spec


@pytest.mark.parametrize("paired", [True, False])
def test_the_95_percent_interval_covers_the_true_ratio(paired: bool) -> None:
    rng = random.Random(7)
    covered = total = 0
    for i in range(200):
        ratio = TRUE_RATIOS[i % len(TRUE_RATIOS)]
        base, spec = blocks(rng, ratio, 5, paired=paired, drift=0.3 if paired else 0.05)
        iv = ratio_interval(base, spec, paired=paired)
        assert iv.low is not None and iv.high is not None
        covered += iv.low <= ratio <= iv.high
        total += 1
    assert covered / total >= 0.90, covered / total


def test_the_interval_narrows_as_blocks_are_added() -> None:
    rng = random.Random(11)
    widths: dict[int, list[float]] = {2: [], 4: [], 8: [], 16: []}
    for _ in range(200):
        base, spec = blocks(rng, 1.1, 16)
        for n in widths:
            iv = ratio_interval(base[:n], spec[:n], paired=True)
            assert iv.half_width is not None
            widths[n].append(iv.half_width)
    means = [sum(w) / len(w) for w in widths.values()]
    assert means[0] > means[1] > means[2] > means[3], means


def row(tps: float, index: int = 0, repeat: int = 0) -> BlockRow:
    return BlockRow(config_name="c", level_index=index, mode="concurrency", concurrency=1, repeat=repeat,
                    output_tokens_per_s=tps, duration_s=1.0, requests=8)


def measure_until_decided(b_all: list[float], s_all: list[float], more: Callable[[list[BlockRow], list[BlockRow]], bool],
                          config: DecisionConfig) -> RatioInterval:
    """Pairs of blocks until ``more`` says the level is decided; the final interval."""
    base: list[BlockRow] = []
    spec: list[BlockRow] = []
    for b, s in zip(b_all, s_all, strict=True):
        base.append(row(b, repeat=len(base)))
        spec.append(row(s, repeat=len(spec)))
        if not more(base, spec):
            break
    return ratio_interval([r.output_tokens_per_s for r in base], [r.output_tokens_per_s for r in spec], paired=True,
                          confidence=config.look_confidence(8))


def test_measuring_until_decided_keeps_its_coverage() -> None:
    """The adaptive procedure looks at the interval after every pair and stops when it is decided: its
    final intervals still cover the true ratio (the looks are accounted for)."""
    config = DecisionConfig(max_requests_per_level=64, max_seconds_per_level=3600)
    more = pair_needs_more(config, num_requests=8)
    rng = random.Random(3)
    covered = 0
    for i in range(200):
        ratio = TRUE_RATIOS[i % len(TRUE_RATIOS)]
        b_all, s_all = blocks(rng, ratio, config.max_blocks(8))
        iv = measure_until_decided(b_all, s_all, more, config)
        assert iv.low is not None and iv.high is not None
        covered += iv.low <= ratio <= iv.high
    assert covered / 200 >= 0.90, covered / 200


def test_clear_differences_are_decided_within_the_budget() -> None:
    config = DecisionConfig()
    more = pair_needs_more(config, num_requests=8)
    rng = random.Random(5)
    decided = 0
    for _ in range(50):
        b_all, s_all = blocks(rng, 1.3, config.max_blocks(8), noise=0.05)
        iv = measure_until_decided(b_all, s_all, more, config)
        decided += verdict(iv, config.margin) == "faster"
    assert decided >= 45


def iv(low: float | None, high: float | None) -> RatioInterval:
    return RatioInterval(1.0, low, high, (3, 3), True, 0.95)


def test_verdicts_by_hand() -> None:
    assert verdict(iv(0.98, 1.02), 0.03) == "equivalent"
    assert verdict(iv(1.01, 1.02), 0.03) == "equivalent"  # within the margin beats "faster"
    assert verdict(iv(1.01, 1.2), 0.03) == "faster"
    assert verdict(iv(0.7, 0.99), 0.03) == "slower"
    assert verdict(iv(0.91, 3.40), 0.03) == "undetermined"  # the interval the old report called "disable at 8"
    assert verdict(iv(None, None), 0.03) == "undetermined"
    assert simultaneous_confidence(0.95, 5) == pytest.approx(0.99)
