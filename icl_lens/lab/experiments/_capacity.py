"""Can ANY update of ``W_in`` fit the examples? A capacity test beside one-pass SGD (arXiv 2507.16003, §5).

One-pass SGD on ``W_in`` (one pair per step, :mod:`icl_lens.lab.experiments._loss_curves`)
failing to lower the test error does not show that no update of ``W_in`` can: one pass
may be badly conditioned. This experiment fits ``W_in`` (every layer's) on the same pairs
``(xⱼ, yⱼ)`` of each prompt, context-free, two more ways, and measures the normalised test
MSE on the same probe queries (and the MSE on the pairs themselves):

- *ridge least squares* (Gauss–Newton): linearise ``ŷ(xⱼ)`` in ``ΔW = (ΔW_l)_l`` around the
  current weights, ``ŷⱼ + Σ_l Jⱼₗᵀ ΔW_l aⱼₗ`` (``Jⱼₗ = ∂ŷⱼ/∂(W_l aⱼₗ)``, ``aⱼₗ`` the MLP input),
  and solve ``min Σⱼ (rⱼ − ⟨Φⱼ, ΔW⟩)² + λ‖ΔW‖²`` with ``Φⱼ = (Jⱼₗ aⱼₗᵀ)_l`` and
  ``rⱼ = yⱼ − ŷⱼ`` by the package's one least-squares fit
  (:func:`icl_lens.core._least_squares.factored_least_squares`: ``ΔW = Σⱼ cⱼ Φⱼ``,
  ``c = (ΦΦᵀ + λI)⁻¹ r``); ``λ = ridge · tr(ΦΦᵀ)/n`` (the mean eigenvalue of the pairs'
  kernel); repeated ``iterations`` times, damped (Levenberg–Marquardt): a prompt's step is
  kept only when it lowers that prompt's MSE on its pairs, else ``λ`` grows tenfold. The update is applied as rank-1 terms
  ``(cⱼ Jⱼₗ) aⱼₗᵀ``; the features ``Φ`` (``n × L·d_mlp·d_model``) are formed only for these
  tiny lab models;
- *small-step SGD*: ``epochs`` passes over the pairs at ``1/epochs`` of the one-pass rate.

The one-pass SGD (best rate of the sweep) and in-context errors come from the loss curves
of the same prompts and probes.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core._least_squares import factored_least_squares
from icl_lens.lab.experiments._loss_curves import LossCurves
from icl_lens.lab._model import RegressionModel
from icl_lens.lab._regression_dynamics import pair_gradients, sgd_on_pairs
from icl_lens.lab._tasks import sample_prompts
from icl_lens.model._weight_edits import MLPEdit, edits_applied
from icl_lens.stats._bootstrap import bootstrap_mean

METHODS = ("W0", "in context", "SGD one pass", "SGD small steps", "ridge least squares")


@dataclass(frozen=True, eq=False)
class CapacityResult:
    """Per method and prompt: normalised MSE on the probes (``test``) and on the prompt's own pairs (``train``)."""

    name: str
    lr: float
    epochs: int
    ridge: float
    iterations: int
    test: dict[str, Float[Tensor, " prompt"]]
    train: dict[str, Float[Tensor, " prompt"]]

    def summary(self) -> pd.DataFrame:
        """One row per method: mean normalised test (and train) MSE with the test MSE's 95% interval over prompts."""
        rows = []
        for m in METHODS:
            ci = bootstrap_mean(self.test[m].double().numpy())
            train = self.train.get(m)
            rows.append({"method": m, "test_mse": ci.mean, "low": ci.low, "high": ci.high,
                         "train_mse": float(train.double().mean()) if train is not None else float("nan")})
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        frames = [pd.DataFrame({"method": m, "prompt": range(len(v)), "test_mse": v.double().numpy(),
                                "train_mse": (self.train[m].double().numpy() if m in self.train
                                              else [float("nan")] * len(v))}) for m, v in self.test.items()]
        return pd.concat(frames, ignore_index=True)


def _edits(U: Tensor, V: Tensor) -> dict[int, MLPEdit]:
    """``U``/``V`` ``[run, layer, term, d]`` as per-run edits of every layer."""
    return {l: MLPEdit(v=V[:, l, None], u_in=U[:, l, None]) for l in range(U.shape[1])}


@torch.no_grad()
def _predict(model: RegressionModel, x: Float[Tensor, "run m d_x"], U: Tensor, V: Tensor) -> Float[Tensor, "run m"]:
    with edits_applied(model, _edits(U, V)):
        return model(model.query_tokens(x), alone=True)


def ridge_w_in(model: RegressionModel, x: Float[Tensor, "prompt n d_x"], y: Float[Tensor, "prompt n"], *,
               ridge: float = 1e-2, iterations: int = 5) -> tuple[Tensor, Tensor]:
    """Damped Gauss–Newton ridge fit of every layer's ``W_in`` on each prompt's pairs (module docstring).

    Returns the update as rank-1 terms ``U [prompt, layer, term, d_mlp]``, ``V [prompt, layer, term, d_model]``
    (a rejected step's terms are zero).
    """
    if ridge <= 0 or iterations < 1:
        raise ValueError(f"need ridge > 0 and iterations ≥ 1, got {ridge}, {iterations}")
    P, n, _ = x.shape
    L, dt = model.cfg.n_layers, model.dtype
    U = torch.zeros(P, L, 0, model.cfg.d_mlp, dtype=dt)
    V = torch.zeros(P, L, 0, model.cfg.d_model, dtype=dt)
    damping = torch.full((P,), float(ridge), dtype=torch.float64)
    pred = _predict(model, x, U, V)
    loss = ((y - pred) ** 2).mean(-1).double()
    for _ in range(iterations):
        rep = lambda t: t.repeat_interleave(n, 0)  # noqa: E731  (one run per pair)
        # with y = ŷ − 1 the loss gradient of ½(ŷ − y)² is ∂ŷ/∂pre itself
        edits = _edits(rep(U), rep(V)) if U.shape[2] else None
        J, a, _ = pair_gradients(model, x.flatten(0, 1), (pred - 1).flatten(), edits=edits)
        J, a = J.unflatten(0, (P, n)).double(), a.unflatten(0, (P, n)).double()  # prompt, pair, layer, d
        r = (y - pred).double()
        new_u = torch.empty(P, L, n, model.cfg.d_mlp, dtype=torch.float64)
        for b in range(P):
            phi = (J[b, :, :, :, None] * a[b, :, :, None, :]).flatten(1)  # pair × (layer·d_mlp·d_model)
            c, _ = factored_least_squares(r[b, :, None], phi, ridge=float(damping[b]) * float((phi ** 2).sum()) / n)
            new_u[b] = (c[:, 0, None, None] * J[b]).transpose(0, 1)
        cand_U = torch.cat([U, new_u.to(dt)], 2)
        cand_V = torch.cat([V, a.transpose(1, 2).to(dt)], 2)
        cand_pred = _predict(model, x, cand_U, cand_V)
        cand_loss = ((y - cand_pred) ** 2).mean(-1).double()
        keep = cand_loss < loss
        cand_U[~keep, :, U.shape[2]:] = 0  # a rejected step adds nothing
        U, V = cand_U, cand_V
        pred = torch.where(keep[:, None], cand_pred, pred)
        loss = torch.where(keep, cand_loss, loss)
        damping = torch.where(keep, damping, damping * 10)
    return U, V


def capacity_test(model: RegressionModel, curves: LossCurves, *, n_prompts: int = 64, n_probes: int = 32,
                  seed: int = 5, epochs: int = 10, ridge: float = 1e-2, iterations: int = 5) -> CapacityResult:
    """Test error of fits of ``W_in`` on the pairs of the prompts and probes ``curves`` used (same ``seed``)."""
    cfg = model.cfg
    n = curves.n_context
    g = torch.Generator().manual_seed(seed)  # the draw of loss_curves(..., seed=seed)
    p = sample_prompts(n_prompts, n, cfg.d_x, generator=g, dtype=model.dtype, query_flag=cfg.query_flag)
    probes = torch.randn(n_probes, cfg.d_x, generator=g, dtype=model.dtype)
    targets = p.weights @ probes.T
    if targets.shape != curves.targets.shape or not torch.allclose(targets, curves.targets):
        raise ValueError("curves were not computed on these prompts (pass the same n_prompts, n_probes and seed)")
    xs, ys = p.context_pairs()
    mse = lambda f, t: ((f - t) ** 2).mean(-1).double() / cfg.d_x  # noqa: E731
    ctx, ft = curves.errors()
    lr = curves.lrs[curves.best]
    test = {"W0": ctx[:, 0], "in context": ctx[:, -1], "SGD one pass": ft[curves.best][:, -1]}
    train = {}
    none = torch.zeros(n_prompts, cfg.n_layers, 0, cfg.d_mlp, dtype=model.dtype)
    train["W0"] = mse(_predict(model, xs, none, none[..., : cfg.d_model]), ys)
    sgd = sgd_on_pairs(model, xs, ys, lr)
    train["SGD one pass"] = mse(_predict(model, xs, sgd.U, sgd.V), ys)
    small = sgd_on_pairs(model, xs.repeat(1, epochs, 1), ys.repeat(1, epochs), lr / epochs)
    test["SGD small steps"] = mse(_predict(model, probes.expand(n_prompts, -1, -1), small.U, small.V), targets)
    train["SGD small steps"] = mse(_predict(model, xs, small.U, small.V), ys)
    U, V = ridge_w_in(model, xs, ys, ridge=ridge, iterations=iterations)
    test["ridge least squares"] = mse(_predict(model, probes.expand(n_prompts, -1, -1), U, V), targets)
    train["ridge least squares"] = mse(_predict(model, xs, U, V), ys)
    return CapacityResult(curves.name, float(lr), epochs, ridge, iterations, test, train)
