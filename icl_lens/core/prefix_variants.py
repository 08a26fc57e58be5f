"""One sequence that holds a prompt prefix and every context-prefix variant of one query.

The implicit trajectory of query ``t`` (docs/design.md §3; Dherin et al. 2025, arXiv
2507.16003, §3) needs the query's forward with context prefix ``c₁..cᵢ`` for every
i = 0..n. Attention is causal, so the keys and values of ``c_j`` are the same in every
prefix forward as in the prompt's own forward. All n+1 variants therefore fit in ONE
sequence over a shared key/value prefix:

    sequence  = [x₀, …, x_{t−1}, x_t, x_t, …, x_t]      (n+1 copies of the query)
    positions = [0,  …, t−1,     t,   t,   …, t  ]      (every copy at its original position)
    copy i attends to {0, …, b+i−1} ∪ {itself}           (b = 1 when a BOS is kept, else 0)

while the prefix rows stay plainly causal. Its cost is one forward over about
``t + n + 1 ≈ 2t`` tokens, never n forwards over the prompt.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor


@dataclass(frozen=True, eq=False)
class PrefixVariantLayout:
    """Token sources, position ids and visibility of the shared-prefix sequence of query ``t``."""

    query: int
    first_context: int
    positions: Int[Tensor, " seq"]
    visible: Bool[Tensor, "seq seq"]

    @property
    def n_steps(self) -> int:
        """Number of variants, n+1 (prefix lengths 0..n)."""
        return self.positions.numel() - self.query

    def copy_rows(self) -> slice:
        """Sequence rows of the query copies; row ``query + i`` sees context prefix length i."""
        return slice(self.query, self.query + self.n_steps)


def prefix_variant_layout(query: int, first_context: int, *, device: torch.device | str = "cpu") -> PrefixVariantLayout:
    """Layout for query ``t = query`` whose context is positions ``first_context..t−1`` (n = t − first_context)."""
    n = query - first_context
    if n < 1:
        raise ValueError(f"query {query} has no context positions (first context position {first_context})")
    seq = query + n + 1
    positions = torch.cat([torch.arange(query, device=device), torch.full((n + 1,), query, device=device)])
    visible = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    visible[query:, query:] = torch.eye(n + 1, dtype=torch.bool, device=device)
    prefix_end = first_context + torch.arange(n + 1, device=device)  # copy i sees keys < first_context + i
    visible[query:, :query] = torch.arange(query, device=device)[None, :] < prefix_end[:, None]
    return PrefixVariantLayout(query=query, first_context=first_context, positions=positions, visible=visible)
