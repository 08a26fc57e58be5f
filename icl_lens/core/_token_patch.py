"""The minimal token patch of one dense layer (Dherin et al. 2025, arXiv 2507.16003).

For a contextual block ``x ↦ MLP_W(A(C, x))``, removing part of the context changes
the MLP input from ``A = A(C, x)`` to ``a = A(C∖Y, x)``. The minimum-Frobenius-norm
``ΔW`` with ``(W + ΔW) a = W A`` is the rank-1 matrix

    ΔW = (W δ) aᵀ / ‖a‖²,   δ = A − a,

stored factored as ``u = W δ`` and ``v = a / ‖a‖² = a⁺`` (the pseudo-inverse of the
column ``a``). Where ``a`` is (numerically) zero no finite patch exists; the
pseudo-inverse convention ``a⁺ = 0`` gives the zero patch, and the caller is told
which rows that happened to (docs/design.md §2, "zero-norm activations").
"""
from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor


def zero_norm_threshold(dtype: torch.dtype) -> float:
    """Squared norm below which ``a`` counts as zero: ``sqrt(finfo.tiny)`` keeps ``v`` finite."""
    return float(torch.finfo(dtype).tiny) ** 0.5


def input_pseudo_inverse(
    a: Float[Tensor, "*batch d_in"],
) -> tuple[Float[Tensor, "*batch d_in"], Bool[Tensor, "*batch"]]:
    """``v = a/‖a‖²`` row-wise, and the mask of rows where ``‖a‖`` is zero (``v`` set to 0)."""
    norm_sq = torch.linalg.vecdot(a, a)[..., None]
    is_zero = norm_sq <= zero_norm_threshold(a.dtype)
    v = (a / torch.where(is_zero, torch.ones_like(norm_sq), norm_sq)).masked_fill_(is_zero, 0.0)
    return v, is_zero.squeeze(-1)


def token_patch(
    weight: Float[Tensor, "d_out d_in"],
    contextual_input: Float[Tensor, "*batch d_in"],
    kept_input: Float[Tensor, "*batch d_in"],
) -> tuple[Float[Tensor, "*batch d_out"], Float[Tensor, "*batch d_in"], Bool[Tensor, "*batch"]]:
    """Factors ``(u, v)`` of ``ΔW = u vᵀ`` that make ``(W+ΔW) a = W A`` (row-wise), plus the zero-``a`` mask."""
    delta = contextual_input - kept_input
    u = delta @ weight.T
    v, is_zero = input_pseudo_inverse(kept_input)
    return u, v, is_zero
