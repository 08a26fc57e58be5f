"""Fixed-state contextual layers as online regressors (McDermott, Heath, Parhi 2026, arXiv 2606.25342).

A layer with a fixed-size state ``S`` (one ``d_v × d_k`` matrix per head) that reads a
stream of keys ``k_t`` and values ``v_t`` is a regressor ``k ↦ S k`` trained online, one
gradient step per token:

- Hebbian (linear attention): ``L_t(S) = −⟨S k_t, v_t⟩``, ``∇L_t = −v_t k_tᵀ``, and with rate 1
  ``S_t = S_{t−1} + v_t k_tᵀ``;
- delta rule (fast weights): ``L_t(S) = ½‖S k_t − v_t‖²``, ``∇L_t = (S k_t − v_t) k_tᵀ``,
  and with rate ``β_t`` ``S_t = S_{t−1} − β_t (S_{t−1} k_t − v_t) k_tᵀ``.

With ``‖k_t‖ = 1`` and ``0 < β_t < 1`` the delta step shrinks the residual on the current
pair by exactly ``1 − β_t``, so ``L_t(S_t) = (1 − β_t)² L_t(S_{t−1})``.
Shapes: ``S`` is ``*batch d_v d_k``, ``k`` is ``*batch d_k``, ``v`` is ``*batch d_v``.
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor


def hebbian_loss(S: Float[Tensor, "*batch d_v d_k"], k: Float[Tensor, "*batch d_k"], v: Float[Tensor, "*batch d_v"]) -> Float[Tensor, "*batch"]:
    """``−⟨S k, v⟩``."""
    return -(torch.einsum("...vk,...k->...v", S, k) * v).sum(-1)


def delta_loss(S: Float[Tensor, "*batch d_v d_k"], k: Float[Tensor, "*batch d_k"], v: Float[Tensor, "*batch d_v"]) -> Float[Tensor, "*batch"]:
    """``½‖S k − v‖²``."""
    return 0.5 * ((torch.einsum("...vk,...k->...v", S, k) - v) ** 2).sum(-1)


def hebbian_update(S: Float[Tensor, "*batch d_v d_k"], k: Float[Tensor, "*batch d_k"], v: Float[Tensor, "*batch d_v"]) -> Float[Tensor, "*batch d_v d_k"]:
    """One rate-1 gradient step on the Hebbian loss: ``S + v kᵀ``."""
    return S + v[..., :, None] * k[..., None, :]


def delta_update(
    S: Float[Tensor, "*batch d_v d_k"], k: Float[Tensor, "*batch d_k"], v: Float[Tensor, "*batch d_v"], beta: Float[Tensor, "*batch"]
) -> Float[Tensor, "*batch d_v d_k"]:
    """One rate-``β`` gradient step on ``½‖S k − v‖²``: ``S − β (S k − v) kᵀ``."""
    err = torch.einsum("...vk,...k->...v", S, k) - v
    return S - beta[..., None, None] * err[..., :, None] * k[..., None, :]


def loss_gradient(loss_fn, S: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """``∇_S Σ loss_fn(S, k, v)`` by autograd (to check the update rules against their losses)."""
    S = S.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(loss_fn(S, k.detach(), v.detach()).sum(), S)
    return grad
