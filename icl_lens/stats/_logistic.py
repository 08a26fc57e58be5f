"""L2-regularised logistic regression (torch, float64) and grouped cross-validation folds.

For standardised features ``x̃ = (x − μ)/σ`` (``μ``, ``σ`` of the training rows; ``σ = 1``
where a feature is constant) and labels ``y ∈ {0, 1}`` the fit minimises

    L(w, b) = (1/n) Σ_i [ log(1 + exp(s_i)) − y_i s_i ] + (λ/2) ‖w‖²,   s_i = w·x̃_i + b

(the bias is not penalised). ``L`` is strictly convex in ``w`` for ``λ > 0``. Its gradient and
Hessian are

    ∇_w L = x̃ᵀ(σ(s) − y)/n + λ w,   ∂_b L = mean(σ(s) − y),
    H = [x̃ 1]ᵀ diag(σ(s)(1 − σ(s))/n) [x̃ 1] + diag(λ, …, λ, 0).

Up to :data:`NEWTON_MAX_FEATURES` features it is minimised by Newton's method with a
backtracking (Armijo) line search, which does not slow down on the strongly correlated
per-layer features; above that (hidden states, where a ``d × d`` solve per step costs more
than it saves) by L-BFGS with a strong Wolfe line search. Both stop when the gradient's
largest entry is below ``tol``; a warm start from a neighbouring ``λ``'s solution saves
iterations. With one class only in the training rows the minimiser does not exist
(``b → ±∞``); the fit then returns the constant model ``w = 0``, ``b = logit`` of the
clipped class rate.

``λ`` is chosen by an inner grouped K-fold inside the training rows: the value whose
pooled out-of-fold scores have the highest AUROC (ties: the larger ``λ``); :func:`lambda_path`
keeps every ``λ``'s out-of-fold scores and fold models, and can score within strata instead.

Why not scikit-learn: this is the only model the evaluations need; a few dozen lines of torch
keep the dependency list unchanged, run in float64 on the same threads budget, and are
checked against the optimality condition ``∇L = 0`` in the tests.

Grouped folds: every group (a question's subject) goes to exactly one fold, so no answer
and nothing asked about the same entity is on both sides of a split. Groups are shuffled
with a seed, then assigned largest first to the fold holding the fewest rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from icl_lens.stats._auroc import auroc

LAMBDAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
NEWTON_MAX_FEATURES = 400


@dataclass(frozen=True)
class LogisticModel:
    """A fitted model: ``score(x) = w · (x − mean)/scale + b`` (the log-odds of the positive class)."""

    mean: np.ndarray
    scale: np.ndarray
    w: np.ndarray
    b: float
    lam: float
    iterations: int

    def decision(self, x: np.ndarray) -> np.ndarray:
        return ((np.asarray(x, dtype=float) - self.mean) / self.scale) @ self.w + self.b


def _standardise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(0)
    scale = x.std(0)
    return mean, np.where(scale > 1e-12 * np.maximum(1.0, np.abs(mean)), scale, 1.0)


def logistic_loss(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor, lam: float) -> torch.Tensor:
    """``L(w, b)`` of the module docstring on already standardised ``x``."""
    s = x @ w + b
    return (torch.nn.functional.softplus(s) - y * s).mean() + 0.5 * lam * (w @ w)


def _gradient(xt, yt, w, b, lam):
    s = xt @ w + b
    r = (torch.sigmoid(s) - yt) / len(yt)
    return s, xt.T @ r + lam * w, r.sum().reshape(1)


def _loss(xt, yt, w, b, lam) -> float:
    return float(logistic_loss(xt, yt, w, b[0], lam))


def _newton(xt, yt, w, b, lam, tol, max_iter) -> int:
    """Damped Newton on ``(w, b)`` in place; returns the number of steps."""
    n, d = xt.shape
    xa = torch.cat([xt, torch.ones(n, 1, dtype=xt.dtype)], dim=1)
    ridge = torch.full((d + 1,), lam, dtype=xt.dtype)
    ridge[-1] = 1e-12  # the bias is not penalised; the jitter keeps H invertible under separation
    for step in range(max_iter):
        s, gw, gb = _gradient(xt, yt, w, b, lam)
        g = torch.cat([gw, gb])
        if float(g.abs().max()) < tol:
            return step
        p = torch.sigmoid(s)
        h = (xa * (p * (1 - p) / n)[:, None]).T @ xa + torch.diag(ridge)
        delta = torch.linalg.solve(h, g)
        loss, decrease, t = _loss(xt, yt, w, b, lam), float(g @ delta), 1.0
        while _loss(xt, yt, w - t * delta[:-1], b - t * delta[-1:], lam) > loss - 1e-4 * t * decrease:
            t /= 2
            if t < 1e-10:  # no decrease left at float64 precision: as close as it gets
                return step
        w -= t * delta[:-1]
        b -= t * delta[-1:]
    return max_iter


def _lbfgs(xt, yt, w, b, lam, tol, max_iter) -> int:
    """L-BFGS on ``(w, b)`` in place; returns the number of iterations."""
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, tolerance_grad=tol, tolerance_change=1e-14,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        _, w.grad, b.grad = _gradient(xt, yt, w, b, lam)
        return logistic_loss(xt, yt, w, b[0], lam)

    opt.step(closure)
    return int(opt.state[opt.param_groups[0]["params"][0]].get("n_iter", 0))


def fit_logistic(x, y, *, lam: float, tol: float = 1e-6, max_iter: int = 2000,
                 start: LogisticModel | None = None, method: str | None = None) -> LogisticModel:
    """Minimise ``L`` (module docstring) for one ``λ``.

    ``start``: a model fitted on the same rows to start from; ``method``: ``"newton"``,
    ``"lbfgs"`` or None (Newton up to :data:`NEWTON_MAX_FEATURES` features).
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=bool)
    if x.ndim != 2 or y.shape != (x.shape[0],) or x.shape[0] == 0:
        raise ValueError(f"x must be [n, d] and y [n], got {x.shape} and {y.shape}")
    if not np.isfinite(x).all():
        raise ValueError("features contain NaN or infinite values")
    if not lam > 0:
        raise ValueError(f"lam must be > 0, got {lam!r}")
    mean, scale = _standardise(x)
    rate = float(np.clip(y.mean(), 1e-6, 1 - 1e-6))
    if y.all() or not y.any():
        return LogisticModel(mean, scale, np.zeros(x.shape[1]), float(np.log(rate / (1 - rate))), lam, 0)
    xt = torch.as_tensor((x - mean) / scale, dtype=torch.float64)
    yt = torch.as_tensor(y, dtype=torch.float64)
    w0, b0 = (np.zeros(x.shape[1]), np.log(rate / (1 - rate))) if start is None else (start.w, start.b)
    w = torch.tensor(w0, dtype=torch.float64)
    b = torch.tensor([float(b0)], dtype=torch.float64)
    if method is None:
        method = "newton" if x.shape[1] <= NEWTON_MAX_FEATURES else "lbfgs"
    if method == "newton":
        iterations = _newton(xt, yt, w, b, lam, tol, max_iter)
    elif method == "lbfgs":
        iterations = _lbfgs(xt, yt, w, b, lam, tol, max_iter)
    else:
        raise ValueError(f"method must be 'newton', 'lbfgs' or None, got {method!r}")
    return LogisticModel(mean, scale, w.numpy().copy(), float(b[0]), lam, iterations)


def grouped_folds(groups, k: int, seed: int = 0) -> np.ndarray:
    """Fold index (0..k−1) of every row; rows of one group share a fold (module docstring)."""
    groups = np.asarray(groups)
    names, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    if not 2 <= k <= len(names):
        raise ValueError(f"k must be between 2 and the number of groups ({len(names)}), got {k}")
    order = np.random.default_rng(seed).permutation(len(names))
    order = order[np.argsort(-counts[order], kind="stable")]  # largest first, ties in shuffled order
    load = np.zeros(k, dtype=int)
    fold_of_group = np.empty(len(names), dtype=int)
    for g in order:
        f = int(np.argmin(load))
        fold_of_group[g] = f
        load[f] += counts[g]
    return fold_of_group[inverse]


def _pooled_auroc(scores: np.ndarray, y: np.ndarray) -> float:
    return auroc(scores, y) if 0 < y.sum() < y.size else 0.5


@dataclass(frozen=True)
class LambdaPath:
    """Out-of-fold scores over a ``λ`` grid (:func:`lambda_path`): per ``λ`` the scores of every row by the model
    fitted without its fold, the fold models and the AUROC of those scores; ``best``: the chosen ``λ``."""

    folds: np.ndarray
    oof: dict[float, np.ndarray]
    models: dict[float, tuple[LogisticModel, ...]]
    aurocs: dict[float, float]
    best: float


def lambda_path(x, y, folds, *, lambdas=LAMBDAS, strata=None,
                starts: dict[float, tuple[LogisticModel, ...]] | None = None) -> LambdaPath:
    """Fit every fold (``folds``: fold index per row) at every ``λ``, strongest first; choose the ``λ`` whose
    out-of-fold scores have the highest AUROC (ties: the larger ``λ``): pooled, or within ``strata`` (pairs of one
    stratum only, :func:`icl_lens.stats.auroc`; 0.5 where no stratum holds both classes).

    Each fit starts from ``starts[λ][fold]`` when given (a path over similar rows), else from the previous
    ``λ``'s solution of the same fold.
    """
    x, y, folds = np.asarray(x, dtype=float), np.asarray(y, dtype=bool), np.asarray(folds)
    names = np.unique(folds)
    oof, models, aurocs = {}, {}, {}
    best, best_auc = max(lambdas), -1.0
    previous: dict[int, LogisticModel] = {}
    for lam in sorted(lambdas, reverse=True):
        scores = np.empty(len(y))
        fitted = []
        for i, f in enumerate(names):
            test = folds == f
            start = starts[lam][i] if starts is not None and lam in starts else previous.get(i)
            previous[i] = fit_logistic(x[~test], y[~test], lam=lam, start=start)
            scores[test] = previous[i].decision(x[test])
            fitted.append(previous[i])
        auc = _auroc_or_half(scores, y, strata)
        oof[lam], models[lam], aurocs[lam] = scores, tuple(fitted), auc
        if auc > best_auc + 1e-12:
            best, best_auc = lam, auc
    return LambdaPath(folds, oof, models, aurocs, best)


def _auroc_or_half(scores: np.ndarray, y: np.ndarray, strata=None) -> float:
    if strata is None:
        return _pooled_auroc(scores, y)
    strata = np.asarray(strata)
    if not any(0 < y[strata == s].sum() < (strata == s).sum() for s in np.unique(strata)):
        return 0.5
    return auroc(scores, y, strata)


def choose_lambda(x, y, groups, *, k: int = 5, lambdas=LAMBDAS, seed: int = 0) -> float:
    """The ``λ`` with the best pooled inner out-of-fold AUROC (ties: the larger ``λ``)."""
    k = min(k, len(np.unique(groups)))
    return lambda_path(x, y, grouped_folds(groups, k, seed), lambdas=lambdas).best


def fit_with_inner_cv(x, y, groups, *, k: int = 5, lambdas=LAMBDAS, seed: int = 0) -> LogisticModel:
    """Choose ``λ`` by inner grouped CV on these rows, then fit on all of them."""
    lam = choose_lambda(x, y, groups, k=k, lambdas=lambdas, seed=seed)
    return fit_logistic(x, y, lam=lam)
