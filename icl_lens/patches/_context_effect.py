"""Where the context effect lives: the MLP weight patches, the skip corrections, or both (docs/design.md §2).

A token patch has two parts (Dherin et al. 2025, arXiv 2507.16003): the rank-1 edit of
the first dense MLP weights (``u vᵀ``, gated MLPs: both ``W_gate`` and ``W_up``) and, in a
block with a skip connection, the correction ``attn_C − attn_0`` added after the MLP. Only
both together are exact. Run the kept-only forward (``[BOS, x_t]`` at original positions,
:func:`icl_lens.patches._kept_only.kept_only_logits_many`) with

    none        no patch (the context-free model)
    w_in        only the weight patches of every layer
    correction  only the corrections of every layer
    full        both (equal to the contextual forward up to rounding)

and measure, at each query position, ``KL(p_context ‖ p_variant)`` of the next-token
distributions. ``KL_variant / KL_none`` is the fraction of the context's effect that the
variant leaves unexplained (0: all of it reproduced, 1: as far off as no context).
Several prompts share each batched forward.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.model._greedy import last_logits
from icl_lens.patches._kept_only import kept_only_logits_many
from icl_lens.patches._token_patches import token_patches
from icl_lens.model._prompts import encode_prompt

if TYPE_CHECKING:
    from icl_lens.model._types import Model

VARIANTS = {"none": (False, False), "w_in": (True, False), "correction": (False, True), "full": (True, True)}


@dataclass(frozen=True, eq=False)
class ContextEffect:
    """``kl[variant][k]``: KL(contextual ‖ variant) in nats at query ``k`` (prompt ``prompts[k]``, ``positions[k]``)."""

    prompts: tuple[int, ...]
    positions: tuple[int, ...]
    kl: dict[str, Float[Tensor, " query"]]

    def unexplained(self) -> dict[str, float]:
        """Per variant: mean KL over the queries divided by the mean KL without any patch."""
        base = float(self.kl["none"].double().mean())
        return {k: float(v.double().mean()) / base if base > 0 else float("nan") for k, v in self.kl.items()}

    def to_frame(self) -> pd.DataFrame:
        rows = [{"variant": k, "prompt": self.prompts[i], "position": p, "kl": float(v[i])}
                for k, v in self.kl.items() for i, p in enumerate(self.positions)]
        return pd.DataFrame(rows)


def _wide(x: Tensor) -> Tensor:
    """Half-precision logits in float32; float32/float64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


@torch.no_grad()
def context_effect(model: Model, prompts, *, positions: Sequence[int] | None = None, batch_size: int = 64) -> ContextEffect:
    """KL of each patch variant from the contextual next-token distribution (see the module docstring).

    ``prompts``: one prompt (text or ids) or a list of them. ``positions``: query positions
    in each prompt (negative from the end; default: every position with at least one context
    token besides a kept BOS).
    """
    many = isinstance(prompts, (list, tuple)) and not (prompts and isinstance(prompts[0], int))
    encoded = [encode_prompt(model, p) for p in (prompts if many else [prompts])]
    requests, owners, where, contextual = [], [], [], []
    for k, ids in enumerate(encoded):
        patches = token_patches(model, ids)
        first = 2 if patches.kept_bos else 1
        n = ids.numel()
        queries = list(range(first, n)) if positions is None else sorted({int(p) % n for p in positions})
        if not queries or min(queries) < first:
            raise ValueError(f"prompt {k} ({n} tokens) has no context before query positions {queries}")
        if queries == [n - 1]:
            contextual.append(None)
        else:
            contextual.append(model(ids[None], logits_to_keep=n - queries[0])[0, [q - queries[0] for q in queries]])
        for name, (w_in, corr) in VARIANTS.items():
            variant = patches.keep_parts(w_in=w_in, correction=corr)
            requests += [(ids, variant, t) for t in queries]
        owners += [k] * len(queries)
        where += queries
    last = [i for i, c in enumerate(contextual) if c is None]
    if last:
        for i, row in zip(last, last_logits(model, [encoded[i].tolist() for i in last])):
            contextual[i] = row[None]
    logp = torch.log_softmax(_wide(torch.cat(contextual)), -1)
    logits = kept_only_logits_many(model, requests, batch_size=batch_size)
    kl, offset = {name: [] for name in VARIANTS}, 0
    for k, ids in enumerate(encoded):
        m = sum(1 for o in owners if o == k)
        for name in VARIANTS:
            logq = torch.log_softmax(_wide(logits[offset: offset + m]), -1)
            kl[name].append(logq)
            offset += m
    logq = {name: torch.cat(v) for name, v in kl.items()}
    kl = {name: (logp.exp() * (logp - q)).sum(-1).clamp_min(0).cpu() for name, q in logq.items()}
    return ContextEffect(tuple(owners), tuple(where), kl)
