"""The kept-only forward with token patches applied (docs/design.md §2).

The kept-only forward runs the model on the kept tokens alone (BOS + query by default,
each at its original position id), with every layer's patch applied as a weight edit
(:mod:`icl_lens.model._weight_edits`):

    W_in ← W_in + u_in vᵀ,  W_gate ← W_gate + u_gate vᵀ,  MLP output += correction,

with ``u = W δ`` formed for the patched positions only.

The edit acts on the actual MLP input of the kept-only pass; nothing is copied from
the contextual pass. Its logits at the query must equal the contextual logits at ``t``:
that identity is what "exact" means in icl_lens (Dherin et al. 2025, arXiv 2507.16003),
checked by :func:`icl_lens.patches._token_patches.verify_equivalence`.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from icl_lens.patches._patch_set import TokenPatches
from icl_lens.model._block_family import block_family
from icl_lens.model._weight_edits import MLPEdit, edits_applied

if TYPE_CHECKING:
    from icl_lens.model._types import Model


def token_patch_edits(patches: TokenPatches, sources: Int[Tensor, "batch pos"],
                      dtype: torch.dtype) -> dict[int, MLPEdit]:
    """Per-position edits: input row ``b``, position ``i`` gets the patch of prompt position ``sources[b, i]``.

    ``sources[b, i] = -1`` leaves that input position unpatched. Edits are keyed by the
    model layers the patches hold (``patches.layers``); every position must be held. ``u``
    is formed for the picked positions only (:meth:`~icl_lens.patches._patch_set.TokenPatches.u`).
    """
    if not patches.complete:
        raise ValueError("applying patches needs every position of the prompt; select layers only")
    valid = (sources >= 0)[..., None].to(dtype)
    src = sources.clamp_min(0)

    def gather(factor: Tensor | None) -> Tensor | None:
        return None if factor is None else factor.to(device=src.device, dtype=dtype) * valid

    def rank_one(factor: Tensor | None) -> Tensor | None:
        return None if factor is None else gather(factor)[..., None, :]

    index = src.to(patches.v.device)
    edits = {}
    for k, layer in enumerate(patches.layers):
        u_in, u_gate = patches.u(layer, index)
        edits[layer] = MLPEdit(v=rank_one(patches.v[k][index]), u_in=rank_one(u_in), u_gate=rank_one(u_gate),
                               bias=gather(patches.correction[k][index]))
    return edits


@contextmanager
def patches_applied(model: Model, patches: TokenPatches, sources: Int[Tensor, "batch pos"]) -> Iterator[Model]:
    """Within the block, row ``b`` position ``i`` of the input gets the patch of prompt position ``sources[b, i]``.

    ``sources[b, i] = -1`` leaves that input position unpatched. Only the layers the
    patches hold (``patches.layers``) are edited. Hooks are removed on exit.
    """
    edits = token_patch_edits(patches, sources, patches.v.dtype)
    with edits_applied(model, edits):
        yield model


def kept_only_masks(model, positions: Int[Tensor, "batch pos"]):
    """Attention masks for inputs whose tokens sit at arbitrary (sorted) position ids.

    Plain causal masking over the kept tokens is right for global attention; a sliding
    window must be measured in original positions (``key visible iff 0 ≤ q_pos − k_pos <
    window``). Returns None without sliding layers, one 4D mask when every layer slides
    (Mistral, Phi-3), or one mask per layer kind (Gemma 2/3, Qwen2 with sliding layers):
    what the block family's Hugging Face model takes.
    """
    layout = block_family(model).sliding_layout(model)
    if layout is None:
        return None
    kinds, window = layout
    dist = positions[:, :, None] - positions[:, None, :]  # q - k
    zero = torch.zeros((), dtype=model.cfg.dtype, device=positions.device)
    neg = torch.full((), torch.finfo(model.cfg.dtype).min, dtype=model.cfg.dtype, device=positions.device)

    def mask(sliding: bool) -> Tensor:
        allowed = (dist >= 0) & (dist < window) if sliding else dist >= 0
        return torch.where(allowed, zero, neg)[:, None]

    if kinds is None:
        return mask(True)
    return {kind: mask(kind == "sliding_attention") for kind in set(kinds)}


def kept_only_logits(
    model, ids: Int[Tensor, " pos"], patches: TokenPatches, queries: Sequence[int], *, batch_size: int = 16
) -> Float[Tensor, "query vocab"]:
    """Logits of each query from the patched kept-only forward, batched by kept-set size."""
    return kept_only_logits_many(model, [(ids, patches, t) for t in queries], batch_size=batch_size)


def kept_only_logits_many(
    model, requests: Sequence[tuple[Int[Tensor, " pos"], TokenPatches, int]], *, batch_size: int = 16
) -> Float[Tensor, "request vocab"]:
    """:func:`kept_only_logits` for ``(ids, patches, query)`` requests of any prompts, batched together.

    Requests whose kept sets have the same size share a forward (each row with its own
    token ids, position ids and per-position patches), so the unembedding runs once per
    batch, on the last row only, instead of once per prompt. A forward whose rows all carry
    zero patches (``TokenPatches.keep_parts(w_in=False, correction=False)``) runs without edits.
    """
    results: dict[int, Tensor] = {}
    groups: dict[int, list[int]] = {}
    for r, (_, patches, t) in enumerate(requests):
        groups.setdefault(len(patches.kept_positions(t)), []).append(r)
    for _, rs in sorted(groups.items()):
        for start in range(0, len(rs), batch_size):
            chunk = rs[start : start + batch_size]
            pos = [torch.tensor([requests[r][1].kept_positions(requests[r][2])], device=requests[r][0].device)
                   for r in chunk]
            inputs = torch.cat([requests[r][0][p] for r, p in zip(chunk, pos)])
            edits = (_concat_edits([token_patch_edits(requests[r][1], p, requests[r][1].v.dtype)
                                    for r, p in zip(chunk, pos)])
                     if any(_patched(requests[r][1]) for r in chunk) else {})
            pos = torch.cat(pos)
            with torch.no_grad(), edits_applied(model, edits):
                logits = model(inputs, position_ids=pos, attention_mask=kept_only_masks(model, pos),
                               logits_to_keep=1)  # the query's logits only
            for row, r in enumerate(chunk):
                results[r] = logits[row, -1]
    return torch.stack([results[r] for r in range(len(requests))])


def _patched(patches: TokenPatches) -> bool:
    """Whether any part of the patches is non-zero (a zero patch's edits change nothing)."""
    return any(t is not None and bool(t.any())
               for t in (patches.delta, patches.stored_u_in, patches.stored_u_gate, patches.correction))


def _concat_edits(parts: Sequence[dict[int, MLPEdit]]) -> dict[int, MLPEdit]:
    """Per-row edits of several inputs stacked along the batch dimension."""
    cat = lambda xs: None if xs[0] is None else torch.cat(xs)  # noqa: E731
    return {layer: MLPEdit(v=cat([p[layer].v for p in parts]), u_in=cat([p[layer].u_in for p in parts]),
                           u_gate=cat([p[layer].u_gate for p in parts]), bias=cat([p[layer].bias for p in parts]))
            for layer in parts[0]}
