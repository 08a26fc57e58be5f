"""The null-space projection of a thought patch's key-side updates (AlphaEdit, Fang et al. 2025, arXiv 2410.02355).

AlphaEdit keeps an edit ``Δ`` from changing what a layer computes on preserved keys ``k₀`` by
projecting it onto the null space of their covariance before it is applied: with ``K₀K₀ᵀ =
U Λ Uᵀ`` (eigenvalues decreasing), ``P = I − U_k U_kᵀ`` for the top ``k`` eigenvectors, and the
edit is ``Δ P``, so ``Δ P k₀ ≈ 0`` for every preserved key (exactly ``0`` when ``U_k`` spans
them). Fitting ``Δ̃`` on the projected rows ``P xᵢ`` and applying ``Δ̃ P`` is the least squares
restricted to that null space (AlphaEdit's eq. 6 without its term for earlier edits).

In a thought patch (:mod:`icl_lens.thought._fit`) the key sides are the input map's (``M``,
``d_model × d_model``: the MLP inputs ``a``, so ``Δ = W M P_a``) and the down map's
(``ΔW_out = uᵀ v``: the hidden activations ``h``, so ``v ← v P_h``, ``P_h`` being
``d_mlp × d_mlp``, one per layer; the factors stay ``n × d_mlp``). The thought vector (a
constant bias, or a gain on ``ŷ``) has no key side and keeps the MEMIT penalty alone.

Rule for ``k`` (fixed here, :attr:`~icl_lens.thought.ThoughtFit.null_space` = ``ε``): the
smallest ``k`` whose eigenvalues hold at least ``1 − ε`` of the trace, never more than the
covariance's numerical rank (eigenvalues above ``d · eps(dtype) · λ_max``, the pseudo-inverse's
cutoff); ``ε = 0`` removes every direction the preserved keys span. The BOS position's key is
removed whatever the rule says: every text the model reads starts with it (the preserved
keys are the tokens after it), and the fit's anchor rows already ask that the patch leave it
as it is; without it the edit would move BOS and, through attention, every later token. ``ε`` is chosen by
``python -m experiments.thought --select`` on the selection split (the ``null_space`` stage).
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core._least_squares import pinv_rtol


def kept_directions(covariance: Float[Tensor, "d d"], eps: float) -> int:
    """``k``: the number of top eigenvectors the rule removes from an update (see the module docstring)."""
    return _removed(covariance, eps, None).shape[1]


def null_space_projector(covariance: Float[Tensor, "d d"], eps: float,
                         always: Float[Tensor, "m d"] | None = None) -> Float[Tensor, "d d"]:
    """``P = I − Q Qᵀ`` (symmetric, idempotent): ``Q`` spans the rows of ``always`` (keys removed whatever the rule
    says: the BOS position's) and the top ``k`` eigenvectors of the preserved keys' covariance ``K₀K₀ᵀ`` (``eps``:
    the share of its trace that may stay outside them) with ``always`` projected out of it. ``P = 0`` when ``Q``
    spans the whole space."""
    q = _removed(covariance, eps, always)
    d = covariance.shape[0]
    if q.shape[1] >= d:
        return torch.zeros_like(covariance)
    eye = torch.eye(d, dtype=torch.float64, device=covariance.device)
    return (eye - q @ q.T).to(covariance.dtype)


def _removed(covariance: Tensor, eps: float, always: Tensor | None) -> Tensor:
    """The orthonormal columns ``Q`` of the removed directions (float64)."""
    if covariance.ndim != 2 or covariance.shape[0] != covariance.shape[1]:
        raise ValueError(f"a covariance must be square, got {tuple(covariance.shape)}")
    if not 0 <= eps < 1:
        raise ValueError(f"the share of the trace left must be in [0, 1), got {eps}")
    if not torch.isfinite(covariance).all() or (always is not None and not torch.isfinite(always).all()):
        raise ValueError("the preserved keys' covariance is not finite")
    c = covariance.double()
    c = (c + c.T) / 2
    rtol = pinv_rtol(*c.shape, covariance.dtype)
    fixed = c.new_zeros(c.shape[0], 0)
    if always is not None and always.numel():
        u, sv, _ = torch.linalg.svd(always.double().T, full_matrices=False)
        fixed = u[:, sv > rtol * sv[0]] if float(sv[0]) > 0 else fixed
        out = torch.eye(c.shape[0], dtype=c.dtype, device=c.device) - fixed @ fixed.T
        c = out @ c @ out
    vals, vecs = torch.linalg.eigh(c)
    vals, vecs = vals.flip(0).clamp_min(0), vecs.flip(1)  # decreasing
    if float(vals[0]) == 0.0:
        return fixed
    rank = int((vals > rtol * vals[0]).sum())
    held = torch.cumsum(vals, 0) / vals.sum()
    k = rank if eps == 0 else int((held < 1 - eps).sum()) + 1
    return torch.cat([fixed, vecs[:, :min(k, rank)]], dim=1)
