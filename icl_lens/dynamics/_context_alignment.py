"""Implicit trajectories vs one gradient step per context token, over many prompts of a language model.

The paper's protocol (Dherin et al. 2025, arXiv 2507.16003, §4–5) on a real model, per
prompt (query = its last token) and layer (docs/design.md §3):

- implicit: the query's trajectory ``W₀..Wₙ`` in both orders, prefix and absorb
  (:func:`icl_lens.dynamics._trajectory_capture.trajectory`), ``Pᵢ = Wᵢ − W₀`` on the first
  dense MLP weights (``[W_gate; W_up]`` for gated MLPs);
- explicit: step ``j`` = the descent direction of the cross-entropy of ``[BOS, cⱼ]``
  toward the next prompt token, at ``W₀``
  (:func:`icl_lens.dynamics._explicit_finetune.context_token_steps_many`).

Cosines (:func:`icl_lens.dynamics._sgd_alignment.trajectory_sgd_cosines`):
``cumulative(i) = cos(Pᵢ, Σ_{j≤i} Eⱼ)`` and ``step(i) = cos(Pᵢ − Pᵢ₋₁, Eᵢ)``, averaged over
``i`` per prompt and layer. Comparisons: ``sgd`` (the prompt's own tokens), ``control`` (the
next prompt's steps, truncated to the shorter of the two contexts), ``query_input``
(``cos(Pᵢ, the query's own step toward the contextual argmax)``) and ``random`` (a uniformly
random direction of the layer's weight space).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from icl_lens.dynamics._sgd_alignment import (
    AlignmentTable,
    patches_vs_update,
    random_direction_cosines,
    step_gram,
    trajectory_sgd_cosines,
)
from icl_lens.dynamics._explicit_finetune import context_token_steps_many
from icl_lens.dynamics._trajectory_capture import ORDERS, Prompt, trajectory

if TYPE_CHECKING:
    from icl_lens.model._types import Model


def context_alignment(model: Model, prompts: Sequence[Prompt], *, batch_rows: int = 128, seed: int = 0,
                      progress: bool = False) -> AlignmentTable:
    """Per prompt and layer: mean alignment cosines of the paper's protocol (see the module docstring)."""
    if len(prompts) < 2:
        raise ValueError("context_alignment needs at least 2 prompts (the control pairs each with the next)")
    steps = context_token_steps_many(model, prompts, batch_rows=batch_rows, progress=progress)
    gen = torch.Generator().manual_seed(seed)
    grams = [step_gram(s.u, s.v) for s in steps]  # each run's Gram matrix, shared by both orders and the control
    out: dict[str, list[torch.Tensor]] = {}
    dim = None
    for k, prompt in enumerate(tqdm(prompts, desc="trajectories", disable=not progress)):
        nk = (k + 1) % len(prompts)
        own, nxt = steps[k], steps[nk]
        for order in ORDERS:
            traj = trajectory(model, prompt, order=order)
            iu, iv = traj.stacked_u(), traj.v
            dim = iu.shape[-1] * iv.shape[-1]
            cum, step = trajectory_sgd_cosines(iu, iv, own.u, own.v, grams[k])
            out.setdefault(f"sgd:{order}:cumulative", []).append(cum.mean(-1))
            out.setdefault(f"sgd:{order}:step", []).append(step.mean(-1))
            m = min(traj.n_context, len(nxt.positions))
            cum, step = trajectory_sgd_cosines(iu[:, : m + 1], iv[:, : m + 1], nxt.u[:, :m], nxt.v[:, :m],
                                               grams[nk][:, :m, :m])
            out.setdefault(f"control:{order}:cumulative", []).append(cum.mean(-1))
            out.setdefault(f"control:{order}:step", []).append(step.mean(-1))
            q = patches_vs_update(iu[:, 1:], iv[:, 1:], own.query_u, own.query_v)
            out.setdefault(f"query_input:{order}:cumulative", []).append(q.mean(-1))
        shape = (len(traj.layers), traj.n_context)
        out.setdefault("random:any:any", []).append(random_direction_cosines(dim, shape, generator=gen).mean(-1))
    name = model.cfg.model_name
    return AlignmentTable(name, dim, {key: torch.stack(v).float().cpu() for key, v in out.items()})
