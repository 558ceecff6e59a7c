"""How sure a comparison is: the interval of speculative / baseline throughput at one level, and
its verdict.

The method, in words. Each configuration is measured at a level in blocks (a block: one
measurement of ``num_requests`` requests, giving one output throughput). The comparison is on
the log scale, where a ratio is a difference, and its intervals are distribution-free: they hold
whatever the shape of the noise (an occasional 1.6x shift of the machine inside a round, a stall),
with nothing set aside for its value:

- paired (blocks taken in rounds, baseline and speculative back to back, so that slow drift of
  the machine lands on both alike): d_i = log(spec_i / base_i) per round; the ratio is exp of
  their median, its interval the order-statistic interval of the median [d_(k), d_(n+1-k)]
  (the sign test inverted: it covers the median of the rounds' ratio with probability at least
  ``confidence`` for any continuous noise);
- unpaired (all baseline blocks, then all speculative ones): the Hodges-Lehmann shift (the
  median of every difference log spec_j - log base_i), its interval from the order statistics
  of those differences at the Mann-Whitney critical value (exact).

With too few rounds for ``confidence`` (the sign test needs 2 / 2^n <= 1 - confidence) the
interval is unbounded (``low``/``high`` None): the level is undetermined, and its loss bound
(``specsweep.analysis.recommend``) is not finite. The confidence of each interval comes from the
error rate of the answer as a whole (``DecisionConfig.interval_confidence``: Bonferroni over
levels and categories, and over a level's looks exactly, ``sequential_confidence``). The verdict,
with margin m (default 5 %):

    equivalent    the whole interval inside [1 - m, 1 + m]
    faster        otherwise, the interval above 1: speculation is shown to pay
    slower        otherwise, the interval below 1
    no gain       otherwise, the interval below 1 + m: a gain worth having is ruled out
    undetermined  otherwise: a gain of more than m is still possible (or no bounded interval)

Speculation is kept only where it is shown to pay: slower, equivalent and no gain all say
"it does not pay here" (``PAYS``, ``DOES_NOT_PAY``).

tests/specsweep/analysis/test_stats.py checks the coverage on generated data with a known ratio, and
tests/specsweep/analysis/test_known_answer.py the answer as a whole.
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=4096)
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
    spread: float | None = None  # robust standard deviation of one round's log ratio (MAD x 1.4826)

    @property
    def half_width(self) -> float | None:
        """Half the width of the interval on the log scale (≈ relative precision)."""
        if self.low is None or self.high is None:
            return None
        return (math.log(self.high) - math.log(self.low)) / 2.0


def _binom_half_cdf(k: int, n: int) -> float:
    """P(B <= k) for B ~ Binomial(n, 1/2)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2.0 ** n


@functools.lru_cache(maxsize=4096)
def sign_depth(n: int, confidence: float) -> int | None:
    """The order statistic k such that [x_(k), x_(n+1-k)] covers the median of n draws with probability at least
    ``confidence`` (the largest such k, so the narrowest); None when even [x_(1), x_(n)] cannot."""
    tail = (1.0 - confidence) / 2.0
    k = 0
    while k + 1 <= (n + 1) // 2 and _binom_half_cdf(k, n) <= tail:
        k += 1
    return k or None


def sequential_miss(per_look: float, first: int, last: int) -> float:
    """The probability that any of the sign-test intervals at rounds ``first`` to ``last`` (each at confidence
    ``per_look``) misses the median, exactly: the signs of the rounds about their median are fair coin flips,
    whatever the noise, so the union over the looks is a walk's chance to cross the intervals' order statistics
    (a path is counted once, at its first miss)."""
    paths = [1.0]  # by how many rounds so far lie below the median
    missed = 0.0
    for n in range(1, last + 1):
        paths = [(paths[s] if s < n else 0.0) / 2 + (paths[s - 1] if s > 0 else 0.0) / 2 for s in range(n + 1)]
        k = sign_depth(n, per_look) if n >= first else None
        if k is None:
            continue
        for s in [*range(k), *range(n + 1 - k, n + 1)]:  # the median below d(k), or above d(n+1-k)
            missed += paths[s]
            paths[s] = 0.0
    return missed


@functools.lru_cache(maxsize=1024)
def sequential_confidence(alpha: float, first: int, last: int) -> float:
    """The confidence of each look such that the sign-test intervals at every round from ``first`` to ``last``
    all cover the median together with probability at least 1 - alpha (``sequential_miss``; about nine times
    Bonferroni's per-look alpha over 21 looks, as the looks' intervals share their rounds)."""
    lo, hi = alpha / max(1, last - first + 1), alpha
    if sequential_miss(1.0 - hi, first, last) <= alpha:
        return 1.0 - hi
    for _ in range(40):  # bisection on the log scale; lo always holds
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if sequential_miss(1.0 - mid, first, last) <= alpha else (lo, mid)
    return 1.0 - lo


def min_rounds(confidence: float) -> int:
    """The fewest paired rounds that give a bounded interval at ``confidence``."""
    n = 1
    while sign_depth(n, confidence) is None:
        n += 1
    return n


def _mann_whitney_counts(m: int, n: int) -> list[int]:
    """How many of the C(m + n, m) orderings give each value of the Mann-Whitney U (0..m n): the coefficients of
    the Gaussian binomial [m + n choose m]_q."""
    poly = [1]
    for i in range(1, m + 1):
        # multiply by (1 - q^(n+i)), then divide by (1 - q^i) (exact: the quotient is a polynomial)
        up = poly + [0] * (n + i)
        for j in range(len(poly)):
            up[j + n + i] -= poly[j]
        out = [0] * (len(up) - i)
        for j in range(len(out)):
            out[j] = up[j] + (out[j - i] if j >= i else 0)
        poly = out
    return poly[: m * n + 1]


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    h = len(s) // 2
    return s[h] if len(s) % 2 else (s[h - 1] + s[h]) / 2.0


def ratio_interval(base: Sequence[float], spec: Sequence[float], *, paired: bool,
                   confidence: float = 0.95) -> RatioInterval:
    """The ratio spec / base and its distribution-free interval at ``confidence`` (module docstring).
    ``paired``: base[i] and spec[i] were measured in the same round (only the first min(len) pairs count)."""
    if not base or not spec or any(x <= 0 for x in (*base, *spec)):
        raise ValueError("throughputs must be positive, and each configuration needs at least one block")
    lb, ls = [math.log(x) for x in base], [math.log(x) for x in spec]
    counts = (len(base), len(spec))
    if paired:
        n = min(len(lb), len(ls))
        d = sorted(ls[i] - lb[i] for i in range(n))
        centre = _median(d)
        spread = 1.4826 * _median([abs(x - centre) for x in d]) if n >= 2 else None
        k = sign_depth(n, confidence) if n >= 2 else None
        if k is None:
            return RatioInterval(math.exp(centre), None, None, counts, True, confidence, spread)
        return RatioInterval(math.exp(centre), math.exp(d[k - 1]), math.exp(d[n - k]), counts, True, confidence,
                             spread)
    diffs = sorted(s - b for s in ls for b in lb)
    centre = _median(diffs)
    # One pair's spread, from each configuration's own (MAD x 1.4826), as a round's would be.
    spread = math.hypot(*(1.4826 * _median([abs(x - _median(xs)) for x in xs]) for xs in (lb, ls))) \
        if len(lb) >= 2 and len(ls) >= 2 else None
    m, n = len(lb), len(ls)
    freq = _mann_whitney_counts(m, n)
    total, tail = float(sum(freq)), (1.0 - confidence) / 2.0
    k, below = 0, 0
    while k < len(diffs) // 2 and (below + freq[k]) / total <= tail:
        below += freq[k]
        k += 1
    if k == 0:
        return RatioInterval(math.exp(centre), None, None, counts, False, confidence, spread)
    return RatioInterval(math.exp(centre), math.exp(diffs[k - 1]), math.exp(diffs[len(diffs) - k]), counts, False,
                         confidence, spread)


def verdict(interval: RatioInterval, margin: float) -> Verdict:
    """faster, slower, equivalent (the whole interval within ±margin), no gain (below 1 + margin) or
    undetermined (a gain of more than the margin is still possible, or the interval is unbounded)."""
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
