"""Fit a thought patch layer by layer: Algorithm 1 of "Transmuting prompts into weights".

Mazzawi, Dherin et al. 2025, arXiv 2510.08734. For an instruction ``I`` and calibration
queries ``x₁…x_q`` (``n`` query tokens in all, every token of every query):

1. *Contextual pass*, once, unpatched, batched (right padding) over ``[BOS, I, xⱼ]``:
   at every layer ``l`` read the MLP input ``Aᵢ`` and the block output ``Oᵢ`` at each
   query token ``i`` (the forward stops after the last block: no unembedding).
2. For ``l = 0 … L−1`` (``iterations`` sweeps), *non-contextual passes* over
   ``[BOS, xⱼ]`` with every patch fitted so far applied, stopped at layer ``l``:
   a. read the MLP inputs ``aᵢ`` (query tokens, plus the BOS of each sequence as an
      anchor row whose target is its own unpatched input: position 0 sees only itself,
      so its contextual and context-free states are equal); matrix residual ``δᵢ = Aᵢ − aᵢ − M aᵢ`` (``M``: the
      current input map, zero in the first sweep); ``M ← M + η · input_map(δ, a, λ)``
      so ``Δ = W M`` is the least-squares thought matrix ``(Σ W δᵢ aᵢᵀ)(Σ aᵢaᵢᵀ + λI)⁻¹``
      of each dense layer reading the MLP input (``W_in``; ``W_gate``, ``W_up``);
   b. with that matrix applied, read the block outputs ``oᵢ``; vector residual
      ``ρᵢ = Oᵢ − oᵢ``; thought vector ``c ← c + η · mean ρᵢ`` (MLP-branch bias), or for
      a post-FFN RMSNorm the gain ``g ← g + η · argmin Σ‖ρᵢ − g⊙ŷᵢ‖²`` (see
      :mod:`icl_lens.core.least_squares` for why Gemma 3 uses the gain).
   The patch is in place before layer ``l+1`` is measured, so later layers correct what
   earlier ones left over.

Exactness (the reduction test): one single-token calibration query, ``λ = 0``, ``η = 1``:
``M a = δ`` exactly (pseudo-inverse of one column = the token patch) and the vector
adds exactly ``ρ``, so every block output of the query equals its contextual one and
the logits match (BOS + one token: two rows, interpolated exactly). The non-contextual
pass keeps BOS (docs/design.md §2). The BOS anchor rows matter on real models: the first
token after BOS is often a secondary attention sink with a massive activation in the
context-free pass (SmolLM2: norm ~650 vs ~100 in context at layer 3), and its
residual shares a direction with BOS's own input; without the anchor, the matrix fit
also rewrites BOS and destroys the sink. The vector is fitted on query tokens only.
A constant vector cannot be exact for several tokens at once, so multi-token queries
are fitted in the least-squares sense only.

Iterations: with ``η < 1`` each sweep refits what the last one left. With the bias site
(GPT-2, Llama) the error shrinks sweep by sweep. With the Gemma gain site it need not:
a coordinate where the calibration ``ŷ`` is near zero gets a large gain, and when an
earlier layer's refit moves ``ŷ`` the product moves a lot (seen on tiny-gemma3: logit
error 0.09 after one sweep at η = 0.5, 0.9 after three). Use ``η = 1``, one sweep there.

Cost: one contextual forward over the batch, plus ``2·iterations`` truncated
non-contextual forwards per layer over the short query batch; never one forward per
query per layer.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from icl_lens.core.least_squares import gain_vector, input_map, mean_vector, relative_residual
from icl_lens.core.norms import rms_normalize
from icl_lens.model.block_family import block_family, post_norm_eps
from icl_lens.model.capture import NonFiniteActivationError, StopForward, patch_dtype
from icl_lens.model.prompts import PromptError, bos_id
from icl_lens.model.weight_edits import edit_hooks
from icl_lens.model.batches import pad_id, right_padded
from icl_lens.thought.batches import QueryBatch, first_positions, query_batch, query_positions, text_ids
from icl_lens.thought.result import ThoughtPatch, thought_edits

KINDS = ("vector", "matrix", "both")


def _check(x: Tensor, what: str, layer: int) -> None:
    if not torch.isfinite(x).all():
        raise NonFiniteActivationError(f"non-finite {what} at layer {layer}")


def _validate(model, instruction, queries, kind, eta, ridge, layers, iterations) -> tuple[list[int], list[list[int]], list[int]]:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not (isinstance(eta, (int, float)) and math.isfinite(eta) and eta > 0):
        raise ValueError(f"eta must be a finite number > 0, got {eta!r}")
    if not (isinstance(ridge, (int, float)) and math.isfinite(ridge) and ridge >= 0):
        raise ValueError(f"ridge must be a finite number >= 0, got {ridge!r}")
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an integer >= 1, got {iterations!r}")
    if isinstance(queries, str):
        raise PromptError("queries must be a list of strings, not one string")
    queries = list(queries)
    if not queries:
        raise PromptError("the list of calibration queries is empty")
    instr_ids = text_ids(model, instruction, what="instruction")
    query_ids = [text_ids(model, q, what=f"query {i}") for i, q in enumerate(queries)]
    n_layers = model.cfg.n_layers
    if layers is None:
        chosen = list(range(n_layers))
    else:
        chosen = sorted({int(l) for l in layers})
        bad = [l for l in chosen if not 0 <= l < n_layers]
        if bad or not chosen:
            raise ValueError(f"layers must be a non-empty subset of 0..{n_layers - 1}, got {list(layers)}")
    return instr_ids, query_ids, chosen


def _chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(s, min(n, s + size))) for s in range(0, n, size)]


def _gather(x: Tensor, rows: Tensor, pos: Tensor, dtype) -> Tensor:
    return x.detach()[rows.to(x.device), pos.to(x.device)].to(dtype)


@torch.no_grad()
def _contextual(model, batch: QueryBatch, family, batch_size: int, dtype) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """MLP inputs ``A`` and block outputs ``O`` of every layer at every query token; MLP input at position 0."""
    n_layers = model.cfg.n_layers
    first: list[Tensor | None] = [None] * n_layers
    mlp_in: list[list[Tensor]] = [[] for _ in range(n_layers)]
    outs: list[list[Tensor]] = [[] for _ in range(n_layers)]
    pad = pad_id(model)
    for rows in _chunks(len(batch.sequences), batch_size):
        ids = right_padded([batch.sequences[r] for r in rows], pad, model.cfg.device)
        r_idx, p_idx = query_positions(batch, rows)

        def read_in(x, hook, layer):
            mlp_in[layer].append(_gather(x, r_idx, p_idx, dtype))
            if first[layer] is None:
                first[layer] = x.detach()[0, 0].to(dtype)

        def read_out(x, hook, layer):
            outs[layer].append(_gather(x, r_idx, p_idx, dtype))
            if layer == n_layers - 1:
                raise StopForward

        hooks = []
        for layer in range(n_layers):
            hooks.append((family.mlp_input(layer), lambda x, hook, layer=layer: read_in(x, hook, layer)))
            hooks.append((family.resid_post(layer), lambda x, hook, layer=layer: read_out(x, hook, layer)))
        with model.hooks(fwd_hooks=hooks):
            try:
                model(ids, return_type=None)
            except StopForward:
                pass
    A = [torch.cat(x) for x in mlp_in]
    O = [torch.cat(x) for x in outs]
    for layer in range(n_layers):
        _check(A[layer], "contextual MLP input", layer)
        _check(O[layer], "contextual block output", layer)
    return A, O, first


@torch.no_grad()
def _read_plain(model, batch: QueryBatch, hooks_base, reads: dict[str, str], stop: str, batch_size: int, dtype,
                bos_reads: tuple[str, ...] = ()) -> dict[str, Tensor]:
    """Non-contextual forward(s) with ``hooks_base`` applied; gather the ``reads`` hook points; stop at ``stop``.

    ``stop`` must be one of the ``reads`` (the forward ends right after reading it).
    """
    if stop not in reads.values():
        raise ValueError(f"stop hook {stop!r} is not read")
    got: dict[str, list[Tensor]] = {k: [] for k in [*reads, *(f"{k}_bos" for k in bos_reads)]}
    pad = pad_id(model)
    for rows in _chunks(len(batch.sequences), batch_size):
        ids = right_padded([batch.sequences[r] for r in rows], pad, model.cfg.device)
        r_idx, p_idx = query_positions(batch, rows)
        r0, p0 = first_positions(rows)
        hooks = list(hooks_base)
        for key, name in reads.items():
            def read(x, hook, key=key, name=name):
                got[key].append(_gather(x, r_idx, p_idx, dtype))
                if key in bos_reads:
                    got[f"{key}_bos"].append(_gather(x, r0, p0, dtype))
                if name == stop:
                    raise StopForward
            hooks.append((name, read))
        with model.hooks(fwd_hooks=hooks):
            try:
                model(ids, return_type=None)
            except StopForward:
                pass
    return {k: torch.cat(v) for k, v in got.items()}


def thought_patch(
    model,
    instruction: str,
    queries: Sequence[str],
    *,
    kind: str = "both",
    eta: float = 1.0,
    ridge: float = 0.0,
    layers: Sequence[int] | None = None,
    iterations: int = 1,
    batch_size: int = 16,
) -> ThoughtPatch:
    """Turn ``instruction`` into a weight edit fitted on the calibration ``queries`` (Algorithm 1).

    ``kind``: ``"vector"``, ``"matrix"`` or ``"both"``. ``eta``: step size. ``ridge``: λ ≥ 0
    (absolute; 0 → minimum-norm pseudo-inverse). ``layers``: which layers to patch
    (default all). ``iterations``: sweeps over the layers (each refits the residual
    left by the previous sweep; with ``eta = 1`` one sweep already fits it).
    """
    instr_ids, query_ids, chosen = _validate(model, instruction, queries, kind, eta, ridge, layers, iterations)
    family = block_family(model)
    site = family.vector_site
    dtype = patch_dtype(model)
    cfg = model.cfg
    ctx = query_batch(model, query_ids, prefix=instr_ids)
    plain = query_batch(model, query_ids)
    A, O, A_first = _contextual(model, ctx, family, batch_size, dtype)
    anchor = bos_id(model) is not None  # every sequence starts with BOS: fit it too, target unchanged

    d = cfg.d_model
    maps = torch.zeros(cfg.n_layers, d, d, dtype=dtype, device=cfg.device)
    vecs = torch.zeros(cfg.n_layers, d, dtype=dtype, device=cfg.device)
    m_res = torch.zeros(cfg.n_layers, dtype=torch.float64)
    v_res = torch.zeros(cfg.n_layers, dtype=torch.float64)
    do_matrix, do_vector = kind in ("matrix", "both"), kind in ("vector", "both")
    patched_maps: dict[int, Tensor] = {}
    patched_vecs: dict[int, Tensor] = {}

    for _ in range(iterations):
        for layer in chosen:
            if do_matrix:
                hooks = edit_hooks(model, thought_edits(model, patched_maps, patched_vecs, site), family)
                got = _read_plain(model, plain, hooks, {"a": family.mlp_input(layer)}, family.mlp_input(layer),
                                  batch_size, dtype, bos_reads=("a",) if anchor else ())
                a = got["a"]
                _check(a, "non-contextual MLP input", layer)
                target = A[layer] - a - a @ maps[layer].T
                rows_a, rows_t = a, target
                if anchor:  # BOS rows: position 0 sees only itself, so its contextual input is A_first
                    a0 = got["a_bos"]
                    rows_a = torch.cat([a0, a])
                    rows_t = torch.cat([A_first[layer].expand_as(a0) - a0 - a0 @ maps[layer].T, target])
                step = input_map(rows_t, rows_a, ridge=ridge)
                maps[layer] += eta * step
                m_res[layer] = relative_residual(A[layer] - a, a @ maps[layer].T)
                patched_maps[layer] = maps[layer]
            if do_vector:
                patched_vecs[layer] = vecs[layer]
                hooks = edit_hooks(model, thought_edits(model, patched_maps, patched_vecs, site), family)
                reads = {"o": family.resid_post(layer)}
                if site == "gain":
                    reads = {"y": family.post_norm_input(layer), **reads}
                got = _read_plain(model, plain, hooks, reads, reads["o"], batch_size, dtype)
                rho = O[layer] - got["o"]
                _check(rho, "non-contextual block output", layer)
                if site == "gain":
                    yhat = rms_normalize(got["y"], post_norm_eps(model, layer)).to(dtype)
                    step = gain_vector(rho, yhat, ridge=ridge)
                    fitted = eta * step * yhat
                else:
                    step = mean_vector(rho)
                    fitted = (eta * step).expand_as(rho)
                vecs[layer] += eta * step
                v_res[layer] = relative_residual(rho, fitted)
    if not (torch.isfinite(maps).all() and torch.isfinite(vecs).all()):
        raise NonFiniteActivationError("the fitted thought patch is not finite")
    return ThoughtPatch(
        model_name=getattr(model, "icl_lens_name", cfg.model_name),
        family=family.name, vector_site=site, instruction=instruction, queries=tuple(queries),
        kind=kind, eta=float(eta), ridge=float(ridge), iterations=iterations, layers=tuple(chosen),
        maps=maps, vectors=vecs, matrix_residual=m_res, vector_residual=v_res,
        n_tokens=plain.n_tokens, model=model,
    )
