"""Percentile bootstrap over examples (numpy), shared by every confidence interval in icl_lens.

A resample draws ``n`` examples with replacement; it is a count vector ``w`` (how often
each example was drawn, ``Σ w = n``), so a statistic that is a weighted sum over examples
costs one matrix product for all resamples: the mean of resample ``b`` is
``Σ_i w_bi x_i / n``. The interval is the ``(1−level)/2`` and ``(1+level)/2`` quantiles
of the resampled statistic (Efron's percentile interval).

**Cluster bootstrap** (``groups=``): when examples come in clusters that are not
independent (several questions about one subject), a resample draws ``G`` clusters with
replacement from the ``G`` clusters, and every example counts as often as its cluster was
drawn: ``w_bi = c_b,g(i)`` (Davison & Hinkley 1997, §3.8). Examples of one cluster then
always enter and leave a resample together, so the interval reflects the number of
independent units, not the number of examples. Used for the signed mean
cosines of the alignment evaluations, for patched/full accuracy ratios (:func:`bootstrap_ratio`)
and, through :func:`resample_counts`, for AUROC
(:mod:`icl_lens.stats._auroc`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def resample_counts(n: int, n_boot: int = 2000, seed: int = 0, groups=None) -> np.ndarray:
    """``n_boot × n`` counts: row ``b`` says how often each example is in resample ``b``.

    ``groups``: one cluster label per example; clusters are resampled, and each example
    takes its cluster's count (module docstring). None: examples are resampled one by one.
    """
    if n < 1 or n_boot < 1:
        raise ValueError(f"need n ≥ 1 examples and n_boot ≥ 1 resamples, got {n} and {n_boot}")
    rng = np.random.default_rng(seed)
    if groups is None:
        return rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(float)
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"groups must hold one label per example ({n}), got shape {groups.shape}")
    names, index = np.unique(groups, return_inverse=True)
    g = len(names)
    return rng.multinomial(g, np.full(g, 1.0 / g), size=n_boot).astype(float)[:, index]


def row_nanmean(x: np.ndarray) -> np.ndarray:
    """Mean of each row over its finite entries, for the rows that have one (e.g. resamples × strata, a stratum
    whose resample lacks a class being NaN): rows with no finite entry are dropped."""
    ok = np.isfinite(x)
    keep = ok.any(axis=1)
    return np.where(ok, x, 0.0)[keep].sum(1) / ok[keep].sum(1)


def percentile_interval(resampled: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The ``level`` percentile interval of resampled statistics."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    alpha = (1 - level) / 2
    low, high = np.quantile(np.asarray(resampled, dtype=float), [alpha, 1 - alpha])
    return float(low), float(high)


@dataclass(frozen=True)
class MeanCI:
    """A mean over ``n`` examples with its percentile-bootstrap interval ``[low, high]``."""

    mean: float
    low: float
    high: float
    n: int

    def excludes(self, value: float = 0.0) -> bool:
        """Whether the interval lies entirely above or below ``value``."""
        return self.low > value or self.high < value

    def __str__(self) -> str:
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def bootstrap_mean(values, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95, groups=None) -> MeanCI:
    """Mean of ``values`` (one per example) with a percentile-bootstrap ``level`` interval (clusters: ``groups``)."""
    x = np.asarray(values, dtype=float).reshape(-1)
    if x.size == 0:
        raise ValueError("bootstrap_mean needs at least one value")
    if not np.isfinite(x).all():
        raise ValueError("bootstrap_mean needs finite values")
    counts = resample_counts(x.size, n_boot, seed, groups)
    boots = counts @ x / counts.sum(1)
    low, high = percentile_interval(boots, level)
    return MeanCI(float(x.mean()), low, high, int(x.size))


def bootstrap_ratio(x, y, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95,
                    groups=None) -> tuple[float, float] | None:
    """Paired percentile-bootstrap interval of ``Σx / Σy`` (examples resampled together); None if ``Σy = 0``.

    E.g. patched accuracy / full-instruction accuracy on the same test queries. Resamples
    whose ``Σy`` is 0 are dropped. ``groups``: resample clusters (module docstring).
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError("x and y must be non-empty 1-D arrays of the same length")
    if y.sum() == 0:
        return None
    counts = resample_counts(x.size, n_boot, seed, groups)
    den = counts @ y
    ok = den > 0
    return percentile_interval((counts[ok] @ x) / den[ok], level)
