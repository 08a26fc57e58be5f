"""Softmax attention as a Nadaraya–Watson kernel regressor (McDermott, Heath, Parhi 2026, arXiv 2606.25342).

Given keys ``k_j`` with values ``v_j`` (the "training set" the layer builds from its
context) and a query ``q`` (the test point), the Nadaraya–Watson estimator is

    m(q) = Σ_j K(q, k_j) v_j / Σ_j K(q, k_j).

With the exponential kernel ``K(q, k) = exp(q·k / τ)``, ``τ = √d_head``, this is exactly
softmax attention; with ``K(q, k) = φ(q)·φ(k)`` for a positive feature map it is
normalised linear attention. Both are non-parametric: the estimator keeps every pair.
Computed in a max-shifted form (the shift cancels in the ratio), so it never overflows.
"""
from __future__ import annotations

import math

import torch
from jaxtyping import Bool, Float
from torch import Tensor


def exponential_kernel(queries: Float[Tensor, "*batch q d"], keys: Float[Tensor, "*batch n d"], scale: float) -> Float[Tensor, "*batch q n"]:
    """Log-kernel ``log K(q, k) = q·k / scale`` (returned in log form for stability)."""
    return queries @ keys.transpose(-1, -2) / scale


def nadaraya_watson(
    queries: Float[Tensor, "*batch q d"],
    keys: Float[Tensor, "*batch n d"],
    values: Float[Tensor, "*batch n d_v"],
    *,
    scale: float | None = None,
    mask: Bool[Tensor, "q n"] | None = None,
) -> Float[Tensor, "*batch q d_v"]:
    """``m(q) = Σ_j K(q,k_j) v_j / Σ_j K(q,k_j)`` with ``K = exp(q·k/scale)`` (default ``scale = √d``).

    ``mask[i, j]`` False drops pair ``j`` for query ``i`` (a causal mask); every query needs
    at least one pair.
    """
    if keys.shape[-2] != values.shape[-2]:
        raise ValueError(f"{keys.shape[-2]} keys but {values.shape[-2]} values")
    if keys.shape[-2] == 0:
        raise ValueError("the estimator needs at least one (key, value) pair")
    log_k = exponential_kernel(queries, keys, math.sqrt(queries.shape[-1]) if scale is None else scale)
    if mask is not None:
        if not mask.any(-1).all():
            raise ValueError("every query needs at least one unmasked pair")
        log_k = log_k.masked_fill(~mask, float("-inf"))
    weights = torch.exp(log_k - log_k.amax(-1, keepdim=True))
    return (weights @ values) / weights.sum(-1, keepdim=True)


def feature_kernel_regression(
    phi_queries: Float[Tensor, "*batch q d"],
    phi_keys: Float[Tensor, "*batch n d"],
    values: Float[Tensor, "*batch n d_v"],
    *,
    mask: Bool[Tensor, "q n"] | None = None,
) -> Float[Tensor, "*batch q d_v"]:
    """Nadaraya–Watson with a feature kernel ``K(q,k) = φ(q)·φ(k)`` (inputs already mapped, positive)."""
    K = phi_queries @ phi_keys.transpose(-1, -2)
    if mask is not None:
        K = K * mask.to(K.dtype)
    return (K @ values) / K.sum(-1, keepdim=True)
