"""Who wrote a token patch: ``patch_attribution`` splits one query's patch and skip correction, at every layer,
exactly over attention heads and removed context tokens (docs/design.md §7).

For query ``t`` at layer ``l`` (docs/design.md §2; Dherin et al. 2025, arXiv 2507.16003), what
attention adds with minus without the removed context is, before any norm,

    raw_C − raw_0 = Σ_h Σ_{j∉K} α_hj O_h (v_hj − v̄_hK)

(``α`` the query's contextual attention weights, ``K`` its kept keys, ``v̄_hK`` the kept-only
value mix), and the norms between that sum and the MLP input are carried through exactly by
the straight-path integrated Jacobian ``M = ∫₀¹ J(raw_0 + s (raw_C − raw_0)) ds`` (Gauss–
Legendre quadrature): ``δ_hj = M_F α_hj O_h (v_hj − v̄_hK)`` sums to ``δ = A − a``, so the
parts ``ΔW_hj = (W δ_hj) vᵀ`` sum to the patch ``ΔW``, and ``c_hj = M_P α_hj O_h (v_hj − v̄_hK)``
to the correction ``attn_C − attn_0`` (:mod:`icl_lens.core._attribution`). The **share** of a part
is ``⟨ΔW_hj, ΔW⟩_F / ‖ΔW‖²_F`` (of ``c_hj`` in ``c`` for the correction): the shares of all heads
and tokens sum to 1 (a negative share points against the patch).

This attributes the implicit weight update, not the model's output. For a parallel block
(GPT-NeoX/Pythia) the MLP input does not depend on attention, the patch is zero and the
correction carries the whole context effect: every patch share is 0 and the correction shares
sum to 1.

**What the patch writes** (:meth:`PatchAttribution.writes`): at layer ``l`` the patched MLP maps
the kept-only input ``a`` to the output it gives ``A``, so the patch changes the MLP branch's
output by ``MLP(A) − MLP(a)`` (after a post-FFN norm where the block has one); the correction
adds ``c``. Each is read through the unembedding linearised at the query's contextual final
residual (the final norm's Jacobian, then ``W_U`` and any logit soft-cap's slope): a
*first-order, this-layer* view (direct logit attribution of the update), which ignores how
later layers react.

**Cost.** One forward of the query token alone over the prompt's cached keys and values when
a :class:`~icl_lens.PatchSession` holds the prompt (else a forward over the
prompt up to the query), then per layer one vector–Jacobian product per quadrature node through
the block's norms and ``H·n·d_head`` dot products. ``norms=True`` forms the ``d_model × d_model``
integrated Jacobians and the parts' vectors (``H·n·d_model`` per layer) to give their norms and
the measured completeness error.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformers import DynamicCache

from icl_lens.core._attribution import (
    head_source_parts,
    head_source_shares,
    integrated_jacobian,
    integrated_vjp,
    share_cotangent,
)
from icl_lens.core._factored import safe_divide
from icl_lens.core._kept_attention import default_kept_mask, kept_set_output, removal_kept_mask
from icl_lens.core._token_patch import input_pseudo_inverse
from icl_lens.patches._batches import selected_layers
from icl_lens.model._block_family import BlockFamily, block_family, dense_weight
from icl_lens.model._types import patch_dtype
from icl_lens.patches._capture import dense_weights, is_bos_kept, removed_mask
from icl_lens.model._prompts import encode_prompt, str_tokens
from icl_lens.model._reading import NonFiniteActivationError, activations_captured

if TYPE_CHECKING:
    from icl_lens.patches._incremental import PatchSession
    from icl_lens.model._types import Model

PARTS = ("patch", "correction")
DEFAULT_NODES = 8
MAX_NODES = 128
FINAL_RESIDUAL = "ln_final.hook_in"


def share_tolerance(dtype: torch.dtype) -> float:
    """Quadrature stops when doubling the nodes moves no share by more than this (:func:`converged`), for a model
    computing in ``dtype``: 1e-12 in float64, 1e-6 in float32 (its rounding of the shares is about 1e-7), 1e-2 in
    bfloat16/float16, whose norms round their inputs to ~3 digits (the shares are then as exact as the model)."""
    return {torch.float64: 1e-12, torch.float32: 1e-6}.get(dtype, 1e-2)


def converged(share: Float[Tensor, "query head key"], change: Float[Tensor, "query head key"], tol: float) -> bool:
    """Whether doubling the nodes moved no share by more than ``tol`` beyond the rounding of the shares themselves
    (``64·eps·Σ|share|`` per query). ``Σ shares − 1`` is reported, not used here: in float32 it also carries the
    rounding of ``δ = A − a`` (about ``eps·‖A‖/‖δ‖``), which no number of nodes removes."""
    floor = 64 * torch.finfo(share.dtype).eps * share.abs().sum((-1, -2))
    return bool((change.amax((-1, -2)) <= tol + floor).all())


@dataclass(frozen=True, eq=False)
class PatchWrites:
    """What one query's patch and correction write at some layers, read through the unembedding: first order,
    this layer only (module docstring). Per part (``"patch"``, ``"correction"``) and layer, the ``k`` tokens
    whose logit the part raises most (``promoted``) and lowers most (``suppressed``), with the logit change."""

    position: int
    layers: tuple[int, ...]
    promoted_ids: Int[Tensor, "part layer k"]
    promoted_logits: Float[Tensor, "part layer k"]
    suppressed_ids: Int[Tensor, "part layer k"]
    suppressed_logits: Float[Tensor, "part layer k"]
    promoted_tokens: tuple[tuple[tuple[str, ...], ...], ...]
    suppressed_tokens: tuple[tuple[tuple[str, ...], ...], ...]
    output_norms: Float[Tensor, "part layer"]  # ‖MLP(A) − MLP(a)‖ and ‖c‖: the vectors read out
    view: str = "first-order, this-layer view: the change read through the unembedding linearised at the " \
                "query's final residual; later layers' reactions are ignored"

    def to_frame(self) -> pd.DataFrame:
        """One row per part, layer, direction and rank: token id, token, logit change."""
        rows = []
        for p, part in enumerate(PARTS):
            for i, layer in enumerate(self.layers):
                for direction, ids, logits, tokens in (
                        ("promoted", self.promoted_ids, self.promoted_logits, self.promoted_tokens),
                        ("suppressed", self.suppressed_ids, self.suppressed_logits, self.suppressed_tokens)):
                    for rank in range(ids.shape[-1]):
                        rows.append({"part": part, "layer": layer, "direction": direction, "rank": rank + 1,
                                     "token_id": int(ids[p, i, rank]), "token": tokens[p][i][rank],
                                     "logit_change": float(logits[p, i, rank])})
        return pd.DataFrame(rows, columns=["part", "layer", "direction", "rank", "token_id", "token", "logit_change"])


@dataclass(frozen=True, eq=False)
class PatchAttribution:
    """The exact split of one query's token patch and skip correction over heads and removed context tokens.

    Axis ``layer`` runs over :attr:`layers`, ``head`` over the model's query heads, ``source``
    over :attr:`sources` (the removed context positions, increasing). ``patch_share[l, h, s]``
    is ``⟨ΔW_hs, ΔW⟩/‖ΔW‖²`` at layer ``layers[l]``; ``correction_share`` the same for the
    correction. Shares of one layer sum to 1 (0 where the patch is zero: a parallel block's
    patch, a query with nothing removed); ``patch_residual`` is ``Σ shares − 1`` as computed,
    the measured quadrature and rounding error, with ``nodes`` Gauss–Legendre nodes.
    ``patch_part_norm`` (``‖ΔW_hs‖_F``), ``correction_part_norm``, ``patch_error`` and
    ``correction_error`` (``‖Σ parts − whole‖ / ‖whole‖``, the patch in ``‖W ·‖``) are filled with
    ``norms=True``; ``delta_parts`` and ``correction_parts`` (the vectors ``δ_hs`` and ``c_hs``)
    with ``parts=True``.
    """

    model_name: str
    tokens: tuple[str, ...]
    token_ids: Int[Tensor, " token"]
    position: int
    layers: tuple[int, ...]
    sources: tuple[int, ...]
    kept: tuple[int, ...]
    parallel: bool
    patch_share: Float[Tensor, "layer head source"]
    correction_share: Float[Tensor, "layer head source"]
    patch_norm: Float[Tensor, " layer"]
    correction_norm: Float[Tensor, " layer"]
    patch_residual: Float[Tensor, " layer"]
    correction_residual: Float[Tensor, " layer"]
    nodes: tuple[int, ...]
    mlp_input: Float[Tensor, "layer d_model"]
    kept_input: Float[Tensor, "layer d_model"]
    correction: Float[Tensor, "layer d_model"]
    final_residual: Float[Tensor, " d_model"] | None = None
    patch_part_norm: Float[Tensor, "layer head source"] | None = None
    correction_part_norm: Float[Tensor, "layer head source"] | None = None
    patch_error: Float[Tensor, " layer"] | None = None
    correction_error: Float[Tensor, " layer"] | None = None
    delta_parts: Float[Tensor, "layer head source d_model"] | None = None
    correction_parts: Float[Tensor, "layer head source d_model"] | None = None

    @property
    def n_heads(self) -> int:
        return int(self.patch_share.shape[1])

    @property
    def delta(self) -> Float[Tensor, "layer d_model"]:
        """``δ = A − a`` of the query at each layer."""
        return self.mlp_input - self.kept_input

    @property
    def offsets(self) -> tuple[int, ...]:
        """``position − source`` of each source (1: the previous token)."""
        return tuple(self.position - s for s in self.sources)

    def note(self) -> str:
        """What the shares mean here, in one sentence (parallel blocks and queries with nothing removed say so)."""
        if not self.sources:
            return f"position {self.position} has no removed context: its patch and correction are zero"
        if self.parallel:
            return ("parallel block: attention does not reach the MLP input, so the patch is zero and the "
                    "correction carries the whole context effect")
        return "shares of the implicit weight update (not of the output); each layer's shares sum to 1"

    def _row(self, layer: int) -> int:
        if layer not in self.layers:
            raise ValueError(f"layer {layer} is not held; this attribution holds layers {list(self.layers)}")
        return self.layers.index(layer)

    def shares(self, part: str = "patch") -> Float[Tensor, "layer head source"]:
        if part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, got {part!r}")
        return self.patch_share if part == "patch" else self.correction_share

    def head_map(self, layer: int, part: str = "patch") -> Float[Tensor, "head source"]:
        """Shares of ``part`` at model layer ``layer``, heads × sources."""
        return self.shares(part)[self._row(layer)]

    def layer_heads(self, part: str = "patch") -> Float[Tensor, "layer head"]:
        """Each head's share (summed over sources) at every layer held."""
        return self.shares(part).sum(-1)

    def source_shares(self, layer: int, part: str = "patch") -> Float[Tensor, " source"]:
        """Each source token's share (summed over heads) at model layer ``layer``."""
        return self.head_map(layer, part).sum(0)

    def top(self, k: int = 5, layer: int | None = None, part: str = "patch") -> pd.DataFrame:
        """The ``k`` (layer, head, source) parts with the largest shares (at one layer, or over all held)."""
        frame = self.to_frame()
        frame = frame[frame.part == part]
        if layer is not None:
            frame = frame[frame.layer == self.layers[self._row(layer)]]
        return frame.nlargest(k, "share").reset_index(drop=True)

    def to_frame(self) -> pd.DataFrame:
        """Tidy table: one row per part (patch, correction), layer, head and source, with the query's position,
        the source's position, token and offset, the share and (with ``norms=True``) the part's norm (NaN
        otherwise)."""
        n_l, n_h, n_s = self.patch_share.shape
        grid = np.stack(np.meshgrid(np.asarray(self.layers, dtype=np.int64), np.arange(n_h),
                                    np.asarray(self.sources, dtype=np.int64), indexing="ij"), -1).reshape(-1, 3)
        frames = []
        for part, share, norm in (("patch", self.patch_share, self.patch_part_norm),
                                  ("correction", self.correction_share, self.correction_part_norm)):
            norms = (np.full(n_l * n_h * n_s, np.nan) if norm is None
                     else norm.detach().cpu().double().numpy().reshape(-1))
            frames.append(pd.DataFrame({
                "part": part, "position": self.position, "layer": grid[:, 0], "head": grid[:, 1], "source_position": grid[:, 2],
                "source_token": np.asarray(self.tokens, dtype=object)[grid[:, 2]] if len(grid) else [],
                "offset": self.position - grid[:, 2], "share": share.detach().cpu().double().numpy().reshape(-1),
                "norm": norms}))
        return pd.concat(frames, ignore_index=True)

    def writes(self, model: Model, layers: Iterable[int] | int | None = None, k: int = 10) -> PatchWrites:
        """What the patch and the correction write at ``layers`` (default: all held): see the module docstring."""
        return patch_writes(model, self, layers=layers, k=k)


@dataclass(frozen=True)
class _Rows:
    """Which rows of the forward's input are queries (prompt ``positions``), their kept and removed keys."""

    rows: Int[Tensor, " query"]
    positions: Int[Tensor, " query"]
    kept: Bool[Tensor, "query key"]
    removed: Bool[Tensor, "query key"]


class AttributionCapture:
    """Hooks that compute, during one forward, each layer's shares for some query rows (and, for one row,
    the parts' norms and vectors). The values of all keys come from the forward's key/value ``cache``.

    ``out[layer]`` receives a dict per layer: ``patch_share``/``correction_share`` ``[query, head, key]``,
    the residuals, ``mlp_input``/``kept_input``/``correction`` ``[query, d_model]``, the node counts, and
    with ``norms`` the part norms and errors (``parts``: the vectors).
    """

    def __init__(self, model, family: BlockFamily, rows: _Rows, cache: DynamicCache, layers: Sequence[int], *,
                 nodes: int = DEFAULT_NODES, norms: bool = False, parts: bool = False, reduce=None):
        self.model, self.family, self.rows, self.cache = model, family, rows, cache
        self.layers, self.nodes, self.norms, self.parts = tuple(layers), int(nodes), norms or parts, parts
        self.reduce = reduce  # fn(layer, result dict) -> what to keep (the sweep keeps its top-k)
        self.dtype = patch_dtype(model)
        self.weights = dense_weights(model)
        self.state: dict[str, Tensor] = {}
        self.out: dict[int, dict] = {}
        self.busy = False
        self.final: Tensor | None = None

    def hooks(self) -> list[tuple[str, object]]:
        f = self.family
        out = []
        for layer in self.layers:
            out += [(f.resid_pre(layer), self._store("r")), (f.scores(layer), self._store("scores")),
                    (f.pattern(layer), self._store("alpha")),
                    (f.attention_projection_out(layer), self._store("raw_C")), (f.attn_out(layer), self._store("attn_C")),
                    (f.mlp_input(layer), lambda x, hook, layer=layer: self._layer(x, layer))]
        return out

    def final_hook(self) -> tuple[str, object]:
        def keep(x, hook):
            if not self.busy:
                self.final = x.detach()[0, self.rows.rows]
        return FINAL_RESIDUAL, keep

    def _store(self, key: str):
        def hook(x, hook):
            if not self.busy:
                self.state[key] = x.detach()
        return hook

    def _layer(self, mlp_in: Tensor, layer: int) -> None:
        if self.busy:  # the norms called below fire this hook point again
            return
        self.busy = True
        try:
            result = self._compute(layer, mlp_in.detach())
            self.out[layer] = result if self.reduce is None else self.reduce(layer, result)
        finally:
            self.busy = False
            self.state.clear()

    @torch.no_grad()
    def _compute(self, layer: int, mlp_in: Tensor) -> dict:
        model, family, dtype, rows = self.model, self.family, self.dtype, self.rows
        block = model.blocks[layer]
        pick = lambda x: x[0, rows.rows]  # noqa: E731  [query, d]
        r, raw_C, attn_C, A = (pick(x) for x in (self.state["r"], self.state["raw_C"], self.state["attn_C"], mlp_in))
        bad = ~torch.isfinite(A).all(-1)
        if bool(bad.any()):
            raise NonFiniteActivationError(f"non-finite MLP input at layer {layer}, position "
                                           f"{int(rows.positions[int(torch.nonzero(bad)[0])])}")
        model_dtype = A.dtype
        alpha = self.state["alpha"][0][:, rows.rows].transpose(0, 1).to(dtype)  # query head key
        values = self.cache.layers[layer].values[0].transpose(0, 1).to(dtype)  # key kv_head d_head
        kept, removed = rows.kept.to(A.device), rows.removed.to(A.device)
        # v̄_hK: the cached scores renormalised over the kept keys (§2), as the token patches compute it
        mix = kept_set_output(self.state["scores"][0][:, rows.rows], values, kept).to(dtype)  # query head d_head
        n_heads = alpha.shape[1]
        w = dense_weight(block.attn.o).detach().to(dtype)  # d_model, head·d_head
        w_o = w.T.reshape(n_heads, -1, w.shape[0])  # head d_head d_model

        raw_0 = block.attn.o(mix.reshape(1, mix.shape[0], -1).to(model_dtype))[0]
        attn_0 = family.attention_post_norm(block, raw_0[None])[0]
        context = removed.any(-1, keepdim=True)  # a query that lost nothing has a zero patch and correction
        a = torch.where(context, family.context_free_mlp_input(block, r, attn_0, A), A)
        delta = torch.where(context, A.to(dtype) - a.to(dtype), 0.0)
        correction = torch.where(context, attn_C.to(dtype) - attn_0.to(dtype), 0.0)
        R = self.weights.r(layer, A.device).to(dtype)

        def post(x: Tensor) -> Tensor:  # P: raw → what attention adds (row-wise, any leading axes)
            flat = x.reshape(1, -1, x.shape[-1]).to(model_dtype)
            return family.attention_post_norm(block, flat).reshape(x.shape).to(dtype)

        def maps(resid: Tensor) -> dict:
            """F (raw → the MLP input, for queries with residual ``resid``) and P; None where the map is linear."""
            def mlp_input(x: Tensor) -> Tensor:
                rr = resid.expand(*x.shape[:-2], *resid.shape).reshape(-1, resid.shape[-1])
                out = family.context_free_mlp_input(block, rr, post(x).reshape(-1, x.shape[-1]).to(model_dtype), rr)
                return out.reshape(x.shape).to(dtype)
            return {"patch": None if family.parallel else mlp_input,
                    "correction": post if family.post_attention_norm else None}

        wholes = {"patch": delta, "correction": correction}
        cotangents = {"patch": share_cotangent(delta, R), "correction": share_cotangent(correction)}
        present = {"patch": (torch.linalg.vector_norm(delta @ R.T, dim=-1) > 0) & (not family.parallel),
                   "correction": torch.linalg.vector_norm(correction, dim=-1) > 0}
        start, end = raw_0.to(dtype), raw_C.to(dtype)
        shares = lambda g, part: self._shares(g, present[part], alpha, values, mix, removed, w_o)  # noqa: E731
        result: dict = {"mlp_input": A.to(dtype), "kept_input": a.to(dtype), "correction": correction}
        tol = share_tolerance(model_dtype)
        for part, fn in maps(r).items():
            n = self.nodes
            if fn is None or not bool(present[part].any()):  # linear (or nothing to split): no quadrature
                share, residual = shares(cotangents[part] * present[part][:, None], part)
            else:  # a rule and its refinement in one pass; refine until doubling moves no share by more than tol
                coarse, fine = integrated_vjp(fn, start, end, cotangents[part], [n, 2 * n])
                (share, residual), n = shares(fine, part), 2 * n
                change = (share - shares(coarse, part)[0]).abs()
                while not converged(share, change, tol) and n < MAX_NODES:
                    n *= 2
                    finer, residual = shares(integrated_vjp(fn, start, end, cotangents[part], n), part)
                    change, share = (finer - share).abs(), finer
            result[f"{part}_share"], result[f"{part}_residual"], result[f"{part}_nodes"] = share, residual, n
            if self.norms:
                result.update(self._norms(part, lambda q, part=part: maps(r[q:q + 1])[part], n, start, end, alpha,
                                          values, mix, removed, w_o, wholes[part], R if part == "patch" else None, a))
        return result

    @staticmethod
    def _shares(g, present, alpha, values, mix, removed, w_o) -> tuple[Tensor, Tensor]:
        """Shares of one part for the cotangent ``g`` (``M_Fᵀ …``), and ``Σ shares − 1`` (0 where the part is zero)."""
        share = head_source_shares(alpha, values, mix, removed, w_o, g)
        return share, share.sum((-1, -2)) - present.to(share.dtype)

    def _norms(self, part: str, fn_of, n: int, start, end, alpha, values, mix, removed, w_o, whole, metric, a) -> dict:
        """Parts' vectors of each query row (one at a time), their norms and the completeness error of ``part``."""
        norms, errors, vectors_all = [], [], []
        for q in range(alpha.shape[0]):
            raw_parts = head_source_parts(alpha[q], values, mix[q], removed[q], w_o)  # head key d_model
            fn = fn_of(q)
            if self.family.parallel and part == "patch":
                vectors = torch.zeros_like(raw_parts)
            elif fn is None:
                vectors = raw_parts
            else:
                M = integrated_jacobian(fn, start[q:q + 1], end[q:q + 1], n)[0]  # d_model d_model
                vectors = raw_parts @ M.T
            summed = vectors.sum((0, 1)) - whole[q]
            if metric is not None:  # the patch: ‖ΔW_hj‖ = ‖R δ_hj‖·‖v‖, errors in ‖R ·‖ = ‖W ·‖
                v, _ = input_pseudo_inverse(a[q].to(whole.dtype))
                norms.append(torch.linalg.vector_norm(vectors @ metric.T, dim=-1) * torch.linalg.vector_norm(v))
                errors.append(safe_divide(torch.linalg.vector_norm(summed @ metric.T),
                                          torch.linalg.vector_norm(whole[q] @ metric.T)))
            else:
                norms.append(torch.linalg.vector_norm(vectors, dim=-1))
                errors.append(safe_divide(torch.linalg.vector_norm(summed), torch.linalg.vector_norm(whole[q])))
            if self.parts:
                vectors_all.append(vectors)
        out = {f"{part}_part_norm": torch.stack(norms), f"{part}_error": torch.stack(errors)}
        if self.parts:
            out[f"{part}_parts"] = torch.stack(vectors_all)
        return out


def kept_keys(n: int, positions: Sequence[int], *, kept_bos: bool, remove: Iterable[int] | slice | None,
              device) -> Bool[Tensor, "query key"]:
    """Kept keys (over the prompt) of each query: ``{t}`` plus a kept BOS by default, else all but ``remove``."""
    if remove is None:
        kept = default_kept_mask(n, keep_bos=kept_bos, device=device)
    else:
        kept = removal_kept_mask(n, removed_mask(remove, n, device))
    return kept[list(positions)]


@overload
def patch_attribution(model: Model, prompt, position: int, layers: Iterable[int] | int | None = None, *,
                      session: PatchSession | None = None, norms: bool = False, parts: bool = False,
                      remove: Iterable[int] | slice | None = None, keep_bos: bool = True,
                      nodes: int = DEFAULT_NODES) -> PatchAttribution: ...


@overload
def patch_attribution(model: Model, prompt, position: Sequence[int], layers: Iterable[int] | int | None = None, *,
                      session: PatchSession | None = None, norms: bool = False, parts: bool = False,
                      remove: Iterable[int] | slice | None = None, keep_bos: bool = True,
                      nodes: int = DEFAULT_NODES) -> list[PatchAttribution]: ...


@torch.no_grad()
def patch_attribution(model: Model, prompt, position: int | Sequence[int], layers: Iterable[int] | int | None = None,
                      *, session: PatchSession | None = None, norms: bool = False, parts: bool = False,
                      remove: Iterable[int] | slice | None = None, keep_bos: bool = True,
                      nodes: int = DEFAULT_NODES) -> PatchAttribution | list[PatchAttribution]:
    """Split the token patch and the skip correction of query ``position`` over heads and removed context tokens.

    ``prompt``: text or token ids; ``position``: the query (negative from the end), or a list of
    queries (a list of results, from one forward over the prompt up to the last of them).
    ``layers``: model layers (default all). ``session``: a
    :class:`~icl_lens.PatchSession` that holds this prompt (or one that starts
    with it up to the query): its keys and values are reused and only the query token runs (one
    query). ``norms``: also each part's norm and the measured completeness error
    (``‖Σ parts − whole‖/‖whole‖``; a ``d_model × d_model`` integrated Jacobian per query and
    layer); ``parts``: also the parts' vectors (``H·n·d_model`` floats per query and layer).
    ``remove``/``keep_bos``: the kept set, as in :func:`~icl_lens.patches.token_patches`.
    ``nodes``: Gauss–Legendre nodes to start from; they are doubled (up to 128) until doubling
    moves no share by more than :func:`share_tolerance` (:func:`converged`).

    Formula, meaning and cost: the module docstring (docs/design.md §7). A query with nothing
    removed gives an attribution with no sources (zero patch and correction).
    """
    family = block_family(model)
    ids = encode_prompt(model, prompt)
    n = ids.numel()
    many = not isinstance(position, int)
    asked = [int(p) for p in position] if many else [int(position)]
    if not asked:
        raise ValueError("no positions given")
    bad = [p for p in asked if not -n <= p < n]
    if bad:
        raise IndexError(f"positions {bad} are outside the prompt (0..{n - 1})")
    queries = [p % n for p in asked]
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    wanted = selected_layers(model, layers)
    kept = kept_keys(n, queries, kept_bos=is_bos_kept(model, ids, keep_bos), remove=remove, device=ids.device)
    last = max(queries)
    past = (session.prefix_cache(ids, last) if session is not None and len(queries) == 1 and last > 0 else None)
    cache, start = (DynamicCache(), 0) if past is None else (past[0], last)
    keys = torch.arange(last + 1, device=ids.device)
    causal = keys[None, :] <= torch.tensor(queries, device=ids.device)[:, None]
    kept = kept[:, : last + 1] & causal
    rows = _Rows(rows=torch.tensor(queries) - start, positions=torch.tensor(queries), kept=kept, removed=causal & ~kept)
    capture = AttributionCapture(model, family, rows, cache, wanted, nodes=nodes, norms=norms, parts=parts)
    with activations_captured(model, capture.hooks() + [capture.final_hook()], stop_after=FINAL_RESIDUAL):
        model(ids[None, start: last + 1], past_key_values=cache, return_type=None)
    tokens = str_tokens(model, ids)
    out = [_assemble(model, ids, tokens, q, i, wanted, rows, family, capture) for i, q in enumerate(queries)]
    return out if many else out[0]


def _assemble(model, ids: Tensor, tokens: tuple[str, ...], t: int, i: int, layers: tuple[int, ...], rows: _Rows,
              family: BlockFamily, capture: AttributionCapture) -> PatchAttribution:
    """The attribution of query ``t`` (row ``i`` of the capture)."""
    out = [capture.out[layer] for layer in layers]
    sources = torch.nonzero(rows.removed[i]).flatten()
    cols = sources.to(out[0]["patch_share"].device)
    stack = lambda key: torch.stack([o[key][i] for o in out])  # noqa: E731  layer ...
    optional = {}
    for part in PARTS:
        for key in (f"{part}_part_norm", f"{part}_error", f"{part}_parts"):
            if key in out[0]:
                value = stack(key)
                name = "delta_parts" if key == "patch_parts" else key
                optional[name] = value if key.endswith("error") else value.index_select(2, cols)
    kept_input = stack("kept_input")
    v, _ = input_pseudo_inverse(kept_input)
    delta = stack("mlp_input") - kept_input
    patch_norm = torch.stack([capture.weights.norms(layer, delta[k]) for k, layer in enumerate(layers)])
    patch_norm = torch.zeros_like(patch_norm) if family.parallel else patch_norm * torch.linalg.vector_norm(v, dim=-1)
    return PatchAttribution(
        model_name=model.cfg.model_name, tokens=tokens, token_ids=ids.cpu(), position=t, layers=layers,
        sources=tuple(sources.tolist()), kept=tuple(torch.nonzero(rows.kept[i]).flatten().tolist()),
        parallel=family.parallel, patch_share=stack("patch_share").index_select(-1, cols),
        correction_share=stack("correction_share").index_select(-1, cols), patch_norm=patch_norm,
        correction_norm=torch.linalg.vector_norm(stack("correction"), dim=-1),
        patch_residual=stack("patch_residual"), correction_residual=stack("correction_residual"),
        nodes=tuple(max(o["patch_nodes"], o["correction_nodes"]) for o in out),
        mlp_input=stack("mlp_input"), kept_input=kept_input, correction=stack("correction"),
        final_residual=None if capture.final is None else capture.final[i], **optional)


@torch.no_grad()
def patch_writes(model: Model, attribution: PatchAttribution, layers: Iterable[int] | int | None = None,
                 k: int = 10) -> PatchWrites:
    """The ``k`` tokens whose logits the query's patch and correction raise and lower most, at ``layers`` (default:
    every layer held), first order and this layer only (module docstring). Needs the model the attribution
    was computed with (its MLPs, final norm and unembedding)."""
    if attribution.final_residual is None:
        raise ValueError("this attribution holds no final residual; compute it with patch_attribution")
    if model.cfg.model_name != attribution.model_name or model.cfg.d_model != attribution.mlp_input.shape[-1]:
        raise ValueError(f"the attribution was computed with {attribution.model_name!r}, not {model.cfg.model_name!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    wanted = attribution.layers if layers is None else tuple(sorted({int(x) for x in (
        [layers] if isinstance(layers, int) else layers)}))
    rows = [attribution._row(layer) for layer in wanted]
    family = block_family(model)
    dtype = attribution.mlp_input.dtype
    model_dtype = attribution.final_residual.dtype
    changes = []
    for row, layer in zip(rows, wanted):
        block = model.blocks[layer]
        both = torch.stack([attribution.mlp_input[row], attribution.kept_input[row]])[None].to(model_dtype)
        out = block.mlp(both)
        if family.post_mlp_norm:
            out = block.ln2_post(out)
        changes.append((out[0, 0] - out[0, 1]).to(dtype))
    vectors = torch.cat([torch.stack(changes), attribution.correction[list(rows)]])  # patch rows, then correction
    x = attribution.final_residual.to(dtype)[None]

    def final_norm(y: Tensor) -> Tensor:
        return model.ln_final(y.reshape(1, -1, y.shape[-1]).to(model_dtype)).reshape(y.shape).to(dtype)

    jac = integrated_jacobian(final_norm, x, x, 1)[0]  # the final norm's Jacobian at the contextual residual
    w_u = dense_weight(model.unembed).detach().to(dtype)  # vocab d_model
    logits = (vectors @ jac.T) @ w_u.T
    with torch.enable_grad():  # the slope of an elementwise logit transform (Gemma's soft-cap), 1 elsewhere
        base = model.unembed(final_norm(x)[None].to(model_dtype)).to(dtype).requires_grad_(True)
        (slope,) = torch.autograd.grad(model.adapter.apply_output_logits_transform(base).sum(), base)
    logits = logits * slope.reshape(1, -1)
    kk = min(k, logits.shape[-1])
    up, down = torch.topk(logits, kk, dim=-1), torch.topk(-logits, kk, dim=-1)
    shape = (len(PARTS), len(wanted), kk)

    def names(idx: Tensor) -> tuple:
        flat = str_tokens(model, idx.reshape(-1))
        per = [flat[i * kk:(i + 1) * kk] for i in range(idx.shape[0])]
        return tuple(tuple(per[p * len(wanted) + i] for i in range(len(wanted))) for p in range(len(PARTS)))

    return PatchWrites(position=attribution.position, layers=wanted,
                       promoted_ids=up.indices.reshape(shape).cpu(), promoted_logits=up.values.reshape(shape).cpu(),
                       suppressed_ids=down.indices.reshape(shape).cpu(),
                       suppressed_logits=(-down.values).reshape(shape).cpu(),
                       promoted_tokens=names(up.indices), suppressed_tokens=names(down.indices),
                       output_norms=torch.linalg.vector_norm(vectors, dim=-1).reshape(shape[:2]).cpu())


AUTHOR_FIELDS = ("head", "offset", "share")


@torch.no_grad()
def patch_authors(model: Model, prompt, k: int = 3, layers: Iterable[int] | int | None = None, *,
                  keep_bos: bool = True, nodes: int = DEFAULT_NODES) -> pd.DataFrame:
    """The ``k`` largest patch shares of every query and layer of ``prompt``, as (head, source offset, share).

    One forward over the prompt; each layer's shares (:func:`patch_attribution`, default kept
    set) are reduced to their top ``k`` while the forward runs, so memory stays that of one
    layer's attention pattern. Returns a table with columns ``layer``, ``position`` and
    ``authors``: a list of ``{"head", "offset", "share"}`` (``offset`` = position − source
    position, 1 the previous token), largest share first, empty where the patch is zero (the
    first tokens, a parallel block). Sweeps store it as an optional column (``--authors K``).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    family = block_family(model)
    ids = encode_prompt(model, prompt)
    n = ids.numel()
    wanted = selected_layers(model, layers)
    kept = kept_keys(n, range(n), kept_bos=is_bos_kept(model, ids, keep_bos), remove=None, device=ids.device)
    causal = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()
    rows = _Rows(rows=torch.arange(n), positions=torch.arange(n), kept=kept & causal, removed=causal & ~kept)
    positions = torch.arange(n)

    def top(layer: int, result: dict) -> list[list[dict]]:
        share = result["patch_share"].masked_fill(~rows.removed[:, None, :], float("-inf"))  # query head key
        flat = share.reshape(n, -1)
        kk = min(k, flat.shape[-1])
        values, index = torch.topk(flat, kk, dim=-1)
        heads, keys = (index // n).cpu(), (index % n).cpu()
        zero = (result["patch_share"].abs().sum((1, 2)) == 0).cpu()
        out = []
        for q in range(n):
            out.append([] if bool(zero[q]) else [
                {"head": int(heads[q, i]), "offset": int(positions[q] - keys[q, i]), "share": float(values[q, i])}
                for i in range(kk) if torch.isfinite(values[q, i])])
        return out

    capture = AttributionCapture(model, family, rows, DynamicCache(), wanted, nodes=nodes, reduce=top)
    with activations_captured(model, capture.hooks(), stop_after=family.mlp_input(wanted[-1])):
        model(ids[None], past_key_values=capture.cache, return_type=None)
    return pd.DataFrame({"layer": np.repeat(np.asarray(wanted, dtype=np.int64), n),
                         "position": np.tile(np.arange(n, dtype=np.int64), len(wanted)),
                         "authors": [a for layer in wanted for a in capture.out[layer]]})
