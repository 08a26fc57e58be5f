"""Who wrote a token patch: its exact split over attention heads and removed context tokens (docs/design.md §7).

A token patch (Dherin et al. 2025, arXiv 2507.16003) of query ``t`` at one layer is
``ΔW = (W δ) vᵀ`` with ``δ = A − a``, plus the skip correction ``c = attn_C − attn_0``
(docs/design.md §2). Both come from what attention adds with minus without the removed
context, and that difference splits exactly, before any norm, over heads ``h`` and removed
keys ``j``. With the query's contextual attention weights ``α``, its kept keys ``K``,
``s_K = Σ_{k∈K} α_hk`` and the kept-only value mix ``v̄_hK = Σ_{k∈K} (α_hk / s_K) v_hk``
(what the query attends to when it sees only ``K``: the kept-key renormalisation of §2):

    raw_C − raw_0 = Σ_h O_h (z_h − v̄_hK) = Σ_h Σ_{j∉K} α_hj O_h (v_hj − v̄_hK)

(``Σ_j α_hj = 1`` over the visible keys; the value and output biases cancel; with grouped-
query attention ``v`` is shared by a group of heads and ``O_h`` is each query head's block of
the output projection). ``raw`` is the output projection's output, before any
post-attention norm.

**Through the norms.** The MLP input is ``F(raw)`` (the pre-MLP norm of ``r`` plus the
post-attention norm of ``raw``, whichever the block has) and the correction ``P(raw)``
minus its kept-only value (``P``: the post-attention norm, or the identity). Neither is
linear, but along the straight path ``raw(s) = raw_0 + s (raw_C − raw_0)`` the fundamental
theorem of calculus gives, with the *integrated Jacobian* ``M_F = ∫₀¹ J_F(raw(s)) ds``,

    δ = F(raw_C) − F(raw_0) = M_F (raw_C − raw_0),     so    δ_hj = M_F α_hj O_h (v_hj − v̄_hK)

sums to ``δ`` exactly, the patch parts ``ΔW_hj = (W δ_hj) vᵀ`` sum to ``ΔW``, and the same
holds for the correction with ``M_P``. The integral is taken by Gauss–Legendre quadrature on
``[0, 1]`` (``n`` nodes are exact for polynomials of degree ``2n − 1``; the integrand is
analytic wherever the normed vector stays away from zero, so the error falls geometrically
with ``n``). Its error is measured, not assumed: the shares below must sum to 1, and
:func:`integrated_jacobian` gives ``M`` itself to compare ``Σ δ_hj`` with ``δ``.

**Shares without the parts.** The share of a part in the patch is
``⟨W δ_hj, W δ⟩ / ‖W δ‖² = α_hj (v_hj − v̄_hK) · (O_hᵀ g)`` with ``g = M_Fᵀ WᵀW δ / ‖W δ‖²``:
one vector–Jacobian product per quadrature node (:func:`integrated_vjp`), then dot
products, about ``H·n·d_head`` per query and layer (``WᵀW = RᵀR``, ``R`` of the thin QR of
the stacked dense weights, docs/design.md §3). Shares sum to 1 over heads and tokens; a
negative share is a part that points against the patch. This is an attribution of the
implicit weight update, not of the model's output.

Everything here is pure torch; ``F`` and ``P`` are callables (the model side passes the
block's own norms, so rounding is the forward's).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from icl_lens.core._factored import safe_divide
from icl_lens.core._kept_attention import head_values

RowMap = Callable[[Tensor], Tensor]
"""A map applied row-wise: ``[..., rows, d_in] → [..., rows, d_out]`` (each row with its own query's data)."""


@functools.cache
def _legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(n)
    return (x + 1) / 2, w / 2


def gauss_legendre(n: int, *, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
                   ) -> tuple[Float[Tensor, " node"], Float[Tensor, " node"]]:
    """Nodes and weights of ``n``-point Gauss–Legendre quadrature on ``[0, 1]`` (weights sum to 1)."""
    if n < 1:
        raise ValueError(f"quadrature needs at least one node, got {n}")
    x, w = _legendre(int(n))
    return torch.as_tensor(x, dtype=dtype, device=device), torch.as_tensor(w, dtype=dtype, device=device)


def path_points(start: Float[Tensor, "*rows d"], end: Float[Tensor, "*rows d"], nodes: Float[Tensor, " node"]
                ) -> Float[Tensor, "node *rows d"]:
    """``start + s (end − start)`` at each node ``s``."""
    shape = (-1,) + (1,) * start.ndim
    return start[None] + nodes.to(start.dtype).reshape(shape) * (end - start)[None]


def integrated_vjp(fn: RowMap, start: Float[Tensor, "*rows d_in"], end: Float[Tensor, "*rows d_in"],
                   cotangent: Float[Tensor, "*rows d_out"], n_nodes: int | Sequence[int]
                   ) -> Float[Tensor, "*rows d_in"] | list[Float[Tensor, "*rows d_in"]]:
    """``M_fnᵀ g = Σ_q w_q J_fn(x_q)ᵀ g`` on the straight path from ``start`` to ``end`` (row-wise).

    One backward pass through ``fn`` at every node at once (the nodes are a leading batch
    axis). ``n_nodes`` a list: the same with each node count, still one pass (a rule and its
    refinement, to measure the quadrature error), returned as a list.
    """
    counts = [int(n_nodes)] if isinstance(n_nodes, int) else [int(n) for n in n_nodes]
    rules = [gauss_legendre(n, dtype=start.dtype, device=start.device) for n in counts]
    nodes = torch.cat([x for x, _ in rules])
    x = path_points(start.detach(), end.detach(), nodes).requires_grad_(True)
    with torch.enable_grad():
        y = fn(x)
        (grad,) = torch.autograd.grad(y, x, grad_outputs=cotangent.detach()[None].expand_as(y))
    out = [torch.einsum("q,q...->...", w, part) for (_, w), part in zip(rules, grad.split(counts))]
    return out[0] if isinstance(n_nodes, int) else out


def integrated_jacobian(fn: RowMap, start: Float[Tensor, "*rows d_in"], end: Float[Tensor, "*rows d_in"],
                        n_nodes: int) -> Float[Tensor, "*rows d_out d_in"]:
    """``M_fn = Σ_q w_q J_fn(x_q)`` itself, row-wise (one backward per output coordinate, batched).

    ``d_out`` times the work of :func:`integrated_vjp`; for a point (``start == end``) it is the
    Jacobian there.
    """
    nodes, weights = gauss_legendre(n_nodes, dtype=start.dtype, device=start.device)
    x = path_points(start.detach(), end.detach(), nodes)  # node *rows d_in
    with torch.no_grad():
        d_out = fn(x[:1]).shape[-1]
    basis = torch.eye(d_out, dtype=start.dtype, device=start.device)  # e d_out
    xs = x[None].expand(d_out, *x.shape).clone().requires_grad_(True)  # e node *rows d_in
    with torch.enable_grad():
        y = fn(xs)
        grad_out = basis.reshape(d_out, *([1] * (y.ndim - 2)), d_out).expand_as(y)
        (grad,) = torch.autograd.grad(y, xs, grad_outputs=grad_out)  # e node *rows d_in: row e of J
    return torch.einsum("q,eq...i->...ei", weights, grad)


def head_source_shares(alpha: Float[Tensor, "*query head key"], values: Float[Tensor, "key kv_head d_head"],
                       mix: Float[Tensor, "*query head d_head"], removed: Bool[Tensor, "*query key"],
                       w_o: Float[Tensor, "head d_head d_model"], cotangent: Float[Tensor, "*query d_model"],
                       ) -> Float[Tensor, "*query head key"]:
    """``α_hj (v_hj − v̄_hK) · (O_hᵀ g)`` for every head and removed key ``j`` (0 at the other keys).

    ``mix`` is the kept-only value mix ``v̄_hK`` (:func:`icl_lens.core.kept_set_output`).
    With ``g = M_Fᵀ WᵀW δ / ‖W δ‖²`` these are the patch shares; with ``g = M_Pᵀ c / ‖c‖²`` the
    correction shares. ``w_o[h]`` maps head ``h``'s ``d_head`` output to the residual
    (``raw = Σ_h z_h @ w_o[h] + b``). Never forms a ``d_model`` vector per part.
    """
    og = torch.einsum("hde,...e->...hd", w_o, cotangent)  # O_hᵀ g
    n_heads, n_kv = alpha.shape[-2], values.shape[-2]
    grouped = og.reshape(*og.shape[:-2], n_kv, n_heads // n_kv, og.shape[-1])  # query head h reads kv head h // group
    vg = torch.einsum("kvd,...vgd->...vgk", values, grouped).reshape(*alpha.shape)  # v_hj · O_hᵀ g
    mix_g = torch.linalg.vecdot(mix, og)[..., None]  # v̄_hK · O_hᵀ g
    return alpha * (vg - mix_g) * removed[..., None, :].to(alpha.dtype)


def head_source_parts(alpha: Float[Tensor, "head key"], values: Float[Tensor, "key kv_head d_head"],
                      mix: Float[Tensor, "head d_head"], removed: Bool[Tensor, " key"],
                      w_o: Float[Tensor, "head d_head d_model"]) -> Float[Tensor, "head key d_model"]:
    """The raw parts ``α_hj O_h (v_hj − v̄_hK)`` of one query (zero at keys not removed); they sum to
    ``raw_C − raw_0``. ``H·n·d_model`` floats: for norms and checks, one query at a time."""
    deviation = head_values(values, alpha.shape[-2]).transpose(0, 1) - mix[:, None, :]  # head key d_head
    weight = alpha * removed[None, :].to(alpha.dtype)
    return torch.einsum("hk,hkd,hde->hke", weight, deviation, w_o)


def share_cotangent(target: Float[Tensor, "*query d"], metric: Float[Tensor, "d d"] | None = None
                    ) -> Float[Tensor, "*query d"]:
    """``Gᵀ G x / ‖G x‖²`` (``G = metric``, the identity when None): the cotangent whose inner product
    with a part of ``x`` is that part's share of ``x`` in the ``‖G ·‖`` geometry (0 where ``x`` is 0).

    For the patch, ``x = δ`` and ``G = R`` (``‖R δ‖ = ‖W δ‖``); for the correction, ``x = c``.
    """
    coords = target if metric is None else target @ metric.T
    sq = torch.linalg.vecdot(coords, coords)[..., None]
    back = coords if metric is None else coords @ metric
    return safe_divide(back, sq.expand_as(back))
