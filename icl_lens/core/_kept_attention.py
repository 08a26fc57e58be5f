"""Attention restricted to a kept set of keys, from one contextual pass (docs/design.md §2).

Softmax attention at query ``t`` is ``z_t = Σ_j softmax(s_t)_j v_j``. If ``t`` could
see only the keys in a kept set ``K_t``, and the keys and values of those tokens are
unchanged (true when every earlier layer is patched), its output would be

    z⁰_t = Σ_{j∈K_t} softmax(s_t|K_t)_j v_j,

the same cached scores renormalised over ``K_t``. No second forward pass is needed.
The default kept set is ``{t}`` plus the first token when it is a BOS attention sink;
then the renormalisation is a two-way softmax, a sigmoid of the score difference.
Scores already carry the model's causal and sliding-window masks (masked scores are
at the dtype's minimum), so a key outside the window gets weight zero here too.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor


def head_values(values: Float[Tensor, "*batch key kv_head d_head"], n_heads: int) -> Float[Tensor, "*batch key head d_head"]:
    """Expand grouped-query values to one per query head (head ``h`` reads kv head ``h // group``)."""
    groups = n_heads // values.shape[-2]
    return values.repeat_interleave(groups, dim=-2) if groups > 1 else values


def bos_and_self_output(
    scores: Float[Tensor, "*batch head query key"],
    values: Float[Tensor, "*batch query kv_head d_head"],
    *,
    keep_bos: bool | Bool[Tensor, "*batch"],
    offset: int = 0,
    bos_value: Float[Tensor, "*batch kv_head d_head"] | None = None,
) -> Float[Tensor, "*batch query head d_head"]:
    """``z⁰_t`` for the default kept set ``{0, t}`` (or ``{t}`` when ``keep_bos`` is False).

    ``scores`` rows are queries ``offset, offset+1, …`` (keys from 0), ``values`` holds
    those queries' own value rows, and ``bos_value`` the value of key 0 (default:
    ``values[..., 0, :, :]``, right when ``offset`` is 0). The offset form serves cached
    decoding. Leading batch dimensions are allowed; ``keep_bos`` may then differ per row
    (a boolean tensor over the batch).
    """
    n_heads, n_kv = scores.shape[-3], values.shape[-2]
    if keep_bos is False:
        return head_values(values, n_heads).clone()
    first = values[..., 0, :, :] if bos_value is None else bos_value  # *batch kv_head d
    diag = torch.diagonal(scores, offset=offset, dim1=-2, dim2=-1)  # *batch head query
    first_score = scores[..., 0]
    w_bos = torch.sigmoid(first_score - diag)
    w_self = torch.sigmoid(diag - first_score)
    if offset == 0:  # query 0 *is* the BOS: one key, weight 1
        w_bos[..., 0] = 0.0
        w_self[..., 0] = 1.0
    if isinstance(keep_bos, Tensor):  # rows without a kept BOS keep only themselves
        keep = keep_bos.to(w_bos.device)[..., None, None]
        w_bos = torch.where(keep, w_bos, torch.zeros_like(w_bos))
        w_self = torch.where(keep, w_self, torch.ones_like(w_self))
    # Heads grouped as (kv head, group), query head h reading kv head h // group: no copy of the values per head,
    # and one output buffer (the self term, then the BOS term added in place).
    def grouped(w: Tensor) -> Tensor:  # *batch head query -> *batch query kv_head group 1
        return w.transpose(-1, -2).unflatten(-1, (n_kv, n_heads // n_kv))[..., None]

    out = values[..., None, :] * grouped(w_self)
    out.addcmul_(first[..., None, :, None, :], grouped(w_bos))
    return out.flatten(-3, -2)


def kept_set_output(
    scores: Float[Tensor, "*batch head query key"],
    values: Float[Tensor, "*batch key kv_head d_head"],
    kept: Bool[Tensor, "*batch query key"],
) -> Float[Tensor, "*batch query head d_head"]:
    """``z⁰_t`` for an arbitrary kept set per query (``kept[t, t]`` must be True)."""
    n_heads, n_kv = scores.shape[-3], values.shape[-2]
    masked = scores.masked_fill(~kept[..., None, :, :], float("-inf"))
    weights = torch.softmax(masked.float() if masked.dtype in (torch.float16, torch.bfloat16) else masked, dim=-1)
    grouped = weights.to(values.dtype).unflatten(-3, (n_kv, n_heads // n_kv))  # query head h reads kv head h // group
    return torch.einsum("...vgqk,...kvd->...qvgd", grouped, values).flatten(-3, -2)


def default_kept_mask(n: int, *, keep_bos: bool, device: torch.device | str = "cpu",
                      queries: Sequence[int] | None = None) -> Bool[Tensor, "query key"]:
    """Boolean kept set of the default removal: ``{t}`` plus key 0 if ``keep_bos``.

    ``queries``: the rows of those query positions only (``[len(queries), n]``; default all ``n``),
    so a few queries of a long prompt never build the ``n × n`` mask.
    """
    rows = (torch.arange(n, device=device) if queries is None
            else torch.as_tensor(list(queries), dtype=torch.long, device=device))
    kept = torch.zeros(len(rows), n, dtype=torch.bool, device=device)
    kept[torch.arange(len(rows), device=device), rows] = True
    if keep_bos and n:
        kept[:, 0] = True
    return kept


def removal_kept_mask(
    n: int, removed: Bool[Tensor, "key"]
) -> Bool[Tensor, "query key"]:
    """Kept set when the positions in ``removed`` are dropped: causal keys not removed, plus ``t`` itself."""
    causal = torch.ones(n, n, dtype=torch.bool, device=removed.device).tril()
    return (causal & ~removed[None, :]) | torch.eye(n, dtype=torch.bool, device=removed.device)


def removes_nothing(kept: Bool[Tensor, "*batch query key"], *, offset: int = 0) -> Bool[Tensor, "*batch query"]:
    """Rows whose kept set is the whole causal prefix: nothing is removed, the patch is zero.

    Row ``i`` is query position ``offset + i`` (``offset`` > 0 for cached decoding).
    """
    causal = torch.ones(kept.shape[-2:], dtype=torch.bool, device=kept.device).tril(diagonal=offset)
    return (kept == causal).all(-1)
