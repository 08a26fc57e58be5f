"""Leave-one-kind-out: every candidate detector fitted without a kind of question, scored on that kind (issue 37).

The question that matters to a user is whether a detector holds on questions of a kind that
was never in the question bank. Subjects are split in two halves (seeded,
:func:`.calibration.calibration_split`); for every kind ``k`` (template stratum,
:func:`experiments.factual_prompts.stratum`) and every candidate:

* **fit** on the calibration half's answers of every kind but ``k``
  (:func:`fit_candidate`): ``λ`` by an inner K-fold grouped **by kind** (so the inner
  validation also scores kinds the fit did not see), chosen by the within-kind AUROC of the
  out-of-fold scores (:func:`icl_lens.stats.lambda_path`); the detector is the average of the
  chosen ``λ``'s fold models (:func:`.detector.averaged_model`), its out-of-fold scores give
  the Platt scaling ``p_wrong = σ(α s + β)`` and the threshold (at most 5% of those rows'
  correct answers above it, one-sided 95% Wilson bound: :func:`.calibration.threshold_for_rate`).
  The PCA candidate first projects the hidden state on the top principal components of the
  rows it is fitted on. A single score (−log p, entropy, length, sampling disagreement, the
  spike score) needs no fit: Platt and threshold come from the same rows' scores;
* **score** the held-out half's answers of kind ``k``: scores, ``p_wrong``, flags.

Every held-out answer is then scored by a model that never saw its kind, nor its subject.
AUROC: the mean over kinds of the within-kind AUROC (kinds whose held-out half holds both
correct and wrong answers; :func:`icl_lens.stats.stratum_mean_auroc`), with a bootstrap that
resamples subjects within each kind; differences are paired (same resamples). Nothing about
kind ``k`` — rows, ``λ``, PCA basis, Platt, threshold — comes from kind ``k``.

The shipped detector is fitted the same way on the whole calibration half (all kinds):
:func:`fit_candidate` with ``train = calibrate``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from experiments.spikes.calibration import threshold_for_rate
from experiments.spikes.detector import averaged_model, pca_basis
from icl_lens.stats import LAMBDAS, LogisticModel, fit_logistic, grouped_folds, lambda_path

TARGET_RATE = 0.05


def platt(scores: np.ndarray, wrong: np.ndarray) -> tuple[float, float]:
    """``(α, β)`` of ``p = σ(α s + β)`` fitted on scores and labels (a one-feature logistic fit, tiny λ)."""
    m = fit_logistic(np.asarray(scores, dtype=float)[:, None], wrong, lam=1e-6)
    a = float(m.w[0] / m.scale[0])
    return a, float(m.b - a * m.mean[0])


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=float)))


@dataclass(frozen=True)
class Fitted:
    """One candidate fitted on some rows (module docstring); ``model`` is None for a single score."""

    name: str
    model: LogisticModel | None
    platt: tuple[float, float]
    threshold: float  # on p_wrong
    oof: np.ndarray  # scores of the rows it was fitted on (out of fold for a regression)
    basis: tuple[np.ndarray, np.ndarray] | None = None  # PCA (mean, components) applied before the model
    aurocs_by_lambda: dict[float, float] = field(default_factory=dict)
    fold_models: dict[float, tuple[LogisticModel, ...]] = field(default_factory=dict, repr=False)

    def decision(self, x: np.ndarray) -> np.ndarray:
        """Scores of rows ``x`` (features of a regression, or the single score itself)."""
        x = np.asarray(x, dtype=float)
        if self.model is None:
            return x
        if self.basis is not None:
            x = (x - self.basis[0]) @ self.basis[1]
        return self.model.decision(x)

    def p_wrong(self, scores: np.ndarray) -> np.ndarray:
        a, b = self.platt
        return sigmoid(a * np.asarray(scores, dtype=float) + b)

    def linear_on_raw(self) -> tuple[np.ndarray, float]:
        """``(w, b)`` with ``decision(x) = w · x + b`` on the raw features (PCA and standardisation folded in)."""
        if self.model is None:
            return np.ones(1), 0.0
        w = self.model.w / self.model.scale
        b = float(self.model.b - w @ self.model.mean)
        if self.basis is not None:
            mean, comps = self.basis
            w_raw = comps @ w
            return w_raw, float(b - w_raw @ mean)
        return w, b


def fit_candidate(name: str, x: np.ndarray, train: np.ndarray, wrong: np.ndarray, strata: np.ndarray, *,
                  supervised: bool, inner_k: int, lambdas=LAMBDAS, seed: int = 0, pca: int = 0,
                  rate: float = TARGET_RATE, starts=None) -> Fitted:
    """Fit one candidate on the rows ``train`` (module docstring). ``x``: [n, d] features of every row (a
    regression) or [n] scores (a single score); ``pca``: components to keep (0: none)."""
    y = wrong[train]
    if not supervised:
        oof = np.asarray(x, dtype=float)[train]
        a, b = platt(oof, y)
        return Fitted(name, None, (a, b), _threshold(sigmoid(a * oof + b), y, rate), oof)
    xs = np.asarray(x, dtype=float)[train]
    basis = None
    if pca:
        basis = pca_basis(xs, pca)
        xs = (xs - basis[0]) @ basis[1]
    kinds = strata[train]
    folds = grouped_folds(kinds, min(inner_k, len(np.unique(kinds))), seed)
    path = lambda_path(xs, y, folds, lambdas=lambdas, strata=kinds, starts=starts)
    model = averaged_model(path.models[path.best])
    oof = path.oof[path.best]
    a, b = platt(oof, y)
    return Fitted(name, model, (a, b), _threshold(sigmoid(a * oof + b), y, rate), oof, basis,
                  dict(path.aurocs), dict(path.models))


def _threshold(p: np.ndarray, wrong: np.ndarray, rate: float) -> float:
    correct = p[~wrong]
    return threshold_for_rate(correct, rate) if correct.size else float("inf")


@dataclass(frozen=True)
class Candidate:
    """A detector under test: a regression on features (``x`` [n, d]) or a single score (``x`` [n])."""

    name: str
    x: np.ndarray
    supervised: bool
    pca: int = 0

    @property
    def n_features(self) -> int:
        return self.pca or (self.x.shape[1] if self.supervised else 1)


@dataclass(frozen=True)
class KindOut:
    """Every candidate's leave-one-kind-out readings of the held-out half (NaN on calibration rows)."""

    scores: dict[str, np.ndarray]
    p_wrong: dict[str, np.ndarray]
    flagged: dict[str, np.ndarray]
    kinds: tuple[str, ...]  # the kinds left out in turn (those with held-out answers)
    lambdas: dict[str, dict[str, float]]  # candidate → kind → chosen λ


def leave_one_kind_out(candidates: list[Candidate], wrong: np.ndarray, strata: np.ndarray, calibrate: np.ndarray, *,
                       inner_k: int, lambdas=LAMBDAS, seed: int = 0, rate: float = TARGET_RATE,
                       progress: bool = True) -> KindOut:
    """For each kind: fit every candidate on the calibration half without that kind, score the kind's held-out
    half (module docstring)."""
    n = len(wrong)
    scores = {c.name: np.full(n, np.nan) for c in candidates}
    p_wrong = {c.name: np.full(n, np.nan) for c in candidates}
    flagged = {c.name: np.zeros(n, bool) for c in candidates}
    chosen: dict[str, dict[str, float]] = {c.name: {} for c in candidates}
    kinds = tuple(k for k in sorted(np.unique(strata).tolist()) if ((strata == k) & ~calibrate).any())
    paths: dict[str, dict] = {}
    for kind in tqdm(kinds, desc="leave one kind out", unit="kind", disable=not progress):
        train = calibrate & (strata != kind)
        test = ~calibrate & (strata == kind)
        for c in candidates:
            fitted = fit_candidate(c.name, c.x, train, wrong, strata, supervised=c.supervised, inner_k=inner_k,
                                   lambdas=lambdas, seed=seed, pca=c.pca, rate=rate, starts=paths.get(c.name))
            s = fitted.decision(c.x[test])
            scores[c.name][test] = s
            p_wrong[c.name][test] = fitted.p_wrong(s)
            flagged[c.name][test] = p_wrong[c.name][test] > fitted.threshold
            if fitted.model is not None:
                chosen[c.name][kind] = fitted.model.lam
                if not c.pca:  # the next kind's fits start here (a PCA basis changes with the rows)
                    paths[c.name] = fitted.fold_models
    return KindOut(scores, p_wrong, flagged, kinds, chosen)
