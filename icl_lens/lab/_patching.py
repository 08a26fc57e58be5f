"""Token patches of the lab models and the patched context-free forward (docs/design.md §2).

For every layer ``l`` and position ``t`` of a batch of prompts, from ONE contextual pass
(Dherin et al. 2025, arXiv 2507.16003, Theorem 2.2, which holds for any contextual layer):

    r = resid_pre,  attn_C = M(C, LN₁ r)                   (what the contextual layer adds)
    attn_0 = M(K_t, LN₁ r)                                  (position t seeing only its kept set K_t)
    A = LN₂(r + attn_C),  a = LN₂(r + attn_0),  δ = A − a
    ΔW_in = u vᵀ,  u = W_in δ,  v = a/‖a‖²,  correction = attn_C − attn_0   (MLP-output bias)

Without skip connections (``cfg.skip=False``) ``A = LN₂(attn_C)``, ``a = LN₂(attn_0)`` and
there is no correction: the MLP input carries the whole context effect. The kept set
is ``K_t = {t}`` (context removed), or, with ``removed_prefix = k``, the positions
``k..t`` for ``t ≥ k`` (the first ``k`` tokens removed, the rest kept: the "absorb"
order of docs/design.md §3). For softmax attention and ``K_t = {t}``, ``attn_0`` is the
cached scores renormalised (:mod:`icl_lens.core._kept_attention`); otherwise it is the
layer run on the kept positions' inputs, which equal the contextual ones because every
earlier layer is patched. Running the kept tokens with every layer's patch applied
reproduces the contextual forward exactly (:func:`patched_forward`).
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core._kept_attention import default_kept_mask, removal_kept_mask
from icl_lens.patches._patch_set import TokenPatches
from icl_lens.core._token_patch import token_patch
from icl_lens.lab._model import LAB_FAMILY, RegressionModel
from icl_lens.model._reading import activations_captured
from icl_lens.model._weight_edits import MLPEdit, edits_applied

_MIXER_CACHE = ("attn_scores", "v")


def _batched_patches(model: RegressionModel, u: Tensor, v: Tensor, correction: Tensor, zero: Tensor,
                removed_prefix: int | None) -> TokenPatches:
    """A batch of lab patches as a batched :class:`~icl_lens.patches._patch_set.TokenPatches`.

    The tokens are ``(x,y)`` pairs and the query; the kept set of position ``t`` is ``{t}``,
    or ``k..t`` when the first ``k`` tokens are removed (``{t}`` for ``t < k``).
    """
    n = u.shape[2]
    kept = (default_kept_mask(n, keep_bos=False) if removed_prefix is None
            else removal_kept_mask(n, torch.arange(n) < removed_prefix))
    return TokenPatches(model_name=f"lab-{model.cfg.arch}", tokens=tuple(["(x,y)"] * (n - 1) + ["query"]),
                        token_ids=torch.arange(n), stored_u_in=u, v=v, correction=correction, kept=kept,
                        kept_bos=False, zero_input=zero)


def patch_edits(patches: TokenPatches, per_prompt: bool = False) -> dict[int, MLPEdit]:
    """Per-position edits of a batch of lab patches: for single tokens run alone (``batch·pos`` sequences
    of length 1), or, with ``per_prompt=True``, for the prompts run as ``batch`` sequences."""
    B, T = patches.u_in.shape[1:3]
    shape = (B, T) if per_prompt else (B * T, 1)
    return {layer: MLPEdit(v=patches.v[k].reshape(*shape, 1, -1), u_in=patches.u_in[k].reshape(*shape, 1, -1),
                           bias=patches.correction[k].reshape(*shape, -1)) for k, layer in enumerate(patches.layers)}


def _hook_names(model: RegressionModel) -> set[str]:
    names = set()
    for l, block in enumerate(model.blocks):
        names |= {LAB_FAMILY.resid_pre(l), LAB_FAMILY.mix_in(l), LAB_FAMILY.attn_out(l), LAB_FAMILY.mlp_input(l)}
        names |= {LAB_FAMILY.mixer(l, h) for h in _MIXER_CACHE if hasattr(block.mix, f"hook_{h}")}
    return names


def _kept_output(block, h: Tensor, cached: dict[str, Tensor], removed_prefix: int | None) -> Tensor:
    """``attn_0`` at every position: the contextual layer over each position's kept set."""
    if removed_prefix is None:
        return block.mix.context_free(h, cached)
    k = removed_prefix
    return torch.cat([block.mix.alone(h[:, :k]), block.mix(h[:, k:])], dim=1) if k else block.mix(h)


@torch.no_grad()
def lab_token_patches(model: RegressionModel, tokens: Float[Tensor, "batch pos d_token"], *,
                      removed_prefix: int | None = None) -> TokenPatches:
    """Token patches of every layer and position from one contextual pass.

    ``removed_prefix=None``: each position's context is removed (kept set ``{t}``).
    ``removed_prefix=k``: the first ``k`` tokens are removed for every position (later
    positions keep ``k..t``; ``k = 0`` removes nothing and gives zero patches).
    """
    return patches_by_removed_prefix(model, tokens, (removed_prefix,))[0]


@torch.no_grad()
def patches_by_removed_prefix(model: RegressionModel, tokens: Float[Tensor, "batch pos d_token"],
                              removed_prefixes) -> list[TokenPatches]:
    """:func:`lab_token_patches` for several ``removed_prefix`` values from ONE contextual pass."""
    tokens = model.check_tokens(tokens)
    for k in removed_prefixes:
        if k is not None and not 0 <= k <= tokens.shape[1]:
            raise ValueError(f"removed_prefix must lie in 0..{tokens.shape[1]}, got {k}")
    names = _hook_names(model)
    with activations_captured(model, sorted(names)) as cache:
        model(tokens)
    outs = [{k: [] for k in ("u", "v", "correction", "zero")} for _ in removed_prefixes]
    for l, block in enumerate(model.blocks):
        r, h = cache[LAB_FAMILY.resid_pre(l)], cache[LAB_FAMILY.mix_in(l)]
        attn_C, A = cache[LAB_FAMILY.attn_out(l)], cache[LAB_FAMILY.mlp_input(l)]
        cached = {f"hook_{k}": cache[LAB_FAMILY.mixer(l, k)] for k in _MIXER_CACHE if LAB_FAMILY.mixer(l, k) in cache}
        if not torch.isfinite(A).all():
            raise FloatingPointError(f"non-finite MLP input (A) at layer {l}")
        for removed, out in zip(removed_prefixes, outs):
            attn_0 = _kept_output(block, h, cached, removed)
            a = block.ln2(block.residual(r, attn_0))
            if not torch.isfinite(a).all():
                raise FloatingPointError(f"non-finite MLP input (a) at layer {l}")
            u, v, zero = token_patch(block.mlp.W_in.weight, A, a)
            correction = attn_C - attn_0 if block.skip else torch.zeros_like(attn_C)
            if removed == 0:  # nothing removed: the patch is zero by definition
                u, correction = torch.zeros_like(u), torch.zeros_like(correction)
            for k, x in (("u", u), ("v", v), ("correction", correction), ("zero", zero)):
                out[k].append(x)
    return [_batched_patches(model, *(torch.stack(out[k]) for k in ("u", "v", "correction", "zero")), removed)
            for removed, out in zip(removed_prefixes, outs)]


@torch.no_grad()
def patched_forward(model: RegressionModel, tokens: Float[Tensor, "batch pos d_token"], patches: TokenPatches, *,
                    removed_prefix: int | None = None) -> Float[Tensor, "batch pos"]:
    """The kept tokens run with their patches applied in every layer: predictions per position.

    ``removed_prefix=None``: each token runs ALONE (``batch × pos`` sequences of length 1);
    ``removed_prefix=k``: tokens ``k..`` run as one sequence per prompt and the first ``k``
    positions are dropped from the output. Read activations under the patches by nesting
    :func:`~icl_lens.model.activations_captured` around the call.
    """
    tokens = model.check_tokens(tokens)
    B, T, d = tokens.shape
    if not patches.batched or patches.u_in.shape[1:3] != (B, T):
        raise ValueError(f"patches are for {tuple(patches.u_in.shape[1:-1])} prompts × positions, tokens are {(B, T)}")
    if removed_prefix is None:
        with edits_applied(model, patch_edits(patches)):
            return model(tokens.reshape(B * T, 1, d)).reshape(B, T)
    k = removed_prefix
    edits = {l: MLPEdit(v=e.v[:, k:], u_in=e.u_in[:, k:], bias=e.bias[:, k:]) for l, e in patch_edits(patches, per_prompt=True).items()}
    with edits_applied(model, edits):
        return model(tokens[:, k:])


def patched_context_free(model: RegressionModel, tokens: Float[Tensor, "batch pos d_token"],
                         patches: TokenPatches) -> Float[Tensor, "batch pos"]:
    """Each token run ALONE (no context) with its patches applied in every layer: predictions per position."""
    return patched_forward(model, tokens, patches)
