"""Attention pattern of one layer, read from a forward pass (:mod:`icl_lens.model._reading`).

``pattern[h, q, k] = softmax_k(q_h · k_h / √d_head + mask)`` — the attention weights the
token patches are built from (docs/design.md §2; Dherin et al. 2025, arXiv 2507.16003).
The forward stops right after the requested layer's attention, so later layers and the
unembedding never run.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from icl_lens.model._prompts import encode_prompt
from icl_lens.model._reading import activations_captured


def attention_pattern(
    model, prompt: str | Sequence[int] | Int[Tensor, " pos"], layer: int, *, past=None
) -> Float[Tensor, "head query key"]:
    """Attention weights of every head of ``layer`` for ``prompt`` (rows sum to 1).

    ``past``: a key/value cache of the prompt's first ``p`` positions
    (:meth:`icl_lens.patches._incremental.PatchSession.prefix_cache`); only the rows of
    positions ``p..`` are computed then (``[head, pos − p, pos]``).
    """
    n_layers = int(model.cfg.n_layers)
    if not 0 <= layer < n_layers:
        raise IndexError(f"layer {layer} is outside the model (0..{n_layers - 1})")
    ids = encode_prompt(model, prompt)
    name = f"blocks.{layer}.attn.hook_pattern"
    start = 0 if past is None else past.get_seq_length()
    with torch.no_grad(), activations_captured(model, [name], stop_after=name) as acts:
        if past is None:
            model(ids[None], return_type=None)
        else:
            model(ids[None, start:], past_key_values=past, return_type=None)
    if name not in acts:
        raise RuntimeError(f"the attention pattern hook of layer {layer} did not fire")
    return acts[name][0].float().cpu()
