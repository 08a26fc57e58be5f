"""Confidence interval of an accuracy: the Wilson score interval (numpy-free).

:func:`wilson_interval` of a proportion ``k/n``:
``(p̂ + z²/2n ± z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)``. It stays inside [0, 1] and is
not degenerate at 0 or ``n`` successes, unlike the normal approximation. Used for
accuracies on small test sets (the thought evaluation, ``icl-lens thought-eval``, the
workshop notebooks). Bootstrap
intervals live in :mod:`icl_lens.stats._bootstrap`.
"""
from __future__ import annotations

import math
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
