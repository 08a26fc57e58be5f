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
``t + n + 1 ≈ 2t`` tokens, never n forwards over the prompt. A copy sees nothing of the
other copies, so any subset of prefix lengths (``steps``, e.g. a few log-spaced ones for a
first, coarse drawing) gives exactly those variants at a fraction of the cost.

The "absorb" order (docs/design.md §3) needs no copies: step i keeps
``K_i = {0..b−1} ∪ {b+i, …, t}`` (``c₁..cᵢ`` absorbed into the weights, ``c_{i+1}..cₙ`` and
the query kept), and with every earlier layer patched the query's residual and the kept
keys and values are the contextual ones, so every step is the contextual pass's
attention row of ``t`` renormalised over ``K_i`` (:func:`absorb_layout`): one forward
over the ``t + 1`` prompt tokens.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor


@dataclass(frozen=True, eq=False)
class PrefixVariantLayout:
    """Token sources, position ids and visibility of the shared-prefix sequence of query ``t``.

    ``kept`` (absorb order only): step i's kept keys of the query row; the sequence is then
    the plain causal prompt ``x₀..x_t``.
    """

    query: int
    first_context: int
    positions: Int[Tensor, " seq"]
    visible: Bool[Tensor, "seq seq"]

    @property
    def n_steps(self) -> int:
        """Number of variants, n+1 (prefix lengths 0..n, or absorbed-token counts 0..n)."""
        return self.kept.shape[0] if self.kept is not None else self.positions.numel() - self.query

    kept: Bool[Tensor, "step seq"] | None = None

    def copy_rows(self) -> slice | Int[Tensor, " step"]:
        """Sequence rows holding step i's query (a copy per prefix; the query row itself for every absorb step)."""
        if self.kept is not None:
            return torch.full((self.n_steps,), self.query, dtype=torch.long, device=self.positions.device)
        return slice(self.query, self.query + self.n_steps)


def checked_steps(steps: Sequence[int] | None, n: int, device: torch.device | str = "cpu") -> Int[Tensor, " step"]:
    """``steps`` as a tensor (default ``0..n``); ``ValueError`` unless they increase strictly within 0..n."""
    if steps is None:
        return torch.arange(n + 1, device=device)
    out = [int(s) for s in steps]
    if not out or any(b <= a for a, b in zip(out, out[1:])) or out[0] < 0 or out[-1] > n:
        raise ValueError(f"steps must be increasing prefix lengths in 0..{n}, got {tuple(steps)}")
    return torch.tensor(out, device=device)


def log_spaced_steps(n: int, points: int = 8) -> tuple[int, ...]:
    """Prefix lengths for a coarse trajectory of ``n`` context tokens: ``points`` context lengths ``i`` spaced
    evenly in ``log i`` from 1 to n, each with its two predecessors ``i−1``, ``i−2`` (the meta-gradient norm at
    ``i`` needs ``W_{i−1}``, the consecutive alignment ``W_{i−2}`` too). Always holds 0 and n."""
    if n < 1 or points < 2:
        raise ValueError(f"need n >= 1 and points >= 2, got n={n}, points={points}")
    drawn = {round(n ** (k / (points - 1))) for k in range(points)} | {1, n}
    return tuple(sorted({s for i in drawn for s in (i - 2, i - 1, i) if 0 <= s <= n}))


def prefix_variant_layout(query: int, first_context: int, *, device: torch.device | str = "cpu",
                          steps: Sequence[int] | None = None) -> PrefixVariantLayout:
    """Layout for query ``t = query`` whose context is positions ``first_context..t−1`` (n = t − first_context).

    ``steps``: the prefix lengths to hold a copy for (increasing, in 0..n; default all of 0..n)."""
    n = query - first_context
    if n < 1:
        raise ValueError(f"query {query} has no context positions (first context position {first_context})")
    lengths = checked_steps(steps, n, device)
    k = lengths.numel()
    seq = query + k
    positions = torch.cat([torch.arange(query, device=device), torch.full((k,), query, device=device)])
    visible = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    visible[query:, query:] = torch.eye(k, dtype=torch.bool, device=device)
    prefix_end = first_context + lengths  # copy j sees keys < first_context + steps[j]
    visible[query:, :query] = torch.arange(query, device=device)[None, :] < prefix_end[:, None]
    return PrefixVariantLayout(query=query, first_context=first_context, positions=positions, visible=visible)


def absorb_layout(query: int, first_context: int, *, device: torch.device | str = "cpu",
                  steps: Sequence[int] | None = None) -> PrefixVariantLayout:
    """Layout of the absorb order: the causal prompt ``x₀..x_t`` and, per step i = 0..n (or i in ``steps``), the
    kept set ``K_i = {0..first_context−1} ∪ {first_context+i, …, t}`` of the query row."""
    n = query - first_context
    if n < 1:
        raise ValueError(f"query {query} has no context positions (first context position {first_context})")
    keys = torch.arange(query + 1, device=device)
    start = first_context + checked_steps(steps, n, device)
    kept = (keys[None, :] < first_context) | (keys[None, :] >= start[:, None])
    visible = torch.ones(query + 1, query + 1, dtype=torch.bool, device=device).tril()
    return PrefixVariantLayout(query=query, first_context=first_context, positions=keys, visible=visible, kept=kept)
