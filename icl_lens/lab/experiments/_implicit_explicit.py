"""Experiment 2 — implicit trajectory vs explicit SGD on the same examples, in weight space (arXiv 2507.16003, §5).

For a prompt ``[c₁ … cₙ, x_q]`` and each layer ``l`` (docs/design.md §3):

- implicit: the query's patch ``Pᵢ = W_l(i) − W_l(0)`` after ``i`` pairs, in the prefix
  order (the query sees ``c₁..cᵢ``) and in the paper's absorb order (``c₁..cᵢ`` absorbed,
  ``c_{i+1}..cₙ`` still in context) (:func:`icl_lens.lab._regression_dynamics.implicit_trajectory`);
- explicit: SGD on the context-free model's ``W_in`` (every layer), one pair per step in
  the same order, loss ``½(ŷ − y)²``, rate ``lr`` (:func:`icl_lens.lab._regression_dynamics.sgd_on_pairs`);
  step ``Eⱼ = −η ∇ℓⱼ``.

Cosines (normalised Frobenius inner products, closed form,
:func:`icl_lens.dynamics._sgd_alignment.trajectory_sgd_cosines`), per prompt, layer and ``i``:

    cumulative(i) = cos(Pᵢ, Σ_{j≤i} Eⱼ),        step(i) = cos(Pᵢ − Pᵢ₋₁, Eᵢ).

Comparisons (keys of :attr:`AlignmentResult.cosines`, ``"<comparison>:<order>:<kind>"``):

- ``sgd``: the SGD run above;
- ``control``: the SGD run of the NEXT prompt (other ``w``, other pairs): what sharing
  the examples adds;
- ``small_lr``: every ``Eⱼ`` taken at ``W₀`` (SGD in the small-rate limit, the protocol
  the language-model evaluation uses);
- ``at_implicit`` (prefix order): ``Eᵢ = −∇ℓᵢ`` taken at the implicit weights ``W(i−1)`` of
  the query, every other layer patched: each layer's own gradient at the point the implicit
  trajectory has reached;
- ``query_input`` (cumulative only): one SGD step on the query's own context-free input
  and held-out label ``(x_q, y_q)`` instead of the pairs;
- ``random``: a uniformly random direction of the same weight space (``|cos| ≈ sqrt(2/(π·dim))``).

End of context (order ``end``, kind ``cumulative``; one value per prompt and layer, the same for both
orders since both end at the full token patch ``Pₙ``): ``sgd:end:cumulative`` = ``cos(Pₙ, Σ_{j≤n} Eⱼ)``
(the update after all ``n`` examples vs the ``n`` SGD steps), ``full_batch:end:cumulative`` =
``cos(Pₙ, −Σⱼ ∇ℓⱼ(W₀))`` (one full-batch gradient step), and their controls ``control:end:cumulative``
and ``full_batch_control:end:cumulative`` (the next prompt's SGD run and full-batch step).

Diagnostics, per order, of the ``sgd`` per-step cosine: ``input_side:<order>:step`` =
``cos(vᵢ, aᵢ)`` between the implicit patch's row factor (the query's context-free MLP input)
and the input ``aᵢ`` that pair ``i``'s gradient is taken on; ``in_share:<order>:step`` and
``out_side:<order>:step`` (:func:`icl_lens.dynamics._sgd_alignment.step_sides`) split the
per-step cosine exactly: ``step = out_side · in_share``, in either order (the implicit step
need not be rank-1; where it is, ``in_share = |cos(v, aᵢ)|``).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.dynamics._sgd_alignment import (
    AlignmentTable,
    step_sides,
    patches_vs_update,
    random_direction_cosines,
    step_gram,
    trajectory_sgd_cosines,
)
from icl_lens.lab._checkpoints import load_lab_model
from icl_lens.lab._regression_dynamics import ORDERS, implicit_trajectory, pair_gradients, sgd_on_pairs, step_edits
from icl_lens.lab._model import RegressionModel
from icl_lens.lab._tasks import sample_prompts

KINDS = ("cumulative", "step")


@dataclass(frozen=True, eq=False)
class AlignmentResult:
    """Cosines per comparison: ``cosines["<comparison>:<order>:<kind>"][prompt, layer, i − 1]`` for ``i = 1..n``."""

    name: str
    lr: float
    dim: int
    cosines: dict[str, Float[Tensor, "prompt layer n"]]

    def table(self) -> AlignmentTable:
        """Each prompt's mean over ``i`` per layer, with the shared summaries (means, 95% intervals)."""
        return AlignmentTable(self.name, self.dim, {k: c.mean(-1) for k, c in self.cosines.items()})

    def summary(self) -> pd.DataFrame:
        """One row per comparison: signed mean cosine over prompts with its 95% bootstrap interval, and mean |cos|."""
        return self.table().summary()

    def by_step(self) -> pd.DataFrame:
        """Mean cosine over prompts and layers against ``i`` (for plots)."""
        frames = [pd.DataFrame({"key": k, "i": range(1, c.shape[-1] + 1), "cosine": c.mean((0, 1)).double().numpy()})
                  for k, c in self.cosines.items()]
        return pd.concat(frames, ignore_index=True)

    def to_frame(self) -> pd.DataFrame:
        frames = []
        for key, c in self.cosines.items():
            P, L, n = c.shape
            idx = torch.cartesian_prod(torch.arange(P), torch.arange(L), torch.arange(1, n + 1))
            frames.append(pd.DataFrame({"key": key, "prompt": idx[:, 0].numpy(), "layer": idx[:, 1].numpy(),
                                        "i": idx[:, 2].numpy(), "cosine": c.flatten().double().numpy()}))
        return pd.concat(frames, ignore_index=True)


def _steps(U: Tensor, V: Tensor) -> tuple[Tensor, Tensor]:
    """``[..., layer, n, d]`` SGD factors as ``[..., layer, n, row=1, d]``."""
    return U[..., None, :], V[..., None, :]


def implicit_vs_explicit(name: str = "softmax", *, n_prompts: int = 64, n_context: int | None = None, lr: float = 1e-1,
                         seed: int = 1, model: RegressionModel | None = None) -> AlignmentResult:
    """Weight-space alignment of the implicit trajectories (both orders) with explicit SGD, and its controls."""
    model = model if model is not None else load_lab_model(name)
    cfg = model.cfg
    n = cfg.n_context_train if n_context is None else n_context
    if n_prompts < 2 or n < 1:
        raise ValueError(f"need n_prompts ≥ 2 (for the control) and n_context ≥ 1, got {n_prompts}, {n}")
    p = sample_prompts(n_prompts, n, cfg.d_x, generator=torch.Generator().manual_seed(seed), dtype=model.dtype,
                       query_flag=cfg.query_flag)
    xs, ys = p.context_pairs()
    sgd = sgd_on_pairs(model, xs, ys, lr)
    g0, a0, _ = pair_gradients(model, xs.flatten(0, 1), ys.flatten())  # every pair at W₀
    g0, a0 = -g0.unflatten(0, (n_prompts, n)).transpose(1, 2), a0.unflatten(0, (n_prompts, n)).transpose(1, 2)
    gq, aq, _ = pair_gradients(model, p.tokens[:, -1, : cfg.d_x], p.targets)  # the query's own input and label
    out: dict[str, list[Tensor]] = {}

    def add(key: str, value: Tensor) -> None:
        out.setdefault(key, []).append(value.float())

    sgd_gram = step_gram(*_steps(sgd.U, sgd.V))  # prompt, layer, n, n: shared by both orders and the control
    small_gram = step_gram(*_steps(g0, a0))
    for b in range(n_prompts):
        nxt = (b + 1) % n_prompts
        for order in ORDERS:
            traj = implicit_trajectory(model, p.tokens[b, :-1], p.tokens[b, -1], order=order)
            for comparison, (U, V, G) in (("sgd", (sgd.U[b], sgd.V[b], sgd_gram[b])),
                                          ("control", (sgd.U[nxt], sgd.V[nxt], sgd_gram[nxt])),
                                          ("small_lr", (g0[b], a0[b], small_gram[b]))):
                cum, step = trajectory_sgd_cosines(traj.u_in, traj.v, *_steps(U, V), gram=G)
                add(f"{comparison}:{order}:cumulative", cum)
                add(f"{comparison}:{order}:step", step)
            add(f"query_input:{order}:cumulative", patches_vs_update(traj.u_in[:, 1:], traj.v[:, 1:], -gq[b][:, None], aq[b][:, None]))
            add(f"input_side:{order}:step", torch.nn.functional.cosine_similarity(traj.v[:, 1:], a0[b], dim=-1))
            out_side, share = step_sides(traj.u_in, traj.v, sgd.U[b], sgd.V[b])
            add(f"out_side:{order}:step", out_side)
            add(f"in_share:{order}:step", share)
            if order == "prefix":
                u_n, v_n = traj.u_in[:, -1:], traj.v[:, -1:]  # Pₙ, the end of either order
                for comparison, (U, V) in (("sgd", (sgd.U[b], sgd.V[b])), ("control", (sgd.U[nxt], sgd.V[nxt])),
                                           ("full_batch", (g0[b], a0[b])), ("full_batch_control", (g0[nxt], a0[nxt]))):
                    add(f"{comparison}:end:cumulative", patches_vs_update(u_n, v_n, U, V))
                # each pair's gradient at the implicit weights W(i−1) reached before it (run i−1 of the batch)
                gi, ai, _ = pair_gradients(model, xs[b], ys[b], edits=step_edits(traj, n))
                cum, step = trajectory_sgd_cosines(traj.u_in, traj.v, *_steps(-gi.transpose(0, 1), ai.transpose(0, 1)))
                add("at_implicit:prefix:cumulative", cum)
                add("at_implicit:prefix:step", step)
    cosines = {k: torch.stack(v) for k, v in out.items()}
    dim = cfg.d_mlp * cfg.d_model
    shape = next(iter(cosines.values())).shape
    gen = torch.Generator().manual_seed(seed + 1000)
    cosines["random:any:any"] = random_direction_cosines(dim, tuple(shape), generator=gen).float()
    return AlignmentResult(name, float(lr), dim, cosines)
