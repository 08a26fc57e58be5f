"""Closed-form intervals (numpy-free): the Wilson score interval of an accuracy, the Student-t interval of a mean.

:func:`wilson_interval` of a proportion ``k/n``:
``(p̂ + z²/2n ± z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)``. It stays inside [0, 1] and is
not degenerate at 0 or ``n`` successes, unlike the normal approximation. Used for
accuracies on small test sets (the thought evaluation, ``icl-lens thought-eval``, the
workshop notebooks).

:func:`t_interval` of a mean over ``n`` independent units (training seeds, each summarised
by one number): ``x̄ ± t_{n−1} s/√n`` with the exact Student-t critical value
(:func:`t_quantile`). With few units a percentile bootstrap has only a handful of distinct
resamples (3 seeds: 10) and its "95%" interval is about the range of the units; the t-interval
keeps its coverage for normal units. :func:`welch_interval`: the difference of two such means from
independent units (``x̄_a − x̄_b ± t_ν √(s_a²/n_a + s_b²/n_b)``, Welch–Satterthwaite ``ν`` rounded
down). Bootstrap intervals live in :mod:`icl_lens.stats._bootstrap`.
"""
from __future__ import annotations

import math

from icl_lens.stats._bootstrap import MeanCI
from statistics import NormalDist


def _z(level: float) -> float:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of the proportion ``k/n`` at confidence ``level``."""
    if n <= 0:
        raise ValueError(f"n must be > 0, got {n}")
    if not 0 <= k <= n:
        raise ValueError(f"k must be in 0..n, got k={k}, n={n}")
    z = _z(level)
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


# --- Student t, for means over few independent units (training seeds) -----------------------------------------

def t_two_sided_mass(t: float, df: int) -> float:
    """``P(|T| ≤ t)`` for Student's t with integer ``df`` (closed form, Abramowitz & Stegun 26.7.3–4).

    With ``θ = atan(t/√ν)``: odd ``ν``: ``(2/π)[θ + sinθ (cosθ + (2/3)cos³θ + … + (2·4⋯(ν−3))/(1·3⋯(ν−2)) cos^{ν−2}θ)]``;
    even ``ν``: ``sinθ [1 + (1/2)cos²θ + (1·3)/(2·4)cos⁴θ + … + (1·3⋯(ν−3))/(2·4⋯(ν−2)) cos^{ν−2}θ]``.
    """
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a positive integer, got {df}")
    t = abs(float(t))
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:
        if df == 1:
            return 2 * theta / math.pi
        term, total = c, c
        for k in range(3, df - 1, 2):  # cos^k θ with coefficient (2·4⋯(k−1))/(1·3⋯k)
            term *= (k - 1) / k * c * c
            total += term
        return 2 / math.pi * (theta + s * total)
    term, total = 1.0, 1.0
    for k in range(2, df - 1, 2):  # cos^k θ with coefficient (1·3⋯(k−1))/(2·4⋯k)
        term *= (k - 1) / k * c * c
        total += term
    return s * total


def t_quantile(level: float, df: int) -> float:
    """The two-sided critical value ``t`` with ``P(|T| ≤ t) = level`` (bisection on the closed form)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo, hi = 0.0, 1.0
    while t_two_sided_mass(hi, df) < level:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_mass(mid, df) < level else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def t_interval(values, level: float = 0.95) -> MeanCI:
    """Mean of ``values`` (one per independent unit, e.g. a training seed's mean) with its Student-t ``level``
    interval ``mean ± t_{ν} s/√n`` (``ν = n − 1``); ``n`` of the result counts the units. Needs n ≥ 2 finite values."""
    x = [float(v) for v in values]
    n = len(x)
    if n < 2:
        raise ValueError(f"a t-interval needs at least 2 values (units), got {n}")
    if not all(math.isfinite(v) for v in x):
        raise ValueError("t_interval needs finite values")
    mean = sum(x) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1))
    half = t_quantile(level, n - 1) * sd / math.sqrt(n)
    return MeanCI(mean, mean - half, mean + half, n)


def welch_interval(a, b, level: float = 0.95) -> MeanCI:
    """Difference of means ``mean(a) − mean(b)`` of two independent sets of units (seeds of two models) with its
    Welch t ``level`` interval; the Welch–Satterthwaite degrees of freedom are rounded down (conservative).
    ``n`` of the result is the smaller set's size. Needs at least 2 finite values on each side."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"a Welch interval needs at least 2 values on each side, got {len(a)} and {len(b)}")
    if not all(math.isfinite(v) for v in a + b):
        raise ValueError("welch_interval needs finite values")
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((v - ma) ** 2 for v in a) / (len(a) - 1) / len(a)
    vb = sum((v - mb) ** 2 for v in b) / (len(b) - 1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return MeanCI(ma - mb, ma - mb, ma - mb, min(len(a), len(b)))
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(level, max(1, math.floor(df))) * se
    return MeanCI(ma - mb, ma - mb - half, ma - mb + half, min(len(a), len(b)))
