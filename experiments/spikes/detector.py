"""Out-of-fold scores of the supervised detectors and the baselines, in two cross-validations.

* **Grouped K-fold**: answers are split into ``k`` folds by subject (every question about
  one entity in one fold, :func:`icl_lens.stats.logistic.grouped_folds`); each fold is
  scored by a logistic regression fitted on the others, ``λ`` chosen by an inner grouped
  K-fold on the training folds only.
* **Leave one kind out**: each kind of question is scored by a model fitted on all the
  other kinds, so a detector that has learnt "which kind of question is this" gains
  nothing; only what transfers to an unseen kind counts.

Each answer thus gets one held-out score per detector and scheme; AUROCs are computed on
those pooled scores. "Kind only" is the error rate of the answer's kind in the training
folds (smoothed ``(wrong + 1)/(n + 2)``); with its kind held out, that kind is unseen and
the score is the training folds' overall error rate. Single scores (``−log p``, entropy,
spike score) are fixed in advance and need no fitting: the same value in both schemes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from icl_lens.stats.logistic import LAMBDAS, fit_with_inner_cv, grouped_folds


@dataclass(frozen=True)
class HeldOut:
    """Held-out scores of one detector: grouped K-fold and leave-one-kind-out (None: not applicable)."""

    name: str
    family: str
    grouped: np.ndarray
    kind_held_out: np.ndarray
    lambdas: tuple[float, ...] = ()


def kind_only(wrong: np.ndarray, kinds: np.ndarray, folds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    grouped = np.empty(len(wrong))
    for f in np.unique(folds):
        test, train = folds == f, folds != f
        for kind in np.unique(kinds[test]):
            seen = train & (kinds == kind)
            grouped[test & (kinds == kind)] = (wrong[seen].sum() + 1) / (seen.sum() + 2)
    held = np.empty(len(wrong))
    for kind in np.unique(kinds):
        held[kinds == kind] = wrong[kinds != kind].mean()
    return grouped, held


def supervised(x: np.ndarray, wrong: np.ndarray, groups: np.ndarray, kinds: np.ndarray, folds: np.ndarray, *,
               inner_k: int, seed: int, desc: str, lambdas=LAMBDAS) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
    """Held-out logistic-regression scores (grouped K-fold, leave one kind out) and the chosen ``λ``s."""
    splits = [("fold", folds == f) for f in np.unique(folds)] + [("kind", kinds == k) for k in np.unique(kinds)]
    grouped, held = np.empty(len(wrong)), np.empty(len(wrong))
    chosen = []
    for scheme, test in tqdm(splits, desc=desc, unit="split", leave=False):
        model = fit_with_inner_cv(x[~test], wrong[~test], groups[~test], k=inner_k, lambdas=lambdas, seed=seed)
        (grouped if scheme == "fold" else held)[test] = model.decision(x[test])
        chosen.append(model.lam)
    return grouped, held, tuple(chosen)


def held_out_scores(feature_sets: dict[str, np.ndarray], single: dict[str, np.ndarray], wrong: np.ndarray,
                    groups: np.ndarray, kinds: np.ndarray, *, k: int = 5, inner_k: int = 5, lambdas=LAMBDAS,
                    seed: int = 0) -> list[HeldOut]:
    """Every detector's held-out scores (module docstring), in report order."""
    folds = grouped_folds(groups, k, seed)
    out = [HeldOut("kind only", "kind", *kind_only(wrong, kinds, folds))]
    out += [HeldOut(name, "single score", s, s) for name, s in single.items()]
    for name, x in feature_sets.items():
        grouped, held, chosen = supervised(x, wrong, groups, kinds, folds, inner_k=inner_k, seed=seed,
                                           desc=f"logistic regression: {name}", lambdas=lambdas)
        out.append(HeldOut(name, "logistic regression", grouped, held, chosen))
    return out
