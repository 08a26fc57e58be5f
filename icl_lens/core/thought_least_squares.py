"""The thought matrix by (ridge) least squares (Mazzawi, Dherin et al. 2025, arXiv 2510.08734, Theorem 2.1).

Given, for ``K`` calibration queries, the context-free MLP inputs ``aᵢ`` and the gaps
``δᵢ = Aᵢ − aᵢ`` to the contextual inputs, the static update ``Δ`` minimising
``Σᵢ ‖(W + Δ) aᵢ − W Aᵢ‖² + λ‖Δ‖²_F`` is

    Δ(I) = (Σᵢ W δᵢ aᵢᵀ)(Σᵢ aᵢ aᵢᵀ + λ I)⁻¹,

and the thought vector is the mean gap ``δ(I) = mean δᵢ``. Unlike a token patch, ``Δ``
is one matrix for all queries (it is the layer's permanent edit, not a per-token one).
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor


def thought_matrix(
    weight: Float[Tensor, "d_out d_in"],
    delta: Float[Tensor, "k d_in"],
    kept_input: Float[Tensor, "k d_in"],
    *,
    ridge: float = 0.0,
) -> Float[Tensor, "d_out d_in"]:
    """``(Σ W δᵢ aᵢᵀ)(Σ aᵢ aᵢᵀ + λI)⁻¹`` (pseudo-inverse when ``λ = 0``)."""
    if delta.shape != kept_input.shape or delta.ndim != 2:
        raise ValueError(f"delta {tuple(delta.shape)} and kept_input {tuple(kept_input.shape)} must both be k × d_in")
    if ridge < 0:
        raise ValueError("ridge must be ≥ 0")
    M = weight @ delta.T @ kept_input  # d_out × d_in
    Z = kept_input.T @ kept_input
    if ridge > 0:
        Z = Z + ridge * torch.eye(Z.shape[0], dtype=Z.dtype)
        return torch.linalg.solve(Z, M.T).T
    return M @ torch.linalg.pinv(Z, hermitian=True)


def thought_vector(delta: Float[Tensor, "k d"]) -> Float[Tensor, " d"]:
    """``δ(I) = mean δᵢ``: the least-squares token-independent vector."""
    return delta.mean(0)
