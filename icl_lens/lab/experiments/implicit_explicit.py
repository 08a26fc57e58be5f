"""Experiment 2 — implicit trajectory vs explicit SGD on the same examples (arXiv 2507.16003, §5).

For a prompt ``[c₁ … c_n, x_q]`` and each layer ``l``:

- implicit: ``ΔW_l(i)`` (the query's token patch with ``i`` pairs seen) and its step
  ``ΔW_l(i) − ΔW_l(i−1)`` (:mod:`icl_lens.lab.dynamics`);
- explicit: SGD on the context-free model, one step per pair, ``Σ_{j≤i} U_j V_jᵀ`` and the
  step ``U_i V_iᵀ``.

Alignment is the normalised Frobenius inner product (cosine), in closed form
(:func:`icl_lens.core.factored.sum_cosine`): ``cumulative`` compares ``ΔW_l(i)`` with the sum of
the first ``i`` SGD steps, ``per_step`` compares the ``i``-th steps. ``control`` repeats
the cumulative comparison with SGD on another prompt's pairs (a different ``w``), the
alignment one gets without sharing the examples.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core.factored import sum_cosine
from icl_lens.lab.checkpoints import load_lab_model
from icl_lens.lab.dynamics import explicit_sgd, implicit_trajectory
from icl_lens.lab.tasks import sample_prompts


@dataclass(frozen=True, eq=False)
class AlignmentResult:
    """Cosines per (prompt, layer, step ``i = 1..n``)."""

    arch: str
    lr: float
    cumulative: Float[Tensor, "prompt layer n"]
    per_step: Float[Tensor, "prompt layer n"]
    control: Float[Tensor, "prompt layer n"]
    query_gradient: Float[Tensor, "prompt layer"]

    def to_frame(self) -> pd.DataFrame:
        P, L, n = self.cumulative.shape
        idx = torch.cartesian_prod(torch.arange(P), torch.arange(L), torch.arange(1, n + 1))
        return pd.DataFrame({"prompt": idx[:, 0].numpy(), "layer": idx[:, 1].numpy(), "step": idx[:, 2].numpy(),
                             "cumulative_cosine": self.cumulative.flatten().double().numpy(),
                             "step_cosine": self.per_step.flatten().double().numpy(),
                             "control_cosine": self.control.flatten().double().numpy()})

    def summary(self) -> pd.DataFrame:
        """Per layer: mean over prompts and steps (and the last step's cumulative cosine)."""
        return pd.DataFrame({
            "layer": range(self.cumulative.shape[1]),
            "cumulative_cosine": self.cumulative.mean((0, 2)).double().numpy(),
            "cumulative_cosine_at_n": self.cumulative[:, :, -1].mean(0).double().numpy(),
            "step_cosine": self.per_step.mean((0, 2)).double().numpy(),
            "control_cosine": self.control.mean((0, 2)).double().numpy(),
            "query_gradient_cosine": self.query_gradient.mean(0).double().numpy(),
        })


def _cosines(traj, sgd) -> tuple[Tensor, Tensor]:
    L, n = sgd.U.shape[:2]
    cum = torch.zeros(L, n)
    step = torch.zeros(L, n)
    for l in range(L):
        for i in range(1, n + 1):
            cum[l, i - 1] = sum_cosine(traj.u[l, i][None], traj.v[l, i][None], sgd.U[l, :i], sgd.V[l, :i])
            U_imp = torch.stack([traj.u[l, i], -traj.u[l, i - 1]])
            V_imp = torch.stack([traj.v[l, i], traj.v[l, i - 1]])
            step[l, i - 1] = sum_cosine(U_imp, V_imp, sgd.U[l, i - 1: i], sgd.V[l, i - 1: i])
    return cum, step


def implicit_vs_explicit(arch: str = "softmax", *, n_prompts: int = 8, n_context: int = 16, lr: float = 1e-2,
                         seed: int = 1, model=None) -> AlignmentResult:
    """Alignment of the implicit trajectory with explicit SGD on the same context pairs, per layer and step."""
    model = model if model is not None else load_lab_model(arch)
    p = sample_prompts(n_prompts, n_context, model.cfg.d_x, generator=torch.Generator().manual_seed(seed), dtype=model.dtype)
    xs, ys = p.context_pairs()
    sgds = [explicit_sgd(model, xs[b], ys[b], lr=lr) for b in range(n_prompts)]
    cum, step, ctrl, qg = [], [], [], []
    for b in range(n_prompts):
        traj = implicit_trajectory(model, p.tokens[b, :-1], p.tokens[b, -1])
        c, s = _cosines(traj, sgds[b])
        cum.append(c)
        step.append(s)
        ctrl.append(_cosines(traj, sgds[(b + 1) % n_prompts])[0])
        xq = p.tokens[b, -1, : model.cfg.d_x]
        q = explicit_sgd(model, xq[None], p.targets[b][None], lr=lr)
        qg.append(torch.stack([sum_cosine(traj.u[l, -1][None], traj.v[l, -1][None], q.U[l], q.V[l])
                               for l in range(model.cfg.n_layers)]))
    return AlignmentResult(model.cfg.arch, lr, torch.stack(cum), torch.stack(step), torch.stack(ctrl), torch.stack(qg))
