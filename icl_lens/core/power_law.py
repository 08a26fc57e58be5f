"""Fit ``y ≈ c · n^(−α)`` by least squares in log-log space (decay exponents of meta-gradient norms).

``log y = log c − α log n``; ``α > 0`` means the steps shrink as context grows
(convergence, Dherin et al. 2025, arXiv 2507.16003, §5), ``α ≈ 0`` means they do not.
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor


def fit_decay_exponent(n: Float[Tensor, " m"], y: Float[Tensor, "*batch m"]) -> tuple[Float[Tensor, "*batch"], Float[Tensor, "*batch"]]:
    """Exponent ``α`` and prefactor ``c`` of ``y ≈ c n^(−α)`` (each row of ``y`` fitted separately)."""
    if n.ndim != 1 or n.shape[0] != y.shape[-1] or n.shape[0] < 2:
        raise ValueError(f"need ≥ 2 points with matching lengths (n: {tuple(n.shape)}, y: {tuple(y.shape)})")
    if (n <= 0).any() or (y <= 0).any():
        raise ValueError("power-law fits need positive n and y")
    x = n.double().log()
    ly = y.double().log()
    xc = x - x.mean()
    slope = ((ly - ly.mean(-1, keepdim=True)) * xc).sum(-1) / (xc * xc).sum()
    intercept = ly.mean(-1) - slope * x.mean()
    return -slope, intercept.exp()
