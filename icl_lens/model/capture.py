"""Exact token patches of every layer and position from ONE contextual forward pass.

docs/design.md §2 (Dherin et al. 2025, arXiv 2507.16003; Goldwaser et al., arXiv 2511.17864
for gated, sandwich-norm blocks). Per layer ``l``, hooks read during the contextual pass:

    r       = resid_pre                      attn_C = attention branch output (after any post-attention norm)
    z⁰_t    = cached scores of t renormalised over its kept keys, times cached values
    attn_0  = post_norm(W_O z⁰ + b_O)        A = the MLP input, e.g. ln2(r + attn_C)
    a       = the same with attn_0           δ = A − a
    u_in = W_in δ  (W_up),  u_gate = W_gate δ,  v = a/‖a‖²,  correction = attn_C − attn_0

How ``A`` is formed (pre-MLP norm, raw residual, parallel block) is the block family's
(:mod:`icl_lens.model.block_family`).

Everything is computed in-flight inside the hooks (memory O(layers·pos·(d_model+d_mlp)),
no ``pos × pos`` score matrix kept, no dense ``d_mlp × d_model`` per token), and the
forward stops after the last block's MLP input, so the unembedding never runs.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch
from jaxtyping import Int
from torch import Tensor

from icl_lens.core.kept_attention import (
    bos_and_self_output,
    default_kept_mask,
    kept_set_output,
    removal_kept_mask,
    removes_nothing,
)
from icl_lens.core.patch_set import TokenPatches
from icl_lens.core.token_patch import token_patch
from icl_lens.model.block_family import BlockFamily, block_family, first_dense_weights
from icl_lens.model.prompts import bos_id, encode_prompt, str_tokens


class NonFiniteActivationError(FloatingPointError):
    """An activation is NaN or infinite; the message names layer and position."""


class ZeroNormWarning(UserWarning):
    """A kept-only MLP input has (near) zero norm; its patch is set to zero."""


class StopForward(Exception):
    """Raised from a hook once everything a forward was run for has been read (later layers never run)."""


def patch_dtype(model) -> torch.dtype:
    """Patch arithmetic runs in float32 for half-precision models, else in the model's dtype."""
    dtype = model.cfg.dtype
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _check_finite(x: Tensor, what: str, layer: int, offset: int = 0) -> None:
    bad = ~torch.isfinite(x)
    if bad.any():
        pos = int(torch.nonzero(bad.reshape(x.shape[0], -1).any(-1))[0]) + offset
        raise NonFiniteActivationError(f"non-finite {what} at layer {layer}, position {pos}")


def _removed_mask(remove: Iterable[int] | slice | range, n: int, device) -> Tensor:
    idx = range(n)[remove] if isinstance(remove, slice) else list(remove)
    removed = torch.zeros(n, dtype=torch.bool, device=device)
    for i in idx:
        if not -n <= int(i) < n:
            raise IndexError(f"remove position {i} is outside the prompt (0..{n - 1})")
        removed[int(i)] = True
    return removed


def _kept_sets(n: int, remove, keep_bos: bool, device) -> tuple[Tensor, bool]:
    """Kept mask [query, key] and whether it is the default ``{BOS, t}`` set."""
    if remove is None:
        return default_kept_mask(n, keep_bos=keep_bos, device=device), True
    return removal_kept_mask(n, _removed_mask(remove, n, device)), False


class LayerCapture:
    """Hook callbacks that compute one layer's patch factors while the forward runs.

    Queries are the positions ``offset .. offset+q-1`` of the forward's input (``offset``
    > 0 when earlier positions sit in a key/value cache); ``kept`` has one row per query.
    """

    def __init__(self, model, family: BlockFamily, kept: Tensor, default_kept: bool, keep_bos: bool,
                 out: dict[str, Tensor], *, offset: int = 0, bos_values: dict[int, Tensor] | None = None,
                 stop_after_last: bool = True):
        self.model, self.family, self.kept = model, family, kept
        self.default_kept, self.keep_bos, self.out = default_kept, keep_bos, out
        self.offset, self.stop_after_last = offset, stop_after_last
        self.bos_values = {} if bos_values is None else bos_values
        self.dtype = patch_dtype(model)
        self.unchanged = removes_nothing(kept, offset=offset)  # zero patch on these rows
        self.state: dict[str, Tensor] = {}
        self.reentered = False

    def hooks(self, layer: int) -> list[tuple[str, object]]:
        f = self.family
        return [
            (f.resid_pre(layer), self._store("r")),
            (f.values(layer), lambda x, hook, layer=layer: self._values(x, layer)),
            (f.scores(layer), lambda x, hook, layer=layer: self._attend(x, layer)),
            (f.attn_out(layer), self._store("attn_C")),
            (f.mlp_input(layer), lambda x, hook, layer=layer: self._patch(x, layer)),
        ]

    def _store(self, key: str):
        def hook(x, hook):
            self.state[key] = x[0].detach()
        return hook

    def _values(self, x: Tensor, layer: int) -> None:
        values = x[0].detach()
        if self.offset == 0:
            self.bos_values[layer] = values[0]
        self.state["values"] = values

    def _attend(self, scores: Tensor, layer: int) -> None:
        s, values = scores[0].detach(), self.state.pop("values")
        if self.default_kept:
            z0 = bos_and_self_output(s, values, keep_bos=self.keep_bos, offset=self.offset,
                                     bos_value=self.bos_values.get(layer))
        else:
            z0 = kept_set_output(s, values, self.kept)
        self.state["z0"] = z0

    @torch.no_grad()
    def _patch(self, mlp_in: Tensor, layer: int) -> None:
        if self.reentered:  # layer_factors' own call of ln2 fires this hook point again
            return
        r, attn_C, z0 = self.state.pop("r"), self.state.pop("attn_C"), self.state.pop("z0")
        f = layer_factors(self, layer, r, attn_C, z0, mlp_in[0].detach(), "MLP input (contextual)", self.offset)
        keep = (~self.unchanged)[:, None].to(self.dtype)
        self.out["u_in"][layer] = f["u_in"] * keep
        if f["u_gate"] is not None:
            self.out["u_gate"][layer] = f["u_gate"] * keep
        self.out["v"][layer] = f["v"]
        self.out["correction"][layer] = f["correction"] * keep
        self.out["zero_input"][layer] = f["zero"] & ~self.unchanged
        if self.stop_after_last and layer == self.model.cfg.n_layers - 1:
            raise StopForward


def layer_factors(capture, layer: int, r: Tensor, attn_C: Tensor, z0: Tensor, A: Tensor,
                  what: str, offset: int = 0) -> dict[str, Tensor | None]:
    """Patch factors of one layer for rows with residual ``r``, attention output ``attn_C``,
    kept-key attention ``z0`` and MLP input ``A``.

    ``attn_0`` and ``a`` are formed by the block family and go through the bridge's own
    components, so they are rounded exactly as the kept-only forward will round them.
    ``capture.reentered`` is set meanwhile: a pre-MLP norm call fires the MLP-input hook again.
    """
    model, family, dtype = capture.model, capture.family, capture.dtype
    block = model.blocks[layer]
    capture.reentered = True
    try:
        attn_0 = family.kept_attention_output(block, z0.to(r.dtype))
        a = family.context_free_mlp_input(block, r, attn_0, A)
    finally:
        capture.reentered = False
    _check_finite(A, what, layer, offset)
    _check_finite(a, "MLP input (context removed)", layer, offset)
    A, a = A.to(dtype), a.to(dtype)
    weights = first_dense_weights(model, layer)
    u_in, v, zero = token_patch(weights["in"].to(dtype), A, a)
    u_gate = (A - a) @ weights["gate"].to(dtype).T if "gate" in weights else None
    correction = attn_C.to(dtype) - attn_0.to(dtype)
    return {"u_in": u_in, "u_gate": u_gate, "v": v, "correction": correction, "zero": zero}


def empty_factors(model, n: int, device) -> dict[str, Tensor | None]:
    """Zeroed factor buffers for ``n`` positions of every layer."""
    cfg, dtype, gated = model.cfg, patch_dtype(model), block_family(model).gated
    return {
        "u_in": torch.zeros(cfg.n_layers, n, cfg.d_mlp, dtype=dtype, device=device),
        "u_gate": torch.zeros(cfg.n_layers, n, cfg.d_mlp, dtype=dtype, device=device) if gated else None,
        "v": torch.zeros(cfg.n_layers, n, cfg.d_model, dtype=dtype, device=device),
        "correction": torch.zeros(cfg.n_layers, n, cfg.d_model, dtype=dtype, device=device),
        "zero_input": torch.zeros(cfg.n_layers, n, dtype=torch.bool, device=device),
    }


def warn_zero_inputs(zero: Tensor, offset: int = 0) -> None:
    if zero.any():
        where = ", ".join(f"layer {int(l)} position {int(p) + offset}" for l, p in torch.nonzero(zero)[:10])
        warnings.warn(f"kept-only MLP input has zero norm at {where}; those patches are set to zero "
                      f"(pseudo-inverse convention) and are not exact", ZeroNormWarning, stacklevel=3)


def is_bos_kept(model, ids: Tensor, keep_bos: bool) -> bool:
    return bool(keep_bos and bos_id(model) is not None and int(ids[0]) == bos_id(model))


def token_patches(
    model,
    prompt: str | Sequence[int] | Int[Tensor, " pos"],
    *,
    remove: Iterable[int] | slice | None = None,
    keep_bos: bool = True,
) -> TokenPatches:
    """Token patches (docs/design.md §2) of every layer and position of ``prompt``, from one forward.

    ``remove``: context positions that count as removed for every query (default: all
    earlier positions except a leading BOS). ``keep_bos``: keep the first token when it
    is the tokenizer's BOS (attention sink), so the context-free input stays in
    distribution.
    """
    family = block_family(model)
    ids = encode_prompt(model, prompt)
    n, device = ids.numel(), ids.device
    kept_bos = is_bos_kept(model, ids, keep_bos)
    kept, default_kept = _kept_sets(n, remove, kept_bos, device)
    out = empty_factors(model, n, device)
    capture = LayerCapture(model, family, kept, default_kept, kept_bos, out)
    fwd_hooks = [h for layer in range(model.cfg.n_layers) for h in capture.hooks(layer)]
    with torch.no_grad(), model.hooks(fwd_hooks=fwd_hooks):
        try:
            model(ids[None], return_type=None)
        except StopForward:
            pass
    warn_zero_inputs(out["zero_input"])
    return TokenPatches(
        model_name=getattr(model, "icl_lens_name", model.cfg.model_name),
        tokens=str_tokens(model, ids),
        token_ids=ids.cpu(),
        u_in=out["u_in"], u_gate=out["u_gate"], v=out["v"], correction=out["correction"],
        kept=kept, kept_bos=kept_bos, zero_input=out["zero_input"],
    )


@torch.no_grad()
def token_patches_naive(model, prompt: str | Sequence[int] | Int[Tensor, " pos"], *, keep_bos: bool = True) -> TokenPatches:
    """Reference method: the same patches as :func:`token_patches`, one kept-only forward per query and layer.

    For query ``t`` and layer ``l``: run the kept tokens alone (original position ids) with
    every earlier layer's patch of ``t`` applied, stopped after layer ``l``, and read ``a``
    and ``attn_0`` there; ``A`` and ``attn_C`` come from the contextual pass. Costs about
    ``n · L`` forwards; kept as an independent check of the one-pass method (tests and
    benchmarks), not for use.
    """
    from icl_lens.model.kept_only import kept_only_masks, patches_applied

    fast = token_patches(model, prompt, keep_bos=keep_bos)  # kept sets and shapes; every factor is recomputed
    family = block_family(model)
    ids = fast.token_ids.to(model.cfg.device)
    zeros = {k: torch.zeros_like(getattr(fast, k)) for k in ("u_in", "v", "correction")}
    if fast.u_gate is not None:
        zeros["u_gate"] = torch.zeros_like(fast.u_gate)
    acc = replace(fast, **zeros)
    names = {family.mlp_input(l) for l in range(model.cfg.n_layers)}
    names |= {family.attn_out(l) for l in range(model.cfg.n_layers)}
    _, cache = model.run_with_cache(ids[None], names_filter=lambda h: h in names)
    dtype = acc.v.dtype
    for t in range(ids.numel()):
        if bool(removes_nothing(fast.kept[t: t + 1], offset=t)[0]):
            continue  # nothing removed: the patch is zero by definition
        pos = torch.tensor([fast.kept_positions(t)], device=ids.device)
        for layer in range(model.cfg.n_layers):
            got: dict[str, Tensor] = {}
            reads = [family.mlp_input(layer), family.attn_out(layer)]
            hooks = [(name, lambda x, hook, name=name: got.__setitem__(name, x[0, -1].detach())) for name in reads]
            with patches_applied(model, acc, pos), model.hooks(fwd_hooks=hooks):
                model(ids[pos], position_ids=pos, attention_mask=kept_only_masks(model, pos), stop_at_layer=layer + 1)
            A = cache[family.mlp_input(layer)][0, t].to(dtype)
            a = got[family.mlp_input(layer)].to(dtype)
            weights = first_dense_weights(model, layer)
            acc.u_in[layer, t], acc.v[layer, t], _ = token_patch(weights["in"].to(dtype), A, a)
            if acc.u_gate is not None:
                acc.u_gate[layer, t] = (A - a) @ weights["gate"].to(dtype).T
            attn_c = cache[family.attn_out(layer)][0, t]
            acc.correction[layer, t] = (attn_c - got[family.attn_out(layer)]).to(dtype)
    return acc
