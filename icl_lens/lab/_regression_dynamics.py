"""Implicit learning dynamics of one query, and explicit SGD on the same examples (docs/design.md §3).

Implicit (Dherin et al. 2025, arXiv 2507.16003, §3–4): layer ``l``'s token patch
``ΔW_l(i) = u_l(i) v_l(i)ᵀ`` after ``i`` of the ``n`` context pairs have been consumed, in
one of two orders (both end at the full token patch, ``i = n``, and start at 0):

- ``order="prefix"``: the query sees only ``c₁..cᵢ``; ``W(i)`` makes the query ALONE
  reproduce the output with context ``c₁..cᵢ``. All prefixes come from one batched
  forward (:func:`icl_lens.lab._tasks.prefix_batch`).
- ``order="absorb"`` (the paper's): ``c₁..cᵢ`` are absorbed into the weights while
  ``c_{i+1}..cₙ`` stay in context; ``W(i)`` is the query's patch for the kept set
  ``{c_{i+1}..cₙ, t}`` and, with the kept context tokens patched likewise, reproduces the
  FULL-context output. All steps come from one contextual pass
  (:func:`icl_lens.lab._patching.patches_by_removed_prefix`).

Both give the main :class:`~icl_lens.dynamics._trajectory.Trajectory` (the query is prompt
position ``n``; :func:`reproduced_predictions` gives the outputs it reproduces).
``W(i) − W(i−1)`` is the meta-gradient of pair ``i``; :func:`trajectory_identity_errors`
checks each step's exactness identity.

Explicit: SGD on the context-free model (``ŷ(x)`` = the query token ``x`` run alone), one
pair per step, loss ``½(ŷ(xⱼ) − yⱼ)²``, on the first MLP matrix ``W_in`` of the chosen
layers. A step is rank-1 per layer, ``−η (∂ℓ/∂pre_l) a_lᵀ`` (``a_l`` the MLP input), kept
factored and applied through :mod:`icl_lens.model._weight_edits`. :func:`pair_gradients`
computes these factors for a batch of independent runs, each at its own weights, with the
package's one gradient mechanism (:func:`icl_lens.dynamics._explicit_finetune.dense_gradient_factors`,
which the language-model SGD uses too);
:func:`sgd_on_pairs` chains them into SGD runs (prompts × learning rates at once) and
records the predictions on probe queries after every step.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.dynamics._explicit_finetune import dense_gradient_factors
from icl_lens.dynamics._trajectory import Trajectory
from icl_lens.lab._model import RegressionModel
from icl_lens.lab._patching import lab_token_patches, patched_forward, patches_by_removed_prefix
from icl_lens.lab._tasks import prefix_batch
from icl_lens.model._weight_edits import MLPEdit, edits_applied

ORDERS = ("prefix", "absorb")


def _trajectory(model: RegressionModel, u: Tensor, v: Tensor, correction: Tensor, order: str) -> Trajectory:
    n = u.shape[1] - 1
    return Trajectory(tokens=tuple(["(x,y)"] * n + ["query"]), query=n, layers=tuple(range(u.shape[0])),
                      context_positions=tuple(range(n)), u_in=u, u_gate=None, v=v, correction=correction,
                      model_name=f"lab-{model.cfg.arch}", kept_bos=False, order=order)


def _prompt(model: RegressionModel, context: Tensor, query: Tensor) -> tuple[Tensor, Tensor]:
    context = model.check_tokens(context[None])[0] if context.shape[0] else context.to(model.dtype)
    return context, query.to(model.dtype)


@torch.no_grad()
def implicit_trajectory(model: RegressionModel, context: Float[Tensor, "n d_token"],
                        query: Float[Tensor, " d_token"], *, order: str = "prefix") -> Trajectory:
    """The query's token patches after each of the ``n + 1`` steps of consuming the context, all layers
    (prompt position ``i`` is context pair ``cᵢ₊₁``, position ``n`` the query)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    context, query = _prompt(model, context, query)
    if order == "prefix":
        rows = prefix_batch(context, query)
        patches = lab_token_patches(model, rows)
        idx = torch.arange(rows.shape[0])
        return _trajectory(model, patches.u_in[:, idx, idx], patches.v[:, idx, idx], patches.correction[:, idx, idx],
                           order)
    full = torch.cat([context, query[None]])[None]
    steps = patches_by_removed_prefix(model, full, range(context.shape[0] + 1))
    u, v, corr = (torch.stack([getattr(p, k)[:, 0, -1] for p in steps], dim=1) for k in ("u_in", "v", "correction"))
    return _trajectory(model, u, v, corr, order)


@torch.no_grad()
def reproduced_predictions(model: RegressionModel, context: Float[Tensor, "n d_token"],
                           query: Float[Tensor, " d_token"], *, order: str = "prefix") -> Float[Tensor, " n_plus_1"]:
    """The output the patched query reproduces at each step ``i = 0..n`` of :func:`implicit_trajectory`:
    the model with context ``c₁..cᵢ`` (``order="prefix"``), or the full-context output (``"absorb"``)."""
    context, query = _prompt(model, context, query)
    if order == "prefix":
        idx = torch.arange(context.shape[0] + 1)
        return model(prefix_batch(context, query))[idx, idx]
    return model(torch.cat([context, query[None]])[None])[0, -1].expand(context.shape[0] + 1).clone()


def step_edits(traj: Trajectory, steps: int | None = None) -> dict[int, MLPEdit]:
    """``W(i)`` of a lab trajectory as per-row edits: input row ``i`` (a single token) gets step ``i``,
    for the first ``steps`` steps (default all ``n + 1``)."""
    k = traj.n_context + 1 if steps is None else steps
    return {l: MLPEdit(v=traj.v[l, :k, None, None], u_in=traj.u_in[l, :k, None, None], bias=traj.correction[l, :k, None])
            for l in range(traj.v.shape[0])}


@torch.no_grad()
def trajectory_identity_errors(model: RegressionModel, context: Float[Tensor, "n d_token"],
                               query: Float[Tensor, " d_token"], traj: Trajectory) -> Float[Tensor, " n_plus_1"]:
    """Per step ``i``: |patched prediction − reference| / max(|reference|), the exactness identity of each order.

    ``prefix``: the query ALONE with ``W(i)`` vs the model on ``[c₁..cᵢ, x_q]`` (a forward of its own).
    ``absorb``: ``[c_{i+1}..cₙ, x_q]`` with ``W(i)`` at the query and every kept context token's own
    patch for the removal of ``c₁..cᵢ``, vs the model on the full prompt.
    """
    context, query = context.to(model.dtype), query.to(model.dtype)
    n = context.shape[0]
    if traj.n_context != n:
        raise ValueError(f"the trajectory has {traj.n_context} context pairs, the prompt {n}")
    full = torch.cat([context, query[None]])[None]
    if traj.order == "prefix":
        reference = torch.stack([model(full[:, list(range(i)) + [n]])[0, -1] for i in range(n + 1)])
        with edits_applied(model, step_edits(traj)):
            got = model(query.expand(n + 1, 1, -1))[:, 0]
    else:
        reference = model(full)[0, -1].expand(n + 1)
        got = []
        for i, p in enumerate(patches_by_removed_prefix(model, full, range(n + 1))):
            p.u_in[:, 0, -1], p.v[:, 0, -1], p.correction[:, 0, -1] = traj.u_in[:, i], traj.v[:, i], traj.correction[:, i]
            got.append(patched_forward(model, full, p, removed_prefix=i)[0, -1])
        got = torch.stack(got)
    return (got - reference).abs() / reference.abs().max()


def _layers(model: RegressionModel, layers: Sequence[int] | None) -> tuple[int, ...]:
    L = model.cfg.n_layers
    out = tuple(range(L)) if layers is None else tuple(sorted({int(l) % L for l in layers}))
    if layers is not None and any(not -L <= int(l) < L for l in layers):
        raise ValueError(f"layers must lie in 0..{L - 1}, got {tuple(layers)}")
    if not out:
        raise ValueError("layers is empty")
    return out


def pair_gradients(model: RegressionModel, x: Float[Tensor, "run d_x"], y: Float[Tensor, " run"], *,
                   edits: dict[int, MLPEdit] | None = None, layers: Sequence[int] | None = None
                   ) -> tuple[Float[Tensor, "run layer d_mlp"], Float[Tensor, "run layer d_model"], Float[Tensor, " run"]]:
    """Gradient factors of ``ℓ_r = ½(ŷ(x_r) − y_r)²`` w.r.t. each layer's ``W_in``, one run per row.

    Row ``r`` runs the query token of ``x_r`` alone, with ``edits`` applied (leading
    dimensions ``(run, 1)``: each run at its own weights). Returns ``g`` (``∂ℓ/∂pre``),
    ``a`` (the MLP input; ``∇_{W_in} ℓ = g aᵀ``) for the chosen layers, and the losses.
    """
    layers = _layers(model, layers)
    tok = model.query_tokens(x)[:, None]
    losses: list[Tensor] = []

    def forward_loss() -> Tensor:
        losses.append(0.5 * (model(tok)[:, 0] - y.to(model.dtype)) ** 2)
        return losses[0].sum()

    _, g, _, a = dense_gradient_factors(model, forward_loss, tuple(tok.shape[:2]), dtype=model.dtype,
                                        device=tok.device, edits=edits, layers=layers)
    return g[:, :, 0].transpose(0, 1), a[:, :, 0].transpose(0, 1), losses[0].detach()


@dataclass(frozen=True, eq=False)
class ExplicitSGD:
    """SGD runs on context pairs: step ``j`` of run ``r`` adds ``U[r, k, j] V[r, k, j]ᵀ`` to ``W_in`` of ``layers[k]``.

    ``probe_predictions[r, i, p]``: the context-free prediction on probe query ``p`` after
    ``i`` steps (``i = 0..n``), when probes were given.
    """

    U: Float[Tensor, "run layer n d_mlp"]
    V: Float[Tensor, "run layer n d_model"]
    losses: Float[Tensor, "run n"]
    lr: Float[Tensor, " run"]
    layers: tuple[int, ...]
    probe_predictions: Float[Tensor, "run n_plus_1 probe"] | None = None

    def to_frame(self) -> pd.DataFrame:
        R, n = self.losses.shape
        return pd.DataFrame({"run": torch.arange(R).repeat_interleave(n).numpy(),
                             "lr": self.lr.double().repeat_interleave(n).numpy(),
                             "step": torch.arange(1, n + 1).repeat(R).numpy(),
                             "loss": self.losses.flatten().double().numpy()})


def _edits(U: Tensor, V: Tensor, layers: tuple[int, ...], steps: int) -> dict[int, MLPEdit]:
    return {l: MLPEdit(v=V[:, k, None, :steps], u_in=U[:, k, None, :steps]) for k, l in enumerate(layers)} if steps else {}


def sgd_on_pairs(model: RegressionModel, x: Float[Tensor, "run n d_x"], y: Float[Tensor, "run n"],
                 lr: float | Float[Tensor, " run"], *, probes: Float[Tensor, "run probe d_x"] | None = None,
                 layers: Sequence[int] | None = None) -> ExplicitSGD:
    """Independent SGD runs (one per row, each with its own pairs and rate), one pair per step, in order.

    ``probes``: queries on which every run's context-free prediction is recorded after each step
    (row ``r`` uses ``probes[r]``; a leading size of 1 is shared by all runs).
    """
    layers = _layers(model, layers)
    R, n = y.shape
    lr_t = torch.as_tensor(lr, dtype=model.dtype).expand(R).clone()
    if not (torch.isfinite(lr_t).all() and (lr_t > 0).all()):
        raise ValueError(f"learning rates must be positive and finite, got {lr}")
    U = torch.zeros(R, len(layers), n, model.cfg.d_mlp, dtype=model.dtype)
    V = torch.zeros(R, len(layers), n, model.cfg.d_model, dtype=model.dtype)
    losses = torch.zeros(R, n, dtype=model.dtype)
    preds = []
    probe_tokens = None if probes is None else model.query_tokens(probes).expand(R, -1, -1)

    def probe(steps: int) -> None:
        if probe_tokens is not None:
            with torch.no_grad(), edits_applied(model, _edits(U, V, layers, steps)):
                preds.append(model(probe_tokens, alone=True))

    probe(0)
    for j in range(n):
        g, a, losses[:, j] = pair_gradients(model, x[:, j], y[:, j], edits=_edits(U, V, layers, j), layers=layers)
        U[:, :, j], V[:, :, j] = -lr_t[:, None, None] * g, a
        probe(j + 1)
    return ExplicitSGD(U, V, losses, lr_t, layers, torch.stack(preds, 1) if preds else None)


def explicit_sgd(model: RegressionModel, x: Float[Tensor, "n d_x"], y: Float[Tensor, " n"], *, lr: float = 1e-2,
                 layers: Sequence[int] | None = None) -> ExplicitSGD:
    """One SGD run on the pairs ``(xⱼ, yⱼ)`` of one prompt (a single row of :func:`sgd_on_pairs`)."""
    return sgd_on_pairs(model, x[None], y[None], lr, layers=layers)
