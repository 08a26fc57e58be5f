"""Implicit learning dynamics of one query, and explicit SGD on the same examples (docs/design.md §3).

Implicit (Dherin et al. 2025, arXiv 2507.16003, §4): with the first ``i`` context pairs
in front of the query, layer ``l``'s token patch ``ΔW_l(i) = u_l(i) v_l(i)ᵀ`` makes the
context-free query reproduce the output with context ``c₁..cᵢ`` (every earlier layer
patched likewise). ``W_l(i) = W_l + ΔW_l(i)`` is the implicit trajectory and
``ΔW_l(i) − ΔW_l(i−1)`` the meta-gradient of pair ``i`` (norm in closed form,
:func:`icl_lens.core.factored.diff_norm`). All prefixes come from one batched forward
(:func:`icl_lens.lab.tasks.prefix_batch`).

Explicit: SGD on the same pairs, one pair per step, on the context-free model
(``ŷ(x) = model([x, 0, 1])``, loss ``½(ŷ(xⱼ) − yⱼ)²``), updating every layer's ``W_in``.
Each step is rank-1 per layer, ``−η (∂L/∂pre_l) a_lᵀ``, kept factored.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core.factored import diff_norm
from icl_lens.lab.model import RegressionModel
from icl_lens.lab.patching import lab_token_patches
from icl_lens.lab.tasks import prefix_batch, query_tokens
from icl_lens.model.weight_edits import MLPEdit, edits_applied


@dataclass(frozen=True, eq=False)
class ImplicitTrajectory:
    """``ΔW_l(i) = u[l, i] v[l, i]ᵀ`` for ``i = 0..n`` context pairs seen, and the predictions."""

    arch: str
    u: Float[Tensor, "layer n_plus_1 d_mlp"]
    v: Float[Tensor, "layer n_plus_1 d_model"]
    predictions: Float[Tensor, " n_plus_1"]

    @property
    def n_context(self) -> int:
        return self.u.shape[1] - 1

    def step_norms(self) -> Float[Tensor, "layer n"]:
        """Meta-gradient norms ``‖ΔW_l(i) − ΔW_l(i−1)‖_F`` for ``i = 1..n``."""
        return diff_norm(self.u[:, 1:], self.v[:, 1:], self.u[:, :-1], self.v[:, :-1])

    def to_frame(self) -> pd.DataFrame:
        steps = self.step_norms().double()
        L, n = steps.shape
        return pd.DataFrame({"layer": torch.arange(L).repeat_interleave(n).numpy(),
                             "pairs_seen": torch.arange(1, n + 1).repeat(L).numpy(),
                             "meta_gradient_norm": steps.flatten().numpy()})


@torch.no_grad()
def implicit_trajectory(model: RegressionModel, context: Float[Tensor, "n d_token"],
                        query: Float[Tensor, " d_token"]) -> ImplicitTrajectory:
    """The query's token patches after each prefix ``c₁..cᵢ`` of the context, all layers."""
    rows = prefix_batch(model.check_tokens(context[None])[0], query.to(model.dtype))
    patches = lab_token_patches(model, rows)
    idx = torch.arange(rows.shape[0])
    return ImplicitTrajectory(model.cfg.arch, patches.u[:, idx, idx], patches.v[:, idx, idx], model(rows)[idx, idx])


@dataclass(frozen=True, eq=False)
class ExplicitSGD:
    """SGD steps on context pairs: step ``j`` adds ``U[l, j] V[l, j]ᵀ`` to layer ``l``'s ``W_in``."""

    U: Float[Tensor, "layer n d_mlp"]
    V: Float[Tensor, "layer n d_model"]
    losses: Float[Tensor, " n"]
    lr: float

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"step": range(1, len(self.losses) + 1), "loss": self.losses.double().numpy()})


def explicit_sgd(model: RegressionModel, x: Float[Tensor, "n d_x"], y: Float[Tensor, " n"], *, lr: float = 1e-2) -> ExplicitSGD:
    """One SGD step per pair ``(xⱼ, yⱼ)`` on all layers' ``W_in`` of the context-free model (factored)."""
    L = len(model.blocks)
    n = x.shape[0]
    U = torch.zeros(L, n, model.cfg.d_mlp, dtype=model.dtype)
    V = torch.zeros(L, n, model.cfg.d_model, dtype=model.dtype)
    losses = torch.zeros(n, dtype=model.dtype)
    for j in range(n):
        store: dict[str, Tensor] = {}
        def keep(t, hook):
            store[hook.name] = t
        extra = [(f"blocks.{l}.hook_mlp_in", keep) for l in range(L)] + [(f"blocks.{l}.mlp.hook_pre", keep) for l in range(L)]
        edits = {l: MLPEdit(v=V[l, :j], u_in=U[l, :j]) for l in range(L)} if j else {}
        tok = query_tokens(x[j].to(model.dtype))[None, None].requires_grad_(True)
        with torch.enable_grad(), edits_applied(model, edits, extra_hooks=extra):
            loss = 0.5 * (model(tok)[0, 0] - y[j].to(model.dtype)) ** 2
            pres = [store[f"blocks.{l}.mlp.hook_pre"] for l in range(L)]
            grads = torch.autograd.grad(loss, pres)
        for l in range(L):
            U[l, j] = -lr * grads[l][0, 0]
            V[l, j] = store[f"blocks.{l}.hook_mlp_in"][0, 0].detach()
        losses[j] = loss.detach()
    return ExplicitSGD(U, V, losses, lr)
