"""In-context linear regression prompts (the setting of Dherin et al. 2025, arXiv 2507.16003, §5).

A prompt holds ``n`` context pairs ``(xᵢ, yᵢ)`` from one random linear map and a query:

    w ~ N(0, I_d),   xᵢ ~ N(0, I_d),   yᵢ = wᵀxᵢ,
    context token  eᵢ = [xᵢ, yᵢ, 0],     query token  e_q = [x_q, 0, 1],

and the model must predict ``y_q = wᵀx_q`` at the query position. The last coordinate
flags the query (there are no positional embeddings: the causal mask alone orders
tokens). With ``query_flag=False`` (the paper's single-block setting) the flag is
dropped: ``eᵢ = [xᵢ, yᵢ]``, ``e_q = [x_q, 0]``. The least-squares solution is exact once
``n ≥ d``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor


@dataclass(frozen=True, eq=False)
class RegressionPrompts:
    """A batch of prompts: ``tokens[b] = [e₁ … e_n, e_q]`` and the query targets."""

    tokens: Float[Tensor, "batch pos d_token"]
    targets: Float[Tensor, " batch"]
    weights: Float[Tensor, "batch d_x"]

    @property
    def n_context(self) -> int:
        return self.tokens.shape[1] - 1

    @property
    def d_x(self) -> int:
        return self.weights.shape[1]

    def context_pairs(self) -> tuple[Float[Tensor, "batch n d_x"], Float[Tensor, "batch n"]]:
        """The context inputs ``xᵢ`` and labels ``yᵢ``."""
        ctx = self.tokens[:, :-1]
        return ctx[..., : self.d_x], ctx[..., self.d_x]

    def query(self) -> Float[Tensor, "batch d_token"]:
        return self.tokens[:, -1]

    def to(self, dtype: torch.dtype) -> "RegressionPrompts":
        return RegressionPrompts(self.tokens.to(dtype), self.targets.to(dtype), self.weights.to(dtype))


def token_dim(d_x: int, query_flag: bool = True) -> int:
    """Size of one token vector ``[x, y, is_query]`` (``[x, y]`` without the flag)."""
    return d_x + 1 + int(query_flag)


def context_tokens(x: Float[Tensor, "*batch n d_x"], y: Float[Tensor, "*batch n"], *,
                   query_flag: bool = True) -> Float[Tensor, "*batch n d_token"]:
    """Context tokens ``[x, y, 0]`` (``[x, y]`` without the flag)."""
    parts = [x, y[..., None]] + ([torch.zeros_like(y[..., None])] if query_flag else [])
    return torch.cat(parts, dim=-1)


def query_tokens(x: Float[Tensor, "*batch d_x"], *, query_flag: bool = True) -> Float[Tensor, "*batch d_token"]:
    """Query tokens ``[x, 0, 1]`` (``[x, 0]`` without the flag): the label slot is empty."""
    zero = torch.zeros_like(x[..., :1])
    return torch.cat([x, zero] + ([torch.ones_like(zero)] if query_flag else []), dim=-1)


def sample_prompts(
    batch: int,
    n_context: int,
    d_x: int,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    weights: Float[Tensor, "batch d_x"] | None = None,
    query_flag: bool = True,
) -> RegressionPrompts:
    """``batch`` prompts with ``n_context`` pairs each (a fresh ``w`` per prompt unless given).

    ``query_flag``: token layout of the model (``model.cfg.query_flag``)."""
    if batch < 1 or n_context < 0 or d_x < 1:
        raise ValueError(f"need batch ≥ 1, n_context ≥ 0, d_x ≥ 1 (got {batch}, {n_context}, {d_x})")
    g = generator
    w = torch.randn(batch, d_x, generator=g, dtype=dtype) if weights is None else weights.to(dtype)
    if w.shape != (batch, d_x):
        raise ValueError(f"weights must have shape ({batch}, {d_x}), got {tuple(w.shape)}")
    x = torch.randn(batch, n_context + 1, d_x, generator=g, dtype=dtype)
    y = torch.einsum("bnd,bd->bn", x, w)
    tokens = torch.cat([context_tokens(x[:, :-1], y[:, :-1], query_flag=query_flag),
                        query_tokens(x[:, -1], query_flag=query_flag)[:, None]], dim=1)
    return RegressionPrompts(tokens=tokens, targets=y[:, -1], weights=w)


def prefix_batch(context: Float[Tensor, "n d_token"], query: Float[Tensor, " d_token"]) -> Float[Tensor, "n_plus_1 n_plus_1 d_token"]:
    """Row ``i`` holds ``[c₁ … cᵢ, x_q, x_q, …]``: the query after the first ``i`` context tokens.

    Causal layers never look ahead, so what follows the query at position ``i`` does not
    change its output; one batched forward gives the query's states for every prefix.
    """
    n = context.shape[0]
    rows = query.expand(n + 1, n + 1, -1).clone()
    mask = torch.ones(n + 1, n + 1, dtype=torch.bool).tril(-1)  # row i keeps columns < i
    rows[mask] = context[None].expand(n + 1, n, -1)[mask[:, :n]] if n else rows[mask]
    return rows
