"""Metrics of sums of rank-1 matrices, kept factored (DESIGN.md §3).

A matrix ``M = Σ_k U_k V_kᵀ`` (rows of ``U``: ``d_out``, rows of ``V``: ``d_in``) — a
cumulative explicit-SGD update (one rank-1 gradient per example), a meta-gradient step
``ΔW_{i+1} − ΔW_i`` (two terms) — is compared with another such sum through

    ⟨M₁, M₂⟩_F = Σ_{j,k} (U₁ⱼ·U₂ₖ)(V₁ⱼ·V₂ₖ),    cos = ⟨M₁, M₂⟩ / (‖M₁‖‖M₂‖),

with the norms from :func:`icl_lens.core.factored.sum_norm`. Nothing dense is built.
The rank-1 identities are those of Dherin et al. 2025, arXiv 2507.16003.
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core.factored import sum_norm


def sum_inner(
    U1: Float[Tensor, "k1 d_out"], V1: Float[Tensor, "k1 d_in"], U2: Float[Tensor, "k2 d_out"], V2: Float[Tensor, "k2 d_in"]
) -> Float[Tensor, ""]:
    """``⟨Σ U₁ V₁ᵀ, Σ U₂ V₂ᵀ⟩_F``."""
    return ((U1 @ U2.T) * (V1 @ V2.T)).sum()


def sum_cosine(
    U1: Float[Tensor, "k1 d_out"], V1: Float[Tensor, "k1 d_in"], U2: Float[Tensor, "k2 d_out"], V2: Float[Tensor, "k2 d_in"]
) -> Float[Tensor, ""]:
    """Normalised Frobenius inner product of two factored sums (0 if either is 0)."""
    den = sum_norm(U1, V1) * sum_norm(U2, V2)
    inner = sum_inner(U1, V1, U2, V2)
    return torch.where(den > 0, inner / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(inner))
