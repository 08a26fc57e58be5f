"""Apply a thought patch to a TransformerBridge through hooks (arXiv 2510.08734).

Per patched layer ``l`` with input map ``M`` (``Δ = W M``) and vector part:

    dense outputs    W x  →  W x + W (M x)       (W_in; W_gate and W_up for gated MLPs)
    bias site        branch → branch + c          (GPT-2: c_proj bias; Llama: down_proj bias)
    gain site        (1+w)⊙ŷ → (1+w+g)⊙ŷ          (Gemma 3: post-FFN RMSNorm gain)

``M x`` is computed once per token from the MLP input and shared by the dense layers,
so no ``d_mlp × d_model`` matrix is ever formed. The hooks live only inside the
``with model.hooks(...)`` block of :func:`thought_applied`.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor

from icl_lens.core.thought_math import rms_normalize
from icl_lens.model.block_family import BlockFamily, block_family, dense_weight, original


def vector_site(family: BlockFamily) -> str:
    """Where the thought vector goes: ``"gain"`` after a post-FFN RMSNorm, else ``"bias"``."""
    return "gain" if family.post_mlp_norm else "bias"


def post_norm_eps(model, layer: int) -> float:
    """``eps`` of layer ``layer``'s post-FFN RMSNorm (Gemma 3)."""
    norm = original(model.blocks[layer].ln2_post)
    return float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6)))


def thought_hooks(
    model,
    maps: dict[int, Tensor],
    vectors: dict[int, Tensor],
    *,
    family: BlockFamily | None = None,
) -> list[tuple[str, object]]:
    """Forward hooks adding ``W (M x)`` to the dense outputs and the vector part, per layer."""
    family = family or block_family(model)
    site = vector_site(family)
    hooks: list[tuple[str, object]] = []
    for layer, m in maps.items():
        if m is None:
            continue
        block = model.blocks[layer]
        dense = [(family.dense_in_out(layer), dense_weight(block.mlp.__getattr__("in")))]
        if family.gated:
            dense.append((family.dense_gate_out(layer), dense_weight(block.mlp.gate)))
        state: dict[str, Tensor] = {}

        def read(x, hook, m=m, state=state):
            state["mx"] = x.to(m.dtype) @ m.T

        hooks.append((family.mlp_input(layer), read))
        for name, w in dense:
            def add(x, hook, w=w, state=state):
                return x + (state["mx"].to(w.dtype) @ w.T).to(x.dtype)

            hooks.append((name, add))
    for layer, vec in vectors.items():
        if vec is None:
            continue
        if site == "bias":
            hooks.append((family.mlp_branch_out(layer), lambda x, hook, v=vec: x + v.to(x.dtype)))
        else:
            eps, state = post_norm_eps(model, layer), {}

            def read_y(x, hook, state=state, eps=eps):
                state["yhat"] = rms_normalize(x, eps)

            def add_gain(x, hook, v=vec, state=state):
                return x + (state["yhat"].to(v.dtype) * v).to(x.dtype)

            hooks.append((f"blocks.{layer}.ln2_post.hook_in", read_y))
            hooks.append((family.mlp_branch_out(layer), add_gain))
    return hooks


@contextmanager
def thought_applied(model, maps: dict[int, Tensor], vectors: dict[int, Tensor]):
    """Context manager: ``model`` runs with the thought patch; hooks removed on exit."""
    with model.hooks(fwd_hooks=thought_hooks(model, maps, vectors)):
        yield model
