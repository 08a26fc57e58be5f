"""Out-of-fold scores of the supervised detectors, and fits on one half scored on the other.

* **Grouped K-fold** (:func:`held_out_scores`): answers are split into ``k`` folds by
  subject (every question about one entity in one fold,
  :func:`icl_lens.stats._logistic.grouped_folds`); each fold is scored by an L2 logistic
  regression fitted on the others, ``λ`` chosen by an inner grouped K-fold on the training
  folds only. Single scores (``−log p``, entropy, length, spike score) need no fitting and
  are used as they are.
* **Calibration half → held-out half** (:func:`averaged_model`): the K fold models of a
  grouped K-fold inside the calibration half, averaged into one linear model (the mean of
  their log-odds, itself linear in the features), score the other half. The calibration
  half's out-of-fold scores come from the same K models, so a Platt scaling and a threshold
  set on them carry over to the held-out half; this is how the shipped detector is fitted.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from icl_lens.stats import LAMBDAS, LogisticModel, fit_with_inner_cv, grouped_folds


@dataclass(frozen=True)
class HeldOut:
    """Held-out (grouped K-fold) scores of one detector, and the λ chosen in each fold."""

    name: str
    family: str
    grouped: np.ndarray
    lambdas: tuple[float, ...] = ()
    models: tuple[LogisticModel, ...] = ()


def supervised(x: np.ndarray, wrong: np.ndarray, groups: np.ndarray, folds: np.ndarray, *, inner_k: int, seed: int,
               desc: str, lambdas=LAMBDAS, pca: int = 0) -> tuple[np.ndarray, tuple[LogisticModel, ...]]:
    """Held-out logistic-regression scores of every fold, and the fold models; ``pca``: first project the
    features on that many principal components of the fold's training rows."""
    scores, chosen = np.empty(len(wrong)), []
    for f in tqdm(np.unique(folds), desc=desc, unit="fold", leave=False):
        test = folds == f
        train_x, test_x = x[~test], x[test]
        if pca:
            mean, comps = pca_basis(train_x, pca)
            train_x, test_x = (train_x - mean) @ comps, (test_x - mean) @ comps
        model = fit_with_inner_cv(train_x, wrong[~test], groups[~test], k=inner_k, lambdas=lambdas, seed=seed)
        scores[test] = model.decision(test_x)
        chosen.append(model)
    return scores, tuple(chosen)


def held_out_scores(feature_sets: dict[str, np.ndarray], single: dict[str, np.ndarray], wrong: np.ndarray,
                    groups: np.ndarray, *, k: int = 5, inner_k: int = 5, lambdas=LAMBDAS,
                    seed: int = 0, pca: dict[str, tuple[str, int]] | None = None) -> dict[str, HeldOut]:
    """Every detector's grouped K-fold held-out scores (module docstring), by name; ``pca``: name → (feature set,
    components) of PCA-reduced regressions."""
    folds = grouped_folds(groups, k, seed)
    out = {name: HeldOut(name, "single score", s) for name, s in single.items()}
    jobs = [(name, x, 0) for name, x in feature_sets.items()]
    jobs += [(name, feature_sets[source], n) for name, (source, n) in (pca or {}).items()]
    for name, x, n in jobs:
        scores, models = supervised(x, wrong, groups, folds, inner_k=inner_k, seed=seed,
                                    desc=f"logistic regression: {name}", lambdas=lambdas, pca=n)
        out[name] = HeldOut(name, "logistic regression", scores, tuple(m.lam for m in models), models)
    return out


def pca_basis(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, components)`` of the top ``k`` principal components of the rows of ``x`` (components ``d × k``)."""
    mean = x.mean(0)
    _, _, vt = np.linalg.svd(x - mean, full_matrices=False)
    return mean, vt[:k].T


def averaged_model(models: tuple[LogisticModel, ...]) -> LogisticModel:
    """One linear model whose score is the mean of ``models``' scores (on raw features: mean 0, scale 1)."""
    w = np.mean([m.w / m.scale for m in models], axis=0)
    b = float(np.mean([m.b - (m.w / m.scale) @ m.mean for m in models]))
    return LogisticModel(np.zeros_like(w), np.ones_like(w), w, b, float(np.mean([m.lam for m in models])), 0)
