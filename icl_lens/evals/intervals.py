"""Confidence intervals shared by every evaluation (numpy only).

- :func:`wilson_interval`: the Wilson score interval of a proportion ``k/n``
  (``(p̂ + z²/2n ± z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)``); it stays inside [0, 1]
  and is not degenerate at 0 or ``n`` successes, unlike the normal approximation. Used
  for accuracies.
- :func:`percentile_interval`: the percentile interval of bootstrap replicates (used by
  the bootstrap AUROC of :mod:`icl_lens.evals.auroc` and by :func:`bootstrap_ratio`).
- :func:`bootstrap_ratio`: a paired percentile bootstrap of ``Σ x / Σ y`` over examples
  (e.g. patched accuracy / full-instruction accuracy on the same test queries).
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np


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


def percentile_interval(replicates, level: float = 0.95) -> tuple[float, float]:
    """The ``(1−level)/2`` and ``(1+level)/2`` quantiles of bootstrap ``replicates`` (NaNs dropped)."""
    _z(level)
    reps = np.asarray(replicates, dtype=float)
    reps = reps[np.isfinite(reps)]
    if reps.size == 0:
        raise ValueError("no finite bootstrap replicates")
    alpha = (1 - level) / 2
    low, high = np.quantile(reps, [alpha, 1 - alpha])
    return float(low), float(high)


def bootstrap_ratio(x, y, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float] | None:
    """Paired percentile-bootstrap interval of ``Σx / Σy`` (examples resampled together); None if ``Σy = 0``.

    Resamples whose ``Σy`` is 0 are dropped.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError("x and y must be non-empty 1-D arrays of the same length")
    if y.sum() == 0:
        return None
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(x.size, np.full(x.size, 1.0 / x.size), size=n_boot).astype(float)
    den = counts @ y
    ok = den > 0
    return percentile_interval((counts[ok] @ x) / den[ok], level)
