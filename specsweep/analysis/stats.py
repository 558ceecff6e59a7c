"""How sure a comparison is: the interval of speculative / baseline throughput at one level, and
its verdict.

The method, in words. Each configuration is measured at a level in blocks (a block: one
measurement of ``num_requests`` requests, giving one output throughput). The comparison is on
the log scale, where a ratio is a difference:

- paired (blocks taken alternately, baseline and speculative, so that slow drift of the
  machine lands on both alike): d_i = log(spec_i / base_i) per pair; the interval is
  Student's t on the mean of the d_i (n - 1 degrees of freedom);
- unpaired (all baseline blocks, then all speculative ones): Welch's t on the two means of
  log throughput, with Welch–Satterthwaite degrees of freedom.

The ratio is exp(mean) (a geometric mean), the interval exp(mean ± t · se). A level is
measured block after block until its verdict is decided or its budget is spent, so the
interval is looked at several times; to keep its coverage honest under that, the
confidence of each look is raised by Bonferroni over the looks the budget allows
(``simultaneous_confidence``): with the default 95 % and up to 6 looks, each look uses
99.2 %. The verdict, with margin m (default 3 %):

    equivalent    the whole interval inside [1 - m, 1 + m]
    faster        otherwise, the interval above 1: speculation is shown to pay
    slower        otherwise, the interval below 1
    no gain       otherwise, the interval below 1 + m: a gain worth having is ruled out
    undetermined  otherwise: a gain of more than m is still possible (or fewer than two blocks)

Speculation is kept only where it is shown to pay: slower, equivalent and no gain all say
"it does not pay here" (``PAYS``, ``DOES_NOT_PAY``).

tests/specsweep/test_stats.py checks the coverage on generated data with a known ratio.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["faster", "slower", "equivalent", "no gain", "undetermined"]
PAYS: frozenset[str] = frozenset({"faster"})
DOES_NOT_PAY: frozenset[str] = frozenset({"slower", "equivalent", "no gain"})


# -- Student's t, without scipy --------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Lentz), as in Numerical Recipes."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on the CDF; exact to 1e-10)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be between 0 and 1")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return (lo + hi) / 2.0


# -- the ratio and its interval ------------------------------------------------------------------


@dataclass(frozen=True)
class RatioInterval:
    """speculative / baseline throughput at one level."""

    ratio: float
    low: float | None  # None: not enough blocks for an interval
    high: float | None
    blocks: tuple[int, int]  # (baseline, speculative)
    paired: bool
    confidence: float

    @property
    def half_width(self) -> float | None:
        """Half the width of the interval on the log scale (≈ relative precision)."""
        if self.low is None or self.high is None:
            return None
        return (math.log(self.high) - math.log(self.low)) / 2.0


def simultaneous_confidence(confidence: float, looks: int) -> float:
    """The confidence of each of ``looks`` looks so that all of them hold together at ``confidence``."""
    return 1.0 - (1.0 - confidence) / max(1, looks)


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def ratio_interval(base: Sequence[float], spec: Sequence[float], *, paired: bool,
                   confidence: float = 0.95) -> RatioInterval:
    """The ratio spec / base and its interval at ``confidence``. ``paired``: base[i] and spec[i] were
    measured back to back (only the first min(len) pairs count)."""
    if not base or not spec or any(x <= 0 for x in (*base, *spec)):
        raise ValueError("throughputs must be positive, and each configuration needs at least one block")
    lb, ls = [math.log(x) for x in base], [math.log(x) for x in spec]
    q = (1.0 + confidence) / 2.0
    if paired:
        n = min(len(lb), len(ls))
        d = [ls[i] - lb[i] for i in range(n)]
        mean = sum(d) / n
        if n < 2:
            return RatioInterval(math.exp(mean), None, None, (len(base), len(spec)), True, confidence)
        _, var = _mean_var(d)
        half = t_quantile(q, n - 1) * math.sqrt(var / n)
    else:
        mean = sum(ls) / len(ls) - sum(lb) / len(lb)
        if len(lb) < 2 or len(ls) < 2:
            return RatioInterval(math.exp(mean), None, None, (len(base), len(spec)), False, confidence)
        (_, vb), (_, vs) = _mean_var(lb), _mean_var(ls)
        sb, ss = vb / len(lb), vs / len(ls)
        se2 = sb + ss
        if se2 == 0.0:
            half = 0.0
        else:
            df = se2 ** 2 / ((sb ** 2 / (len(lb) - 1) if sb else 0.0) + (ss ** 2 / (len(ls) - 1) if ss else 0.0))
            half = t_quantile(q, df) * math.sqrt(se2)
    return RatioInterval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), (len(base), len(spec)),
                         paired, confidence)


def verdict(interval: RatioInterval, margin: float) -> Verdict:
    """faster, slower, equivalent (the whole interval within ±margin), no gain (below 1 + margin) or
    undetermined (a gain of more than the margin is still possible)."""
    if interval.low is None or interval.high is None:
        return "undetermined"
    if interval.low >= 1.0 - margin and interval.high <= 1.0 + margin:
        return "equivalent"
    if interval.low > 1.0:
        return "faster"
    if interval.high < 1.0:
        return "slower"
    if interval.high < 1.0 + margin:
        return "no gain"
    return "undetermined"
