"""Closed-form metrics of an implicit weight trajectory W₀, W₁, …, Wₙ (docs/design.md §3).

Dherin et al. 2025 (arXiv 2507.16003, §3): consuming context tokens c₁..cₙ one at a
time turns the token patch of a query into a sequence of implicit weights
``Wᵢ = W + Uᵢ Vᵢᵀ`` (rank 1 each, ``Uᵢ = [u_gate; u_in]``, ``Vᵢ = vᵢ``). The step

    Gᵢ = Wᵢ − Wᵢ₋₁ = Uᵢ Vᵢᵀ − Uᵢ₋₁ Vᵢ₋₁ᵀ          (the meta-gradient of token cᵢ)

is a difference of two rank-1 terms, so every quantity follows from
``⟨u₁v₁ᵀ, u₂v₂ᵀ⟩_F = (u₁·u₂)(v₁·v₂)`` without a dense matrix:

    ‖Gᵢ‖²        = ‖Pᵢ‖² + ‖Pᵢ₋₁‖² − 2⟨Pᵢ, Pᵢ₋₁⟩                 (Pᵢ = Uᵢ Vᵢᵀ)
    ⟨Pa−Pb, Pc−Pd⟩ = ⟨Pa,Pc⟩ − ⟨Pa,Pd⟩ − ⟨Pb,Pc⟩ + ⟨Pb,Pd⟩

Norms and consecutive cosines need only the banded inner products ``⟨Pᵢ, Pᵢ₊ₖ⟩`` for
k = 0, 1, 2 (:func:`step_inner_bands`): three passes over the factors, whatever n is.
Alignment is the normalised Frobenius inner product (cosine), 0 where a step is 0.
The convergence summary (``‖Gᵢ‖ ≈ c·i^(−b)``) is :func:`icl_lens.core._power_law.power_law_fit`.
All functions take factors with a trailing ``[step, d]`` layout and any leading batch
(e.g. ``layer``) dimensions; they compute in float64 because differences of nearly
equal patches cancel.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core._factored import safe_divide, diff_norm, patch_inner


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


def step_inner_bands(
    us: Sequence[Float[Tensor, "*b step d_out"]], v: Float[Tensor, "*b step d_in"], lags: int = 2
) -> list[Float[Tensor, "*b m"]]:
    """``⟨Pᵢ, Pᵢ₊ₖ⟩_F`` for k = 0..``lags`` (band k has ``step − k`` columns), in float64.

    ``us``: the output factors of each patched matrix (``[u_gate, u_in]`` or ``[u_in]``),
    summed over instead of stacked; ``Pᵢ = Uᵢ vᵢᵀ`` with ``Uᵢ`` their concatenation.
    """
    us64 = [u.to(torch.float64) for u in us]
    v64 = v.to(torch.float64)
    steps = v.shape[-2]
    bands = []
    for k in range(lags + 1):
        m = steps - k
        uu = sum(torch.linalg.vecdot(u[..., k:, :], u[..., :m, :]) for u in us64)
        bands.append(uu * torch.linalg.vecdot(v64[..., k:, :], v64[..., :m, :]))
    return bands


def _norms_from_bands(bands: list[Tensor]) -> Tensor:
    b0, b1 = bands[0], bands[1]
    return (b0[..., 1:] + b0[..., :-1] - 2 * b1).clamp_min(0).sqrt()


def step_norms_and_alignment(
    us: Sequence[Float[Tensor, "*b step d_out"]], v: Float[Tensor, "*b step d_in"]
) -> tuple[Float[Tensor, "*b n"], Float[Tensor, "*b m"]]:
    """:func:`meta_gradient_norms` and :func:`consecutive_alignment` from one :func:`step_inner_bands`."""
    b0, b1, b2 = step_inner_bands(us, v, 2)
    norms = _norms_from_bands([b0, b1])
    # ⟨G_i, G_{i+1}⟩ = ⟨P_i,P_{i+1}⟩ − ⟨P_i,P_i⟩ − ⟨P_{i−1},P_{i+1}⟩ + ⟨P_{i−1},P_i⟩, i = 1..n−1
    inner = b1[..., 1:] - b0[..., 1:-1] - b2 + b1[..., :-1]
    return norms, safe_divide(inner, norms[..., :-1] * norms[..., 1:])


def meta_gradient_norms(u: Float[Tensor, "*b step d_out"], v: Float[Tensor, "*b step d_in"]) -> Float[Tensor, "*b n"]:
    """``‖Wᵢ₊₁ − Wᵢ‖_F`` for i = 0..n−1 (column k is the step of context token k+1)."""
    return _norms_from_bands(step_inner_bands([u], v, 1))


def cumulative_norms(u: Float[Tensor, "*b step d_out"], v: Float[Tensor, "*b step d_in"]) -> Float[Tensor, "*b step"]:
    """``‖Wᵢ − W₀‖_F`` for i = 0..n."""
    u, v = _f64(u, v)
    return diff_norm(u, v, u[..., :1, :].expand_as(u), v[..., :1, :].expand_as(v))


def consecutive_alignment(u: Float[Tensor, "*b step d_out"], v: Float[Tensor, "*b step d_in"]) -> Float[Tensor, "*b m"]:
    """Cosine of consecutive meta-gradients ``cos(Gᵢ, Gᵢ₊₁)``, i = 1..n−1 (``n−1`` columns)."""
    return step_norms_and_alignment([u], v)[1]


def total_alignment(u: Float[Tensor, "*b step d_out"], v: Float[Tensor, "*b step d_in"]) -> Float[Tensor, "*b n"]:
    """Cosine of each meta-gradient ``Gᵢ`` (i = 1..n) with the total update ``Wₙ − W₀``."""
    u, v = _f64(u, v)
    last_u, last_v = u[..., -1:, :].expand_as(u[..., 1:, :]), v[..., -1:, :].expand_as(v[..., 1:, :])
    first_u, first_v = u[..., :1, :].expand_as(u[..., 1:, :]), v[..., :1, :].expand_as(v[..., 1:, :])
    inner = diff_inner(u[..., 1:, :], v[..., 1:, :], u[..., :-1, :], v[..., :-1, :], last_u, last_v, first_u, first_v)
    total = diff_norm(u[..., -1, :], v[..., -1, :], u[..., 0, :], v[..., 0, :])
    return safe_divide(inner, meta_gradient_norms(u, v) * total[..., None])
