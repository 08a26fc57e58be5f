"""The per-layer capture: exact token patch factors of every layer and position, in ONE contextual forward pass.

docs/design.md §2 (Dherin et al. 2025, arXiv 2507.16003; Goldwaser et al., arXiv 2511.17864
for gated, sandwich-norm blocks). Per layer ``l``, hooks read during the contextual pass:

    r       = resid_pre                      attn_C = attention branch output (after any post-attention norm)
    z⁰_t    = cached scores of t renormalised over its kept keys, times cached values
    attn_0  = post_norm(W_O z⁰ + b_O)        A = the MLP input, e.g. ln2(r + attn_C)
    a       = the same with attn_0           δ = A − a
    v = a/‖a‖²,  correction = attn_C − attn_0     (kept; u_in = W_in δ, u_gate = W_gate δ on demand)

How ``A`` is formed (pre-MLP norm, raw residual, parallel block) is the block family's
(:mod:`icl_lens.model._block_family`).

Everything is computed in-flight inside the hooks (memory O(layers·pos·d_model): ``δ``,
``v`` and the correction, never the ``d_mlp``-sized ``u``, which
:class:`~icl_lens.patches._patch_set.TokenPatches` forms from ``δ`` and the model's
:func:`dense_weights` when asked; no ``pos × pos`` score matrix kept, no dense
``d_mlp × d_model`` per token), and the
forward stops after the last block's MLP input (:mod:`icl_lens.model._reading`), so the
unembedding never runs. The capture works on right-padded batches of prompts (one prompt
is the batch of one); :mod:`icl_lens.patches._batches` forms them and adds the norms-only
mode; :func:`run_capture_in_chunks` runs one long prompt in forwards of a few queries over the cached keys and
values of the positions before them (the same factors; scores of ``chunk × n`` instead of ``n × n``);
:func:`icl_lens.patches._token_patches.token_patches` is the public entry.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from transformers import DynamicCache

from icl_lens.patches._dense_weights import DenseWeights
from icl_lens.core._kept_attention import bos_and_self_output, kept_set_output, removes_nothing
from icl_lens.core._token_patch import input_pseudo_inverse
from icl_lens.model._block_family import (
    BlockFamily,
    dense_weight,
    first_dense_modules,
    first_dense_weights,
    original,
)
from icl_lens.model._per_model import model_cache
from icl_lens.model._prompts import bos_id
from icl_lens.model._reading import NonFiniteActivationError, activations_captured

from icl_lens.model._types import patch_dtype

if TYPE_CHECKING:
    from icl_lens.model._types import Model


class ZeroNormWarning(UserWarning):
    """A kept-only MLP input has (near) zero norm; its patch is set to zero."""


def _all_finite(x: Tensor) -> bool:
    """Fast test: a NaN/inf makes the sum non-finite (a finite sum that overflows only sends us to the exact test)."""
    return bool(torch.isfinite(x.sum()))


def _check_finite(x: Tensor, what: str, layer: int, offset: int | Tensor = 0) -> None:
    """Raise if ``x`` has a NaN/inf; rows are positions ``offset + i`` (or ``offset[i]`` for a tensor)."""
    if _all_finite(x):
        return
    bad = ~torch.isfinite(x)
    if bad.any():
        row = int(torch.nonzero(bad.reshape(x.shape[0], -1).any(-1))[0])
        pos = int(offset[row]) if isinstance(offset, Tensor) else row + offset
        raise NonFiniteActivationError(f"non-finite {what} at layer {layer}, position {pos}")


def removed_mask(remove: Iterable[int] | slice | range, n: int, device) -> Tensor:
    idx = range(n)[remove] if isinstance(remove, slice) else list(remove)
    removed = torch.zeros(n, dtype=torch.bool, device=device)
    for i in idx:
        if not -n <= int(i) < n:
            raise IndexError(f"remove position {i} is outside the prompt (0..{n - 1})")
        removed[int(i)] = True
    return removed


class LayerCapture:
    """Hook callbacks that compute one layer's patch factors while the forward runs.

    Works on a batch of ``B`` right-padded rows; queries are the positions
    ``offset .. offset+q-1`` of the forward's input (``offset`` > 0 when earlier positions
    sit in a key/value cache). ``kept`` is ``[B, q, key]`` (or ``[q, key]`` for one row)
    and is read only when ``default_kept`` is False; ``keep_bos`` is a bool or one per
    row; ``lengths`` the real length of each row (padding after it is never computed).
    ``out`` holds ``[layers, B, q, …]`` buffers, on any device (each layer's result is
    moved there): ``delta``, ``v``, ``correction``, ``zero_input``. ``norm_weights`` (a
    :class:`~icl_lens.patches._dense_weights.DenseWeights`) switches to norms only: ``out`` then
    holds ``norm`` and ``correction_norm`` (see :mod:`icl_lens.patches._batches`).
    """

    def __init__(self, model, family: BlockFamily, kept: Tensor | None, default_kept: bool,
                 keep_bos: bool | Tensor, out: dict[str, Tensor | None], *, offset: int = 0,
                 bos_values: dict[int, Tensor] | None = None,
                 q: int | None = None, lengths: Tensor | None = None, layers: Sequence[int] | None = None,
                 norm_weights=None):
        self.model, self.family, self.out = model, family, out
        self.default_kept, self.offset = default_kept, offset
        self.bos_values = {} if bos_values is None else bos_values
        self.dtype = patch_dtype(model)
        self.norm_weights = norm_weights
        if kept is not None and kept.ndim == 2:
            kept = kept[None]
        self.kept = kept
        batch = int(kept.shape[0]) if kept is not None else int(torch.as_tensor(keep_bos).numel())
        q = int(kept.shape[1]) if kept is not None else int(q)
        self.keep_bos = keep_bos if isinstance(keep_bos, bool) else torch.as_tensor(keep_bos, dtype=torch.bool)
        positions = offset + torch.arange(q)
        real = (torch.ones(batch, q, dtype=torch.bool) if lengths is None
                else positions[None] < torch.as_tensor(lengths).cpu()[:, None])
        if default_kept:  # {BOS, t} (or {t}) is the whole prefix only for t <= 1 (t = 0)
            bos = torch.full((batch,), keep_bos) if isinstance(keep_bos, bool) else self.keep_bos.cpu()
            unchanged = positions[None] <= bos[:, None].long()
        else:
            unchanged = removes_nothing(kept.cpu(), offset=offset)
        self.real, self.unchanged, self.compute = real, unchanged & real, real & ~unchanged
        self.positions = positions[None].expand(batch, q)
        # One prompt whose computed rows are a tail of it: slice (views) instead of gathering rows.
        first = int(torch.argmax(self.compute[0].long()))
        self.tail = (slice(first, q) if batch == 1 and bool(self.compute.any()) and bool(self.compute[0, first:].all())
                     else None)
        self.layers = tuple(range(model.cfg.n_layers)) if layers is None else tuple(layers)
        self.slot = {layer: i for i, layer in enumerate(self.layers)}
        self.last_layer = max(self.layers)
        self._on: dict[str, dict[str, Tensor]] = {}
        self.state: dict[str, Tensor] = {}
        self.reentered = False
        self.checked_contextual = True  # _patch checks the real rows of A before layer_factors

    def hooks(self, layer: int) -> list[tuple[str, object]]:
        f = self.family
        return [
            (f.resid_pre(layer), self._store("r")),
            (f.values(layer), lambda x, hook, layer=layer: self._values(x, layer)),
            (f.scores(layer), lambda x, hook, layer=layer: self._attend(x, layer)),
            (f.attn_out(layer), self._store("attn_C")),
            (f.mlp_input(layer), lambda x, hook, layer=layer: self._patch(x, layer)),
        ]

    def all_hooks(self) -> list[tuple[str, object]]:
        """Hooks of every captured layer."""
        return [h for layer in self.layers for h in self.hooks(layer)]

    @property
    def last_site(self) -> str:
        """The hook point after which nothing more is read: the last captured layer's MLP input."""
        return self.family.mlp_input(self.last_layer)

    def _masks(self, device) -> dict[str, Tensor]:
        key = str(device)
        if key not in self._on:
            self._on[key] = {name: getattr(self, name).to(device)
                             for name in ("real", "unchanged", "compute", "positions")}
            if not isinstance(self.keep_bos, bool):
                self._on[key]["keep_bos"] = self.keep_bos.to(device)
        return self._on[key]

    def _store(self, key: str):
        def hook(x, hook):
            self.state[key] = x.detach()
        return hook

    def _values(self, x: Tensor, layer: int) -> None:
        values = x.detach()
        if self.offset == 0:
            self.bos_values[layer] = values[:, 0]
        self.state["values"] = values

    def _attend(self, scores: Tensor, layer: int) -> None:
        s, values = scores.detach(), self.state.pop("values")
        if self.default_kept:
            keep_bos = self.keep_bos if isinstance(self.keep_bos, bool) else self._masks(s.device)["keep_bos"]
            z0 = bos_and_self_output(s, values, keep_bos=keep_bos, offset=self.offset,
                                     bos_value=self.bos_values.get(layer))
        else:
            z0 = kept_set_output(s, values, self.kept.to(s.device))
        self.state["z0"] = z0

    def _rows(self, x: Tensor, mask: Tensor) -> Tensor:
        return x[0, self.tail] if self.tail is not None else x[mask]

    @torch.no_grad()
    def _patch(self, mlp_in: Tensor, layer: int) -> None:
        if self.reentered:  # layer_factors' own call of ln2 fires this hook point again
            return
        r, attn_C, z0 = self.state.pop("r"), self.state.pop("attn_C"), self.state.pop("z0")
        A = mlp_in.detach()
        m = self._masks(A.device)
        bad = None if _all_finite(A) else ~torch.isfinite(A).all(-1) & m["real"]
        if bad is not None and bad.any():
            b, t = (int(i) for i in torch.nonzero(bad)[0])
            where = f" of prompt {b}" if bad.shape[0] > 1 else ""
            raise NonFiniteActivationError(
                f"non-finite MLP input (contextual) at layer {layer}, position {t + self.offset}{where}")
        k, compute = self.slot[layer], m["compute"]
        if self.tail is not None or bool(compute.any()):
            rows = lambda x: self._rows(x, compute)  # noqa: E731
            f = layer_factors(self, layer, rows(r), rows(attn_C), rows(z0), rows(A), "MLP input (contextual)",
                              rows(m["positions"]), u=False)
            if self.norm_weights is not None:
                norm = self.norm_weights.norms(layer, f["delta"]) * torch.linalg.vector_norm(f["v"], dim=-1)
                self._put("norm", k, norm)
                self._put("correction_norm", k, torch.linalg.vector_norm(f["correction"], dim=-1))
            else:
                for key in ("delta", "v", "correction"):
                    self._put(key, k, f[key])
            self._put("zero_input", k, f["zero"])
        if self.norm_weights is None:
            self._zero_rest(k)
            if bool(m["unchanged"].any()):  # nothing removed: δ = 0, v = A/‖A‖²
                buf = self.out["v"][k]
                buf[self.unchanged.to(buf.device)] = input_pseudo_inverse(A[m["unchanged"]].to(self.dtype))[0].to(buf.device)

    def _zero_rest(self, k: int) -> None:
        """Zero the rows not computed (nothing removed, or padding): buffers may come uninitialised."""
        for key in ("delta", "v", "correction"):
            buf = self.out.get(key)
            if buf is None:
                continue
            if self.tail is not None:
                buf[k][0, : self.tail.start] = 0
            else:
                buf[k][~self.compute.to(buf.device)] = 0

    def _put(self, key: str, k: int, value: Tensor) -> None:
        buf = self.out[key][k]
        if self.tail is not None:
            buf[0, self.tail] = value.to(buf.device)
        else:
            buf[self.compute.to(buf.device)] = value.to(buf.device)


def materialised_dense_weights(model, layer: int) -> dict[str, Tensor]:
    """The layer's first dense weights, materialised where accelerate offloads them (CPU/disk device maps)."""
    modules = first_dense_modules(model, layer)
    if not any(hasattr(original(m), "_hf_hook") for m in modules.values()):
        return first_dense_weights(model, layer)
    from accelerate.utils import align_module_device

    weights = {}
    for name, module in modules.items():
        with align_module_device(original(module)):
            weights[name] = dense_weight(module).detach().clone()
    return weights


def dense_weights(model: Model) -> DenseWeights:
    """The model's first dense weights of every layer (references, checked), cached per model.

    What :class:`~icl_lens.patches._patch_set.TokenPatches` forms ``u = W δ`` and the norms
    (``R`` of the QR) from; a new one is made when the weights changed in place.
    """
    cache = model_cache(model, "dense_weights")
    dtype = patch_dtype(model)
    hit = cache.get(dtype)
    offloaded = any(hasattr(original(m), "_hf_hook") for m in first_dense_modules(model, 0).values())
    if hit is not None and not offloaded and not hit.same_tensors(
            [first_dense_weights(model, layer) for layer in range(model.cfg.n_layers)]):
        hit = None  # a weight was swapped for another tensor since (the cached references are not the model's)
    if hit is None or not hit.valid():
        hit = DenseWeights([materialised_dense_weights(model, layer) for layer in range(model.cfg.n_layers)], dtype)
        cache[dtype] = hit
    return hit


def layer_factors(capture, layer: int, r: Tensor, attn_C: Tensor, z0: Tensor, A: Tensor,
                  what: str, offset: int | Tensor = 0, weights: dict[str, Tensor] | None = None,
                  u: bool = True) -> dict[str, Tensor | None]:
    """Patch factors of one layer for rows with residual ``r``, attention output ``attn_C``,
    kept-key attention ``z0`` and MLP input ``A``: ``delta``, ``v``, ``correction``, ``zero``
    and, with ``u=True``, ``u_in``/``u_gate``.

    ``attn_0`` and ``a`` are formed by the block family and go through the bridge's own
    components, so they are rounded exactly as the kept-only forward will round them.
    ``capture.reentered`` is set meanwhile: a pre-MLP norm call fires the MLP-input hook again.
    ``offset``: position of row 0, or each row's position (messages only). ``weights``:
    the dense weights to multiply ``δ`` by (default: the layer's own first dense weights).
    """
    model, family, dtype = capture.model, capture.family, capture.dtype
    block = model.blocks[layer]
    capture.reentered = True
    try:
        attn_0 = family.kept_attention_output(block, z0.to(r.dtype))
        a = family.context_free_mlp_input(block, r, attn_0, A)
    finally:
        capture.reentered = False
    if not getattr(capture, "checked_contextual", False):  # a LayerCapture checked its A already
        _check_finite(A, what, layer, offset)
    _check_finite(a, "MLP input (context removed)", layer, offset)
    A, a = A.to(dtype), a.to(dtype)
    delta = A - a
    v, zero = input_pseudo_inverse(a)
    correction = attn_C.to(dtype) - attn_0.to(dtype)
    out = {"delta": delta, "v": v, "correction": correction, "zero": zero, "u_in": None, "u_gate": None}
    if u:
        weights = first_dense_weights(model, layer) if weights is None else weights
        out["u_in"] = delta @ weights["in"].to(dtype).T
        out["u_gate"] = delta @ weights["gate"].to(dtype).T if "gate" in weights else None
    return out


def empty_factors(model, n: int, device, *, batch: int | None = None,
                  layers: Sequence[int] | None = None, zeroed: bool = True) -> dict[str, Tensor | None]:
    """Buffers of ``δ``, ``v``, correction and zero-input flags for ``n`` positions of every layer
    (``[layers, batch, n, …]`` with ``batch``); all ``d_model`` wide.

    ``zeroed=False`` leaves the float buffers uninitialised for a :class:`LayerCapture` that
    writes every row of every layer (it zeroes the rows it does not compute).
    """
    cfg, dtype = model.cfg, patch_dtype(model)
    lead = (cfg.n_layers if layers is None else len(layers),) + (() if batch is None else (batch,)) + (n,)
    new = torch.zeros if zeroed else torch.empty
    return {
        "delta": new(*lead, cfg.d_model, dtype=dtype, device=device),
        "v": new(*lead, cfg.d_model, dtype=dtype, device=device),
        "correction": new(*lead, cfg.d_model, dtype=dtype, device=device),
        "zero_input": torch.zeros(*lead, dtype=torch.bool, device=device),
    }


def warn_zero_inputs(zero: Tensor, offset: int = 0, prompt: int | None = None) -> None:
    if zero.any():
        where = ", ".join(f"layer {int(l)} position {int(p) + offset}" for l, p in torch.nonzero(zero)[:10])
        of = "" if prompt is None else f" of prompt {prompt}"
        warnings.warn(f"kept-only MLP input has zero norm at {where}{of}; those patches are set to zero "
                      f"(pseudo-inverse convention) and are not exact", ZeroNormWarning, stacklevel=3)


def is_bos_kept(model, ids: Tensor, keep_bos: bool) -> bool:
    return bool(keep_bos and bos_id(model) is not None and int(ids[0]) == bos_id(model))


def run_capture(model, capture: LayerCapture, ids: Tensor, attention_mask: Tensor | None = None) -> None:
    """One hooked forward of ``ids`` ``[B, n]`` that fills ``capture.out`` and stops after its last layer."""
    with torch.no_grad(), activations_captured(model, capture.all_hooks(), stop_after=capture.last_site):
        if attention_mask is None:
            model(ids, return_type=None)
        else:
            model(ids, return_type=None, attention_mask=attention_mask)


def run_in_query_chunks(model, ids: Tensor, chunk: int | None,
                        reads: Callable[[int, int], tuple[list[tuple[str, object]], str]]) -> None:
    """Forwards of one prompt ``ids`` ``[1, n]``, ``chunk`` query positions each, over the keys and values of the
    positions before them (a plain ``DynamicCache``, as :mod:`icl_lens.patches._incremental` keeps: every query sees
    its whole causal prefix, and the attention scores of a forward are ``chunk × (p + chunk)`` instead of ``n × n``).
    ``reads(p, e)`` gives the hooks of the forward of positions ``p..e−1`` and the site after which it stops. A prompt
    of at most ``chunk`` tokens (or ``chunk`` None) runs in one forward, without a cache."""
    n = ids.shape[-1]
    step = n if chunk is None else min(chunk, n)
    cache = DynamicCache() if step < n else None
    for p in range(0, n, step):
        e = min(p + step, n)
        hooks, last = reads(p, e)
        with torch.no_grad(), activations_captured(model, hooks, stop_after=last):
            model(ids[:, p:e], past_key_values=cache, return_type=None)


def run_capture_in_chunks(model, family: BlockFamily, ids: Tensor, keep_bos: bool, out: dict[str, Tensor | None],
                          chunk: int, layers: Sequence[int] | None = None, norm_weights=None) -> None:
    """The default-kept capture of one prompt ``ids`` ``[1, n]``, ``chunk`` query positions per forward
    (:func:`run_in_query_chunks`): the factors of one forward up to rounding. ``out`` holds ``[layers, 1, n, …]``
    buffers, filled in place (``norm_weights``: the norms-only buffers, as :class:`LayerCapture`'s)."""
    bos_values = {}

    def reads(p: int, e: int):
        rows = {key: None if buf is None else buf[:, :, p:e] for key, buf in out.items()}  # views: written in place
        capture = LayerCapture(model, family, None, True, keep_bos, rows, offset=p, bos_values=bos_values,
                               q=e - p, layers=layers, norm_weights=norm_weights)
        return capture.all_hooks(), capture.last_site
    run_in_query_chunks(model, ids, chunk, reads)
