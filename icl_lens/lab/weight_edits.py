"""Apply factored edits of the MLP's first dense weights through hooks (never a dense matrix per token).

An edit of layer ``l`` is ``ΔW_in = Σ_k U_k V_kᵀ`` plus an optional bias on the MLP
output. Inside :func:`mlp_edits_applied` the hook on ``blocks.l.mlp.hook_pre`` adds
``ΔW_in a = Σ_k U_k (V_k · a)`` to the pre-activation (``a`` = the MLP input read at
``blocks.l.hook_mlp_in``) and ``hook_mlp_out`` adds the bias. ``U``/``V`` carry a leading
batch axis (one edit per sequence, e.g. a token patch per query) or a leading 1 (one
edit shared by all sequences, e.g. explicit SGD steps, a thought matrix written as
``Σ_k Δ[:, k] e_kᵀ``).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor


@dataclass(frozen=True, eq=False)
class MLPEdit:
    """``ΔW_in = Σ_k U[:, k] V[:, k]ᵀ`` and an MLP-output bias, per sequence (or shared, leading 1)."""

    U: Float[Tensor, "seq k d_mlp"] | None = None
    V: Float[Tensor, "seq k d_model"] | None = None
    bias: Float[Tensor, "seq d_model"] | None = None

    @staticmethod
    def dense(delta: Float[Tensor, "d_mlp d_model"], bias: Float[Tensor, " d_model"] | None = None) -> "MLPEdit":
        """A static matrix (a thought matrix) as ``d_model`` rank-1 terms ``Δ[:, k] e_kᵀ``."""
        eye = torch.eye(delta.shape[1], dtype=delta.dtype)
        return MLPEdit(U=delta.T[None], V=eye[None], bias=None if bias is None else bias[None])


@contextmanager
def mlp_edits_applied(model, edits: dict[int, MLPEdit], extra_hooks: list | None = None):
    """Context manager: the model's MLPs run with ``W_in + ΔW_in`` and the output biases of ``edits``.

    ``extra_hooks`` (``(name, fn)`` pairs) run after the edits, e.g. to read the edited pre-activations.
    """
    n_layers = len(model.blocks)
    for layer in edits:
        if not 0 <= layer < n_layers:
            raise IndexError(f"layer {layer} outside 0..{n_layers - 1}")
    store: dict[int, Tensor] = {}
    hooks = []
    for layer, edit in edits.items():
        def keep_input(a, hook, layer=layer):
            store[layer] = a
        def add_rank_one(pre, hook, layer=layer, edit=edit):
            a = store.pop(layer)
            coeff = a @ edit.V.to(a.dtype).transpose(-1, -2)  # seq pos k
            return pre + coeff @ edit.U.to(a.dtype)
        def add_bias(out, hook, edit=edit):
            return out + edit.bias.to(out.dtype)[:, None, :]
        if edit.U is not None:
            hooks += [(f"blocks.{layer}.hook_mlp_in", keep_input), (f"blocks.{layer}.mlp.hook_pre", add_rank_one)]
        if edit.bias is not None:
            hooks.append((f"blocks.{layer}.hook_mlp_out", add_bias))
    with model.hooks(fwd_hooks=hooks + list(extra_hooks or [])):
        yield model
