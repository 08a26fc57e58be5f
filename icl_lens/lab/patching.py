"""Token patches of the lab models and the patched context-free forward (docs/design.md §2).

For every layer ``l`` and position ``t`` of a batch of prompts, from ONE contextual pass
(Dherin et al. 2025, arXiv 2507.16003, Theorem 2.2, which holds for any contextual layer):

    r = resid_pre,  attn_C = M(C, LN₁ r)                   (what the contextual layer adds)
    attn_0 = M({t}, LN₁ r)                                  (position t with its context removed)
    A = LN₂(r + attn_C),  a = LN₂(r + attn_0),  δ = A − a
    ΔW_in = u vᵀ,  u = W_in δ,  v = a/‖a‖²,  correction = attn_C − attn_0   (MLP-output bias)

For softmax attention ``attn_0`` is the cached scores renormalised over ``{t}``
(:mod:`icl_lens.core.kept_attention`); for linear attention, the delta rule and the GRU
it is the layer run on the token alone. Running each token alone with every layer's
patch applied reproduces the contextual forward exactly (:func:`patched_context_free`).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from icl_lens.core.factored import patch_norm
from icl_lens.core.kept_attention import default_kept_mask
from icl_lens.core.patch_set import TokenPatches
from icl_lens.core.token_patch import token_patch
from icl_lens.lab.model import RegressionModel
from icl_lens.model.weight_edits import MLPEdit, edits_applied

_MIXER_CACHE = ("hook_attn_scores", "hook_v")


@dataclass(frozen=True, eq=False)
class LabPatches:
    """Factored token patches of a batch of prompts: every layer × prompt × position."""

    arch: str
    u: Float[Tensor, "layer batch pos d_mlp"]
    v: Float[Tensor, "layer batch pos d_model"]
    correction: Float[Tensor, "layer batch pos d_model"]
    contextual_input: Float[Tensor, "layer batch pos d_model"]
    kept_input: Float[Tensor, "layer batch pos d_model"]
    zero_input: Bool[Tensor, "layer batch pos"]

    @property
    def n_layers(self) -> int:
        return self.u.shape[0]

    def norms(self) -> Float[Tensor, "layer batch pos"]:
        """``‖ΔW_in‖_F = ‖u‖·‖v‖``."""
        return patch_norm(self.u, self.v)

    def for_prompt(self, b: int) -> TokenPatches:
        """Prompt ``b`` as the foundation's :class:`~icl_lens.core.patch_set.TokenPatches`."""
        n = self.u.shape[2]
        return TokenPatches(
            model_name=f"lab-{self.arch}", tokens=tuple(["(x,y)"] * (n - 1) + ["query"]),
            token_ids=torch.arange(n), u_in=self.u[:, b], u_gate=None, v=self.v[:, b],
            correction=self.correction[:, b], kept=default_kept_mask(n, keep_bos=False), kept_bos=False,
            zero_input=self.zero_input[:, b])

    def edits(self) -> dict[int, MLPEdit]:
        """One edit per (prompt, position) sequence, for the context-free forward on single tokens."""
        L, B, T = self.u.shape[:3]
        return {l: MLPEdit(v=self.v[l].reshape(B * T, 1, 1, -1), u_in=self.u[l].reshape(B * T, 1, 1, -1),
                           bias=self.correction[l].reshape(B * T, 1, -1)) for l in range(L)}

    def to_frame(self) -> pd.DataFrame:
        norms = self.norms().detach().double()
        corr = torch.linalg.vector_norm(self.correction, dim=-1).detach().double()
        L, B, T = norms.shape
        idx = torch.cartesian_prod(torch.arange(L), torch.arange(B), torch.arange(T))
        return pd.DataFrame({"layer": idx[:, 0].numpy(), "prompt": idx[:, 1].numpy(), "position": idx[:, 2].numpy(),
                             "norm": norms.flatten().numpy(), "correction_norm": corr.flatten().numpy()})


def _hook_names(model: RegressionModel) -> set[str]:
    names = set()
    for l, block in enumerate(model.blocks):
        names |= {f"blocks.{l}.{h}" for h in ("hook_resid_pre", "hook_mix_in", "hook_mix_out", "hook_mlp_in")}
        names |= {f"blocks.{l}.mix.{h}" for h in _MIXER_CACHE if hasattr(block.mix, h)}
    return names


@torch.no_grad()
def lab_token_patches(model: RegressionModel, tokens: Float[Tensor, "batch pos d_token"]) -> LabPatches:
    """Token patches of every layer and position from one contextual pass (context removed = ``{t}`` kept)."""
    names = _hook_names(model)
    _, cache = model.run_with_cache(model.check_tokens(tokens), names_filter=lambda n: n in names)
    out = {k: [] for k in ("u", "v", "correction", "A", "a", "zero")}
    for l, block in enumerate(model.blocks):
        r, h = cache[f"blocks.{l}.hook_resid_pre"], cache[f"blocks.{l}.hook_mix_in"]
        attn_C, A = cache[f"blocks.{l}.hook_mix_out"], cache[f"blocks.{l}.hook_mlp_in"]
        cached = {k: cache[f"blocks.{l}.mix.{k}"] for k in _MIXER_CACHE if f"blocks.{l}.mix.{k}" in cache}
        attn_0 = block.mix.context_free(h, cached)
        a = block.ln2(r + attn_0)
        for name, x in (("A", A), ("a", a)):
            if not torch.isfinite(x).all():
                raise FloatingPointError(f"non-finite MLP input ({name}) at layer {l}")
        u, v, zero = token_patch(block.mlp.W_in.weight, A, a)
        for k, x in (("u", u), ("v", v), ("correction", attn_C - attn_0), ("A", A), ("a", a), ("zero", zero)):
            out[k].append(x)
    st = {k: torch.stack(x) for k, x in out.items()}
    return LabPatches(model.cfg.arch, st["u"], st["v"], st["correction"], st["A"], st["a"], st["zero"])


@torch.no_grad()
def patched_context_free(model: RegressionModel, tokens: Float[Tensor, "batch pos d_token"],
                         patches: LabPatches, extra_hooks: list | None = None) -> Float[Tensor, "batch pos"]:
    """Each token run ALONE (no context) with its patches applied in every layer: predictions per position.

    ``extra_hooks`` run after the patches (on sequences of length 1, ``batch·pos`` of them).
    """
    tokens = model.check_tokens(tokens)
    B, T, d = tokens.shape
    if patches.u.shape[1:3] != (B, T):
        raise ValueError(f"patches are for {tuple(patches.u.shape[1:3])} prompts × positions, tokens are {(B, T)}")
    with edits_applied(model, patches.edits(), extra_hooks=extra_hooks or ()):
        return model(tokens.reshape(B * T, 1, d)).reshape(B, T)
