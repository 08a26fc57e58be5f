"""Closed-form metrics of rank-1 weight updates, kept factored.

A token patch is ``ΔW = u vᵀ`` (Dherin et al. 2025, arXiv 2507.16003, Theorem 2.2).
For a gated MLP the same ``v`` multiplies two output vectors, ``u_gate`` and
``u_up``; stacking them, ``U = [u_gate; u_up]``, turns the pair into one rank-1
matrix ``U vᵀ`` whose Frobenius norm is the docs/design.md §2 patch norm
``sqrt(‖u_gate‖² + ‖u_up‖²)·‖v‖``. Every metric below follows from

    ‖u vᵀ‖_F = ‖u‖ ‖v‖,    ⟨u₁v₁ᵀ, u₂v₂ᵀ⟩_F = (u₁·u₂)(v₁·v₂),

so no ``d_mlp × d_model`` matrix is ever materialised (docs/design.md §3). Sums of
rank-1 terms (a cumulative SGD update, one rank-1 gradient per example; a meta-gradient
step, two terms) compare the same way: ``⟨Σ U₁V₁ᵀ, Σ U₂V₂ᵀ⟩ = Σ_{j,k} (U₁ⱼ·U₂ₖ)(V₁ⱼ·V₂ₖ)``.
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor


def patch_norm(u: Float[Tensor, "*batch d_out"], v: Float[Tensor, "*batch d_in"]) -> Float[Tensor, "*batch"]:
    """Frobenius norm of ``u vᵀ``: ``‖u‖·‖v‖``."""
    return torch.linalg.vector_norm(u, dim=-1) * torch.linalg.vector_norm(v, dim=-1)


def patch_inner(
    u1: Float[Tensor, "*batch d_out"],
    v1: Float[Tensor, "*batch d_in"],
    u2: Float[Tensor, "*batch d_out"],
    v2: Float[Tensor, "*batch d_in"],
) -> Float[Tensor, "*batch"]:
    """Frobenius inner product ``⟨u₁v₁ᵀ, u₂v₂ᵀ⟩ = (u₁·u₂)(v₁·v₂)``."""
    return (u1 * u2).sum(-1) * (v1 * v2).sum(-1)


def safe_divide(num: Tensor, den: Tensor) -> Tensor:
    """``num / den``, defined as 0 where ``den`` is 0 (a zero patch aligns with nothing)."""
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


def patch_cosine(
    u1: Float[Tensor, "*batch d_out"],
    v1: Float[Tensor, "*batch d_in"],
    u2: Float[Tensor, "*batch d_out"],
    v2: Float[Tensor, "*batch d_in"],
) -> Float[Tensor, "*batch"]:
    """Alignment: normalised Frobenius inner product of two rank-1 patches (0 if either is 0)."""
    return safe_divide(patch_inner(u1, v1, u2, v2), patch_norm(u1, v1) * patch_norm(u2, v2))


def gram_cosine(u: Float[Tensor, "n d_out"], v: Float[Tensor, "n d_in"]) -> Float[Tensor, "n n"]:
    """Pairwise cosine of ``n`` rank-1 patches: ``(U Uᵀ ⊙ V Vᵀ) / (‖·‖‖·‖)``."""
    gram = (u @ u.T) * (v @ v.T)
    norms = patch_norm(u, v)
    return safe_divide(gram, norms[:, None] * norms[None, :])


def sum_gram(u: Float[Tensor, "n d_out"], v: Float[Tensor, "n d_in"]) -> Float[Tensor, "n n"]:
    """Gram matrix ``G[j,k] = ⟨u_j v_jᵀ, u_k v_kᵀ⟩`` of ``n`` rank-1 terms."""
    return (u @ u.T) * (v @ v.T)


def sum_norm(u: Float[Tensor, "n d_out"], v: Float[Tensor, "n d_in"]) -> Float[Tensor, ""]:
    """Frobenius norm of ``Σ_k u_k v_kᵀ`` from the Gram matrix, never the dense sum."""
    return sum_gram(u, v).sum().clamp_min(0).sqrt()


def sum_inner(
    u1: Float[Tensor, "k1 d_out"], v1: Float[Tensor, "k1 d_in"], u2: Float[Tensor, "k2 d_out"], v2: Float[Tensor, "k2 d_in"]
) -> Float[Tensor, ""]:
    """``⟨Σ_j u1_j v1_jᵀ, Σ_k u2_k v2_kᵀ⟩_F = Σ_{j,k} (u1_j·u2_k)(v1_j·v2_k)``."""
    return ((u1 @ u2.T) * (v1 @ v2.T)).sum()


def sum_cosine(
    u1: Float[Tensor, "k1 d_out"], v1: Float[Tensor, "k1 d_in"], u2: Float[Tensor, "k2 d_out"], v2: Float[Tensor, "k2 d_in"]
) -> Float[Tensor, ""]:
    """Normalised Frobenius inner product of two sums of rank-1 terms (0 if either is 0)."""
    return safe_divide(sum_inner(u1, v1, u2, v2), sum_norm(u1, v1) * sum_norm(u2, v2))


def diff_norm(
    u1: Float[Tensor, "*batch d_out"],
    v1: Float[Tensor, "*batch d_in"],
    u2: Float[Tensor, "*batch d_out"],
    v2: Float[Tensor, "*batch d_in"],
) -> Float[Tensor, "*batch"]:
    """``‖u₁v₁ᵀ − u₂v₂ᵀ‖_F`` in closed form: ``sqrt(‖·‖₁² + ‖·‖₂² − 2⟨·,·⟩)``."""
    sq = patch_norm(u1, v1) ** 2 + patch_norm(u2, v2) ** 2 - 2 * patch_inner(u1, v1, u2, v2)
    return sq.clamp_min(0).sqrt()


def stack_outputs(u_in: Float[Tensor, "*batch d_mlp"], u_gate: Float[Tensor, "*batch d_mlp"] | None) -> Tensor:
    """Stack the output vectors of every patched matrix (``[u_gate; u_in]``) into one."""
    return u_in if u_gate is None else torch.cat([u_gate, u_in], dim=-1)
