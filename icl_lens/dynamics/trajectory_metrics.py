"""Closed-form metrics of an implicit weight trajectory W₀, W₁, …, Wₙ (docs/design.md §3).

Dherin et al. 2025 (arXiv 2507.16003, §3): consuming context tokens c₁..cₙ one at a
time turns the token patch of a query into a sequence of implicit weights
``Wᵢ = W + Uᵢ Vᵢᵀ`` (rank 1 each, ``Uᵢ = [u_gate; u_in]``, ``Vᵢ = vᵢ``). The step

    Gᵢ = Wᵢ − Wᵢ₋₁ = Uᵢ Vᵢᵀ − Uᵢ₋₁ Vᵢ₋₁ᵀ          (the meta-gradient of token cᵢ)

is a difference of two rank-1 terms, so every quantity follows from
``⟨u₁v₁ᵀ, u₂v₂ᵀ⟩_F = (u₁·u₂)(v₁·v₂)`` without a dense matrix:

    ‖Gᵢ‖²        = ‖Pᵢ‖² + ‖Pᵢ₋₁‖² − 2⟨Pᵢ, Pᵢ₋₁⟩                 (Pᵢ = Uᵢ Vᵢᵀ)
    ⟨Pa−Pb, Pc−Pd⟩ = ⟨Pa,Pc⟩ − ⟨Pa,Pd⟩ − ⟨Pb,Pc⟩ + ⟨Pb,Pd⟩

Alignment is the normalised Frobenius inner product (cosine), 0 where a step is 0.
The convergence summary (``‖Gᵢ‖ ≈ c·i^(−b)``) is :func:`icl_lens.core.power_law.power_law_fit`.
All functions take factors with a trailing ``[step, d]`` layout and any leading batch
(e.g. ``layer``) dimensions; they compute in float64 because differences of nearly
equal patches cancel.
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core.factored import safe_divide, diff_norm, patch_inner


def _f64(*xs: Tensor) -> tuple[Tensor, ...]:
    return tuple(x.to(torch.float64) for x in xs)


def diff_inner(
    ua: Float[Tensor, "*b d_out"], va: Float[Tensor, "*b d_in"],
    ub: Float[Tensor, "*b d_out"], vb: Float[Tensor, "*b d_in"],
    uc: Float[Tensor, "*b d_out"], vc: Float[Tensor, "*b d_in"],
    ud: Float[Tensor, "*b d_out"], vd: Float[Tensor, "*b d_in"],
) -> Float[Tensor, "*b"]:
    """``⟨ua vaᵀ − ub vbᵀ, uc vcᵀ − ud vdᵀ⟩_F`` expanded into four rank-1 inner products."""
    return (patch_inner(ua, va, uc, vc) - patch_inner(ua, va, ud, vd)
            - patch_inner(ub, vb, uc, vc) + patch_inner(ub, vb, ud, vd))


def meta_gradient_norms(u: Float[Tensor, "*b step d_out"], v: Float[Tensor, "*b step d_in"]) -> Float[Tensor, "*b n"]:
    """``‖Wᵢ₊₁ − Wᵢ‖_F`` for i = 0..n−1 (column k is the step of context token k+1)."""
    u, v = _f64(u, v)
    return diff_norm(u[..., 1:, :], v[..., 1:, :], u[..., :-1, :], v[..., :-1, :])


def cumulative_norms(u: Float[Tensor, "*b step d_out"], v: Float[Tensor, "*b step d_in"]) -> Float[Tensor, "*b step"]:
    """``‖Wᵢ − W₀‖_F`` for i = 0..n."""
    u, v = _f64(u, v)
    return diff_norm(u, v, u[..., :1, :].expand_as(u), v[..., :1, :].expand_as(v))


def consecutive_alignment(u: Float[Tensor, "*b step d_out"], v: Float[Tensor, "*b step d_in"]) -> Float[Tensor, "*b m"]:
    """Cosine of consecutive meta-gradients ``cos(Gᵢ, Gᵢ₊₁)``, i = 1..n−1 (``n−1`` columns)."""
    u, v = _f64(u, v)
    p0u, p0v = u[..., :-2, :], v[..., :-2, :]
    p1u, p1v = u[..., 1:-1, :], v[..., 1:-1, :]
    p2u, p2v = u[..., 2:, :], v[..., 2:, :]
    inner = diff_inner(p1u, p1v, p0u, p0v, p2u, p2v, p1u, p1v)
    norms = meta_gradient_norms(u, v)
    return safe_divide(inner, norms[..., :-1] * norms[..., 1:])


def total_alignment(u: Float[Tensor, "*b step d_out"], v: Float[Tensor, "*b step d_in"]) -> Float[Tensor, "*b n"]:
    """Cosine of each meta-gradient ``Gᵢ`` (i = 1..n) with the total update ``Wₙ − W₀``."""
    u, v = _f64(u, v)
    last_u, last_v = u[..., -1:, :].expand_as(u[..., 1:, :]), v[..., -1:, :].expand_as(v[..., 1:, :])
    first_u, first_v = u[..., :1, :].expand_as(u[..., 1:, :]), v[..., :1, :].expand_as(v[..., 1:, :])
    inner = diff_inner(u[..., 1:, :], v[..., 1:, :], u[..., :-1, :], v[..., :-1, :], last_u, last_v, first_u, first_v)
    total = diff_norm(u[..., -1, :], v[..., -1, :], u[..., 0, :], v[..., 0, :])
    return safe_divide(inner, meta_gradient_norms(u, v) * total[..., None])
