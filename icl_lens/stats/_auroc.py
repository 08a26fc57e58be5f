"""AUROC with ties and a percentile-bootstrap confidence interval (numpy only).

``AUROC = P(s⁺ > s⁻) + ½ P(s⁺ = s⁻)`` over pairs of a positive and a negative example
(the Mann–Whitney U statistic divided by ``n⁺ n⁻``). The bootstrap resamples examples
with replacement; a resample is a weight vector ``w`` (counts), and
``AUROC(w) = Σ_ij w⁺_i K_ij w⁻_j / (Σ w⁺)(Σ w⁻)`` with ``K_ij = [s⁺_i > s⁻_j] + ½[s⁺_i = s⁻_j]``,
so all resamples cost one matrix product (resamples from :mod:`icl_lens.stats._bootstrap`).
Resamples without both classes are dropped. ``groups=``: resample clusters of examples
(subjects) instead of examples (:func:`icl_lens.stats._bootstrap.resample_counts`).

Stratified (within-group) AUROC, ``strata=``: only pairs whose two examples share a
stratum count, ``Σ_ij S_ij K_ij / Σ_ij S_ij`` with ``S_ij = [stratum⁺_i = stratum⁻_j]``; it
removes what a score gains merely by telling the strata (e.g. question kinds) apart.

Paired difference of two scores on the same examples: both AUROCs are computed on the
same resamples, and the interval is the percentile interval of ``AUROC_a(w) − AUROC_b(w)``.

Mean over strata (:func:`stratum_mean_auroc`): ``(1/S) Σ_s AUROC_s`` over the ``S`` strata
holding both classes (e.g. the kinds of question, each scored by a model that never saw it);
a resample draws clusters (subjects) *within each stratum*, and a stratum whose resample
lacks a class is left out of that resample's mean.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from icl_lens.stats._bootstrap import percentile_interval, resample_counts, row_nanmean


@dataclass(frozen=True)
class AurocResult:
    auroc: float
    low: float
    high: float
    n_pos: int
    n_neg: int


def _pair_kernel(scores: np.ndarray, positive: np.ndarray, strata=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    pos, neg = scores[positive], scores[~positive]
    kernel = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    if strata is None:
        same = np.ones_like(kernel)
    else:
        strata = np.asarray(strata)
        same = (strata[positive][:, None] == strata[~positive][None, :]).astype(float)
        if not same.any():
            raise ValueError("no stratum holds both a positive and a negative example")
    return kernel * same, same, np.flatnonzero(positive), np.flatnonzero(~positive)


def auroc(scores, positive, strata=None) -> float:
    """AUROC of ``scores`` for predicting ``positive`` (higher score = more likely positive).

    ``strata``: optional group label per example; only pairs within a group count.
    """
    scores, positive = np.asarray(scores, dtype=float), np.asarray(positive, dtype=bool)
    if scores.shape != positive.shape or scores.ndim != 1:
        raise ValueError("scores and positive must be 1-D arrays of the same length")
    if not np.isfinite(scores).all():
        raise ValueError("scores must be finite")
    if positive.all() or not positive.any():
        raise ValueError("AUROC needs at least one positive and one negative example")
    kernel, same, _, _ = _pair_kernel(scores, positive, strata)
    return float(kernel.sum() / same.sum())


@dataclass(frozen=True)
class AurocDifference:
    """``AUROC_a − AUROC_b`` on the same examples, with its paired percentile-bootstrap interval."""

    difference: float
    low: float
    high: float


def _boot_values(scores: np.ndarray, positive: np.ndarray, strata, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AUROC of every resample (``counts``: resamples × examples) and which resamples hold both classes."""
    kernel, same, ipos, ineg = _pair_kernel(scores, positive, strata)
    wp, wn = counts[:, ipos], counts[:, ineg]
    den = ((wp @ same) * wn).sum(1)
    num = ((wp @ kernel) * wn).sum(1)
    ok = den > 0
    return np.where(ok, num / np.where(ok, den, 1.0), np.nan), ok


def bootstrap_auroc(scores, positive, *, strata=None, groups=None, n_boot: int = 2000, seed: int = 0,
                    level: float = 0.95) -> AurocResult:
    """AUROC with a percentile-bootstrap ``level`` confidence interval over examples (over clusters with ``groups``)."""
    scores, positive = np.asarray(scores, dtype=float), np.asarray(positive, dtype=bool)
    point = auroc(scores, positive, strata)
    boots, ok = _boot_values(scores, positive, strata, resample_counts(scores.shape[0], n_boot, seed, groups))
    low, high = percentile_interval(boots[ok], level)
    return AurocResult(point, low, high, int(positive.sum()), int((~positive).sum()))


def bootstrap_auroc_difference(scores_a, scores_b, positive, *, strata=None, groups=None, n_boot: int = 2000,
                               seed: int = 0, level: float = 0.95) -> AurocDifference:
    """``AUROC(scores_a) − AUROC(scores_b)`` with a paired percentile-bootstrap interval (module docstring)."""
    a, b = np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)
    positive = np.asarray(positive, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"the two scores must cover the same examples, got shapes {a.shape} and {b.shape}")
    point = auroc(a, positive, strata) - auroc(b, positive, strata)
    counts = resample_counts(a.shape[0], n_boot, seed, groups)
    boots_a, ok = _boot_values(a, positive, strata, counts)
    boots_b, _ = _boot_values(b, positive, strata, counts)
    low, high = percentile_interval((boots_a - boots_b)[ok], level)
    return AurocDifference(point, low, high)


def resampled_auroc(scores, positive, counts: np.ndarray, strata=None) -> np.ndarray:
    """AUROC of every resample (``counts``: resamples × examples, :func:`icl_lens.stats.resample_counts`);
    NaN where a resample lacks a class."""
    scores, positive = np.asarray(scores, dtype=float), np.asarray(positive, dtype=bool)
    values, _ = _boot_values(scores, positive, strata, counts)
    return values


@dataclass(frozen=True)
class MeanAuroc:
    """The mean over strata of the within-stratum AUROC, its interval, and each stratum's AUROC."""

    auroc: float
    low: float
    high: float
    per_stratum: dict[str, float]

    @property
    def n_strata(self) -> int:
        return len(self.per_stratum)


def _stratum_boots(scores: np.ndarray, positive: np.ndarray, strata: np.ndarray, groups, n_boot: int,
                   seed: int) -> tuple[dict[str, float], np.ndarray]:
    """Each stratum's AUROC and a ``[n_boot, S]`` array of its resampled AUROCs (clusters within the stratum)."""
    point, boots = {}, []
    for i, s in enumerate(sorted(np.unique(strata).tolist())):
        sel = strata == s
        y = positive[sel]
        if not 0 < y.sum() < y.size:
            continue
        point[s] = auroc(scores[sel], y)
        counts = resample_counts(int(sel.sum()), n_boot, seed + i, None if groups is None else np.asarray(groups)[sel])
        boots.append(resampled_auroc(scores[sel], y, counts))
    if not point:
        raise ValueError("no stratum holds both a positive and a negative example")
    return point, np.stack(boots, axis=1)


def stratum_mean_auroc(scores, positive, strata, *, groups=None, n_boot: int = 2000, seed: int = 0,
                       level: float = 0.95) -> MeanAuroc:
    """Mean over strata of the within-stratum AUROC with a percentile interval (module docstring)."""
    scores, positive, strata = np.asarray(scores, dtype=float), np.asarray(positive, dtype=bool), np.asarray(strata)
    point, boots = _stratum_boots(scores, positive, strata, groups, n_boot, seed)
    low, high = percentile_interval(row_nanmean(boots), level)
    return MeanAuroc(float(np.mean(list(point.values()))), low, high, point)


def stratum_mean_auroc_difference(scores_a, scores_b, positive, strata, *, groups=None, n_boot: int = 2000,
                                  seed: int = 0, level: float = 0.95) -> AurocDifference:
    """``mean AUROC(scores_a) − mean AUROC(scores_b)`` over strata, on the same resamples (paired)."""
    a, b = np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)
    positive, strata = np.asarray(positive, dtype=bool), np.asarray(strata)
    pa, ba = _stratum_boots(a, positive, strata, groups, n_boot, seed)
    pb, bb = _stratum_boots(b, positive, strata, groups, n_boot, seed)
    low, high = percentile_interval(row_nanmean(ba - bb), level)
    return AurocDifference(float(np.mean(list(pa.values())) - np.mean(list(pb.values()))), low, high)
