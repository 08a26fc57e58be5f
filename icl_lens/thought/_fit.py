"""Fit a thought patch layer by layer: Algorithm 1 of "Transmuting prompts into weights".

Mazzawi, Dherin et al. 2025, arXiv 2510.08734. For an instruction ``I`` and calibration
queries ``x₁…x_q`` (``n`` query tokens in all, every token of every query), and a fixed
*query prefix* ``p`` (default ``DEFAULT_QUERY_PREFIX``, a newline):

1. *Contextual pass*, once, unpatched, batched (right padding) over ``[BOS, I, xⱼ]``:
   at every layer ``l`` read the MLP input ``Aᵢ`` and the block output ``Oᵢ`` at each
   query token ``i`` (the forward stops after the last block); and once over
   ``[BOS, p, xⱼ]``, unpatched, the same at the *anchor* positions (BOS and ``p``).
   *Answer rows* (``answer_tokens = k > 0``, an icl_lens extension): before that, each
   query is extended by the first ``k`` tokens of the model's own greedy answer under the
   instruction, ``xⱼ ← xⱼ yⱼ`` (``yⱼ`` ends after its first newline), read in both passes
   (teacher forcing), so the positions where the patched model writes its answer are
   calibration rows too. The paper fits the query tokens only; then every answer token
   after the first is generated at a position no row covered (measured: with k = 0 the
   multi-token arithmetic answers miss the target on both embedded models).
2. For ``l = 0 … L−1`` (``iterations`` sweeps), *non-contextual passes* over
   ``[BOS, p, xⱼ]`` with every patch fitted so far applied, stopped at layer ``l``:
   a. *matrix*: read the MLP inputs ``aᵢ`` (query tokens, plus the anchor positions of
      each sequence as rows whose target is their own unpatched input: for BOS that is
      also its contextual input, since position 0 sees only itself); residual
      ``δᵢ = Aᵢ − aᵢ − M aᵢ`` (``M``: the current input map, zero in the first sweep);
      ``M ← M + η · input_map(δ, a, λ)`` so ``Δ = W M`` is the least-squares thought
      matrix ``(Σ W δᵢ aᵢᵀ)(Σ aᵢaᵢᵀ + λI)⁻¹`` of each dense layer reading the MLP input
      (``W_in``; ``W_gate``, ``W_up``);
   b. *vector*: with that matrix applied, read the block outputs ``oᵢ``; residual
      ``ρᵢ = Oᵢ − oᵢ``; thought vector ``c ← c + η · mean ρᵢ`` (MLP-branch bias), or for a
      post-FFN RMSNorm the gain ``g ← g + η · argmin Σ‖ρᵢ − g⊙ŷᵢ‖²`` (see
      :mod:`icl_lens.core._least_squares` for why Gemma 3 uses the gain);
   c. *down* (kind ``"both+down"``, an icl_lens extension): what the vector leaves,
      ``rᵢ = ρᵢ − (fitted vector)ᵢ``, is fitted through the MLP's down projection:
      ``ΔW_out hᵢ ≈ rᵢ`` in least squares over the MLP hidden activations ``hᵢ``, with the
      anchor rows fitted to their unpatched block output. The paper's Gemma adaptation
      already absorbs the thought vector into ``W_down`` (a constant target); here the
      target is the per-token residual itself. Gain site: the target is mapped back
      through the post-FFN norm to first order, ``rᵢ · rms(yᵢ) / (1 + w + g)``.
   The patch is in place before layer ``l+1`` is measured, so later layers correct what
   earlier ones left over.

*Preserve penalty* (issue 22; MEMIT, Meng et al. 2023, arXiv 2210.07229): with
``preserve`` texts and ``preserve_strength = s > 0``, the unpatched model reads the
texts (a group of layers per pass, :mod:`icl_lens.thought._preserved_keys`, so the
covariances held stay small) and every fit gets the penalty of changing its output on
their keys: the
matrix fit ``w·Σ a₀a₀ᵀ`` over their MLP inputs, the down fit ``w·Σ h₀h₀ᵀ`` over their
hidden activations, the gain ``w·Σ ŷ₀⊙ŷ₀`` (diagonal), the bias ``s·n`` (a constant moves
every token alike), with ``w = s · tr(Σ xxᵀ)/tr(Σ k₀k₀ᵀ)`` of each fit's own rows
(:func:`icl_lens.core._least_squares.preserve_weight`). The keys are the unpatched
model's, as in MEMIT (not re-read after earlier layers are patched).

*Joint fit* (issue 22, composition; :func:`thought_patch_joint`): several tasks
``(I_k, queries_k)`` in one patch. Each task's queries are read after their own
instruction in the contextual pass (their targets ``Aᵢ``, ``Oᵢ``), the query-only passes
are the same for every task, and every fit above is the one least squares over all
tasks' rows stacked (anchors of every sequence included). The preserve penalty's weight
is taken against those stacked rows, as in a single fit. One task is the single fit.

``ridge`` is scale-free: each fit uses ``λ = ridge · tr(Σ xxᵀ)/d`` of its own inputs
(:func:`icl_lens.core._least_squares.relative_ridge`).

Exactness (the reduction test): one single-token calibration query, ``λ = 0``, ``η = 1``,
kind ``"both"``: ``M a = δ`` exactly (pseudo-inverse of one column = the token patch)
and the vector adds exactly ``ρ``, so every block output of the query equals its
contextual one and the logits match (BOS + one token: two rows, interpolated exactly).

What limits the paper's fit, measured (``reports/eval_thought.md``: the selection table
scores held-out *train* queries, the diagnosis follows the residual layer by layer):

- With ``n < d_model`` calibration tokens and ``λ = 0`` the matrix interpolates every
  calibration token at every layer, so the MLP input is right and all that remains is
  the *skip-connection* part of ``ρᵢ`` (the attention output with the instruction minus
  without it), which varies from token to token. A constant vector removes its mean
  only (on SmolLM2-135M the vector leaves 65–100% of ``‖ρ‖`` per layer), and the rest
  rides the residual stream to the unembedding: with the paper's settings SmolLM2 misses
  even its own calibration queries (KL to the full instruction ≈ 2 nats on capitals).
  On Gemma 3 the gain ``g ⊙ ŷᵢ`` varies per token and absorbs more of it. The down fit
  removes it on the calibration tokens (their KL ≈ 0), and the ridge sets how much of it
  carries over to new queries: this is the largest gain on both models.
- SmolLM2's secondary sink: in ``[BOS, xⱼ]`` the query's first token sits at position 1,
  where SmolLM2 builds a second attention sink (a block-output norm about 3× the same
  token's norm in context at layers 2–8). In context that position holds the
  instruction's first token. With the query prefix ``"\n"`` position 1 holds the newline
  at fit and at use, as after the instruction's last line, and the query's tokens are
  read as in context; with the down fit (ridge 0.5), dropping the prefix raises SmolLM2's
  mean held-out KL from about 0.18 to 0.30 nats. The anchor rows matter for the same reason: without them the
  matrix fit also rewrites BOS (whose residual shares a direction with the sink token's)
  and destroys the sink. The prefix alone, with the paper's kind, does not rescue
  SmolLM2: the skip residual above is the larger cause.
- Gemma 3's down fit needs the damping ``GAIN_DAMPING``: the post-FFN norm gain
  ``1 + w`` has coordinates near 0 (0.008 at layer 10, median 52), and dividing by it
  asks for pre-norm changes that move the RMS of every coordinate (undamped: held-out
  KL about 3 nats on capitals instead of 0.05).

Iterations: with ``η < 1`` each sweep refits what the last one left. With the bias site
(GPT-2, Llama) the error shrinks sweep by sweep. With the Gemma gain site it need not:
a coordinate where the calibration ``ŷ`` is near zero gets a large gain, and when an
earlier layer's refit moves ``ŷ`` the product moves a lot (seen on tiny-gemma3: logit
error 0.09 after one sweep at η = 0.5, 0.9 after three). Use ``η = 1``, one sweep there.

Cost: one contextual forward over the batch, plus ``2·iterations`` truncated
non-contextual forwards per layer over the short query batch; never one forward per
query per layer. With preserve texts, one truncated forward over them per group of
layers (a 2048-token read of SmolLM2's 64 shipped texts: 3 groups).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from icl_lens.core._least_squares import (
    factored_least_squares,
    gain_vector,
    input_map,
    mean_vector,
    preserve_weight,
    relative_residual,
    relative_ridge,
)
from icl_lens.core._norms import rms_normalize
from icl_lens.model._block_family import block_family, original, post_norm_eps
from icl_lens.model._prompts import PromptError, bos_id
from icl_lens.model._reading import NonFiniteActivationError
from icl_lens.model._types import patch_dtype
from icl_lens.model._weight_edits import edit_hooks
from icl_lens.thought._instruction_batches import calibration_ids, continuation_ids, query_batch, read_query_tokens, text_ids
from icl_lens.thought._defaults import (
    DEFAULT_ANSWER_TOKENS,
    DEFAULT_KIND,
    DEFAULT_PRESERVE_STRENGTH,
    DEFAULT_QUERY_PREFIX,
    DEFAULT_RIDGE,
    KIND_PARTS,
    KINDS,
)
from icl_lens.thought._preserved_keys import PreservedKeys
from icl_lens.thought._result import ThoughtPatch, thought_edits

if TYPE_CHECKING:
    from icl_lens.model._types import Model

# Gain site, down fit: the branch output is scale ⊙ ŷ, and a coordinate whose scale is near 0
# (Gemma 3 has such coordinates) cannot move by much without a large Δŷ that would change the
# RMS of every coordinate; the damping keeps Δŷ small there (relative to the mean scale²).
GAIN_DAMPING = 0.01


def _check(x: Tensor, what: str, layer: int) -> None:
    if not torch.isfinite(x).all():
        raise NonFiniteActivationError(f"non-finite {what} at layer {layer}")


def _validate(model, tasks, kind, eta, ridge, layers, iterations, query_prefix, answer_tokens):
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not (isinstance(eta, (int, float)) and math.isfinite(eta) and eta > 0):
        raise ValueError(f"eta must be a finite number > 0, got {eta!r}")
    if not (isinstance(ridge, (int, float)) and math.isfinite(ridge) and ridge >= 0):
        raise ValueError(f"ridge must be a finite number >= 0, got {ridge!r}")
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an integer >= 1, got {iterations!r}")
    if not isinstance(answer_tokens, int) or answer_tokens < 0:
        raise ValueError(f"answer_tokens must be an integer >= 0, got {answer_tokens!r}")
    if isinstance(tasks, str) or not tasks or not all(isinstance(t, (tuple, list)) and len(t) == 2 for t in tasks):
        raise PromptError("tasks must be a non-empty list of (instruction, queries) pairs")
    ids = [calibration_ids(model, instruction, queries, query_prefix) for instruction, queries in tasks]
    instr_ids, query_ids, pre_ids = [i for i, _, _ in ids], [q for _, q, _ in ids], ids[0][2]
    n_layers = model.cfg.n_layers
    if layers is None:
        chosen = list(range(n_layers))
    else:
        chosen = sorted({int(l) for l in layers})
        bad = [l for l in chosen if not 0 <= l < n_layers]
        if bad or not chosen:
            raise ValueError(f"layers must be a non-empty subset of 0..{n_layers - 1}, got {list(layers)}")
    return instr_ids, query_ids, pre_ids, chosen


def _post_norm_gain(model, layer: int, dtype) -> Tensor:
    """The post-FFN norm's effective per-coordinate gain (``1 + w`` for Gemma 3): its output for an all-ones input."""
    norm = original(model.blocks[layer].ln2_post)
    ones = torch.ones(model.cfg.d_model, dtype=next(norm.parameters()).dtype, device=model.cfg.device)
    with torch.no_grad():
        return (norm(ones) * math.sqrt(1.0 + post_norm_eps(model, layer))).to(dtype)


def thought_patch(
    model: Model,
    instruction: str,
    queries: Sequence[str],
    *,
    kind: str = DEFAULT_KIND,
    eta: float = 1.0,
    ridge: float = DEFAULT_RIDGE,
    layers: Sequence[int] | None = None,
    iterations: int = 1,
    query_prefix: str = DEFAULT_QUERY_PREFIX,
    answer_tokens: int = DEFAULT_ANSWER_TOKENS,
    preserve: Sequence[str] | None = None,
    preserve_strength: float = DEFAULT_PRESERVE_STRENGTH,
    batch_size: int = 16,
) -> ThoughtPatch:
    """Turn ``instruction`` into a weight edit fitted on the calibration ``queries`` (Algorithm 1).

    ``kind``: ``"vector"``, ``"matrix"``, ``"both"`` (the paper's thought matrix and
    vector) or ``"both+down"`` (plus the down-projection fit of what the vector leaves;
    the default). ``eta``: step size. ``ridge``: scale-free ``≥ 0`` (0 → minimum-norm
    pseudo-inverse). ``layers``: which layers to patch (default all). ``iterations``:
    sweeps over the layers. ``query_prefix``: text between BOS and the query in the
    query-only pass; the patched model must be prompted the same way
    (:meth:`ThoughtPatch.prompt_ids`). ``answer_tokens``: also fit at the first
    ``answer_tokens`` tokens of the model's own greedy answer under the instruction, read
    after the query (teacher forcing; each answer ends after its first newline), so the
    positions where the patched model writes its answer are calibration rows too.
    ``preserve``: texts the model must read as it did before the edit, whose keys at every
    layer enter each fit as the MEMIT-style penalty ``w · K₀K₀ᵀ``, weighted by the
    scale-free ``preserve_strength`` (0: off; see the module docstring). ``None`` (the
    default): the model's preserve texts, :func:`icl_lens.thought._preserve.preserve_texts`
    (its own samples from BOS and shipped few-shot prompts), as the evaluation uses them;
    ``()``: none (the paper's fit).
    """
    return _fit(model, [(instruction, queries)], method="fit", kind=kind, eta=eta, ridge=ridge, layers=layers,
                iterations=iterations, query_prefix=query_prefix, answer_tokens=answer_tokens, preserve=preserve,
                preserve_strength=preserve_strength, batch_size=batch_size)


def thought_patch_joint(model: Model, tasks: Sequence[tuple[str, Sequence[str]]], **settings) -> ThoughtPatch:
    """One thought patch fitted over the rows of several tasks at once (method ``"joint"``).

    ``tasks``: ``(instruction, calibration queries)`` pairs. Each task's queries are read
    after its own instruction in the contextual pass; the query-only pass is the same for
    all (``[BOS] + query_prefix + query``), and every fit of Algorithm 1 (input map,
    vector, down map) is the one least squares over all tasks' rows stacked, anchors
    included, with the preserve penalty weighted against those rows as in a single fit.
    ``settings``: those of :func:`thought_patch`. One task gives :func:`thought_patch`'s fit.
    """
    return _fit(model, list(tasks), method="joint", **settings)


def _fit(
    model: Model,
    tasks: Sequence[tuple[str, Sequence[str]]],
    *,
    method: str,
    kind: str = DEFAULT_KIND,
    eta: float = 1.0,
    ridge: float = DEFAULT_RIDGE,
    layers: Sequence[int] | None = None,
    iterations: int = 1,
    query_prefix: str = DEFAULT_QUERY_PREFIX,
    answer_tokens: int = DEFAULT_ANSWER_TOKENS,
    preserve: Sequence[str] | None = None,
    preserve_strength: float = DEFAULT_PRESERVE_STRENGTH,
    batch_size: int = 16,
) -> ThoughtPatch:
    """Algorithm 1 over the rows of every ``(instruction, queries)`` task, stacked (see :func:`thought_patch`)."""
    instr_ids, query_ids, pre_ids, chosen = _validate(model, tasks, kind, eta, ridge, layers, iterations,
                                                      query_prefix, answer_tokens)
    if answer_tokens:  # each task's own answers, under its own instruction
        query_ids = [[q + a for q, a in zip(qs, continuation_ids(model, instr, qs, answer_tokens,
                                                                  batch_size=batch_size))]
                     for instr, qs in zip(instr_ids, query_ids)]
    if isinstance(preserve, str):
        raise PromptError("preserve must be a list of strings, not one string")
    if preserve is None:
        from icl_lens.thought._preserve import preserve_texts

        preserve = preserve_texts(model) if preserve_strength else ()
    if not (isinstance(preserve_strength, (int, float)) and math.isfinite(preserve_strength) and preserve_strength >= 0):
        raise ValueError(f"preserve_strength must be a finite number >= 0, got {preserve_strength!r}")
    keep_ids = [text_ids(model, t, what=f"preserve text {i}") for i, t in enumerate(preserve)] if preserve_strength else []
    family = block_family(model)
    site = family.vector_site
    dtype = patch_dtype(model)
    cfg = model.cfg
    # Contextual rows: each task's queries after its own instruction, stacked task by task; the
    # query-only batch holds the same queries in the same order, so row i is one token in both.
    ctxs = [query_batch(model, qs, prefix=instr) for instr, qs in zip(instr_ids, query_ids)]
    plain = query_batch(model, [q for qs in query_ids for q in qs], prefix=pre_ids)
    n_layers = cfg.n_layers
    reads = {f"A{l}": family.mlp_input(l) for l in range(n_layers)}
    reads.update({f"O{l}": family.resid_post(l) for l in range(n_layers)})
    last = family.resid_post(n_layers - 1)
    gots = [read_query_tokens(model, ctx, reads, stop=last, batch_size=batch_size, dtype=dtype) for ctx in ctxs]
    A = [torch.cat([got[f"A{l}"] for got in gots]) for l in range(n_layers)]
    O = [torch.cat([got[f"O{l}"] for got in gots]) for l in range(n_layers)]
    del gots
    for layer in range(n_layers):
        _check(A[layer], "contextual MLP input", layer)
        _check(O[layer], "contextual block output", layer)
    # Rows whose target is their own unpatched state: the anchor positions before the query
    # (BOS, prefix; for BOS that is also its contextual state).
    anchor = bos_id(model) is not None or bool(pre_ids)
    A_keep, O_keep = [torch.zeros(0, cfg.d_model, dtype=dtype, device=cfg.device)] * n_layers, [None] * n_layers
    if anchor:
        got = read_query_tokens(model, plain, reads, stop=last, anchors=True, batch_size=batch_size, dtype=dtype)
        A_keep = [got[f"A{l}_anchor"] for l in range(n_layers)]
        O_keep = [got[f"O{l}_anchor"] for l in range(n_layers)]
    has_keep = anchor
    keys = PreservedKeys(model, family, keep_ids, chosen, KIND_PARTS[kind], dtype)

    d = cfg.d_model
    maps = torch.zeros(n_layers, d, d, dtype=dtype, device=cfg.device)
    vecs = torch.zeros(n_layers, d, dtype=dtype, device=cfg.device)
    m_res = torch.zeros(n_layers, dtype=torch.float64)
    v_res = torch.zeros(n_layers, dtype=torch.float64)
    d_res = torch.zeros(n_layers, dtype=torch.float64)
    parts = KIND_PARTS[kind]
    patched_maps: dict[int, Tensor] = {}
    patched_vecs: dict[int, Tensor] = {}
    downs: dict[int, list[tuple[Tensor, Tensor]]] = {}

    def current_hooks():
        joined = {l: (torch.cat([u for u, _ in f]), torch.cat([v for _, v in f])) for l, f in downs.items()}
        return edit_hooks(model, thought_edits(model, patched_maps, patched_vecs, site, joined), family)

    def read(names: dict[str, str], stop: str) -> dict[str, Tensor]:
        """Query rows under the current patch, and the anchor rows as ``key_keep``."""
        got = read_query_tokens(model, plain, names, hooks=current_hooks(), stop=stop, anchors=anchor,
                                batch_size=batch_size, dtype=dtype)
        out = {k: got[k] for k in names}
        if has_keep:
            out.update({f"{k}_keep": got[f"{k}_anchor"] for k in names})
        return out

    def penalty(name: str, layer: int, rows: Tensor):
        """The preserve penalty of one fit: ``w · K₀K₀ᵀ`` of the preserved keys (None without preserve texts)."""
        cov = keys.get(name, layer)
        return None if cov is None else preserve_weight(rows, cov, preserve_strength) * cov

    for _ in range(iterations):
        for layer in chosen:
            if "matrix" in parts:
                got = read({"a": family.mlp_input(layer)}, family.mlp_input(layer))
                a = got["a"]
                _check(a, "non-contextual MLP input", layer)
                target = A[layer] - a - a @ maps[layer].T
                rows_a, rows_t = a, target
                if has_keep:
                    a0 = got["a_keep"]
                    rows_a = torch.cat([a0, a])
                    rows_t = torch.cat([A_keep[layer] - a0 - a0 @ maps[layer].T, target])
                step = input_map(rows_t, rows_a, ridge=relative_ridge(rows_a, ridge), penalty=penalty("a", layer, rows_a))
                maps[layer] += eta * step
                m_res[layer] = relative_residual(A[layer] - a, a @ maps[layer].T)
                patched_maps[layer] = maps[layer]
            if "vector" not in parts and "down" not in parts:
                continue
            if "vector" in parts:
                patched_vecs[layer] = vecs[layer]
            names = {"o": family.resid_post(layer)}
            if "down" in parts:
                names["h"] = family.dense_out_input(layer)
            if site == "gain":
                names["y"] = family.post_norm_input(layer)
            got = read(names, names["o"])
            rho = O[layer] - got["o"]
            _check(rho, "non-contextual block output", layer)
            rho_keep = O_keep[layer] - got["o_keep"] if has_keep else None
            fitted = torch.zeros_like(rho)
            fitted_keep = torch.zeros_like(rho_keep) if has_keep else None
            if site == "gain":
                eps = post_norm_eps(model, layer)
                yhat = rms_normalize(got["y"], eps).to(dtype)
                yhat_keep = rms_normalize(got["y_keep"], eps).to(dtype) if has_keep else None
            if "vector" in parts:  # fitted on the query rows only
                if site == "gain":
                    step = gain_vector(rho, yhat, ridge=relative_ridge(yhat, ridge), penalty=penalty("y", layer, yhat))
                    fitted = eta * step * yhat
                    fitted_keep = eta * step * yhat_keep if has_keep else None
                else:
                    step = mean_vector(rho, penalty=preserve_strength * rho.shape[0] if keep_ids else 0.0)
                    fitted = (eta * step).expand_as(rho)
                    fitted_keep = (eta * step).expand_as(rho_keep) if has_keep else None
                vecs[layer] += eta * step
                v_res[layer] = relative_residual(rho, fitted)
            if "down" in parts:
                h, r = got["h"], rho - fitted
                if has_keep:
                    h, r = torch.cat([got["h_keep"], h]), torch.cat([rho_keep - fitted_keep, r])
                if site == "gain":  # through the post-FFN norm, to first order: Δy = rms(y) Δŷ
                    y = torch.cat([got["y_keep"], got["y"]]) if has_keep else got["y"]
                    rms = torch.sqrt((y * y).mean(-1, keepdim=True) + post_norm_eps(model, layer))
                    scale = _post_norm_gain(model, layer, dtype) + vecs[layer]
                    damp = GAIN_DAMPING * float((scale * scale).mean())
                    r = rms * r * scale / (scale * scale + damp)  # argmin ‖scale⊙Δŷ − r‖² + damp‖Δŷ‖²
                _check(r, "down-projection target", layer)
                u, v = factored_least_squares(r, h, ridge=relative_ridge(h, ridge), penalty=penalty("h", layer, h))
                downs.setdefault(layer, []).append((eta * u, v))
                d_res[layer] = relative_residual(r, (h @ v.T) @ (eta * u))
    if not (torch.isfinite(maps).all() and torch.isfinite(vecs).all()):
        raise NonFiniteActivationError("the fitted thought patch is not finite")
    rank = max((sum(u.shape[0] for u, _ in f) for f in downs.values()), default=0)
    down_u = torch.zeros(n_layers, rank, d, dtype=dtype, device=cfg.device)
    down_v = torch.zeros(n_layers, rank, cfg.d_mlp, dtype=dtype, device=cfg.device)
    for layer, f in downs.items():
        u, v = torch.cat([u for u, _ in f]), torch.cat([v for _, v in f])
        down_u[layer, : u.shape[0]], down_v[layer, : v.shape[0]] = u, v
    if not (torch.isfinite(down_u).all() and torch.isfinite(down_v).all()):
        raise NonFiniteActivationError("the fitted down-projection map is not finite")
    joint = {"instructions": [i for i, _ in tasks], "n_queries": [len(list(q)) for _, q in tasks]}
    return ThoughtPatch(
        model_name=cfg.model_name,
        family=family.name, vector_site=site, instruction=" + ".join(i for i, _ in tasks),
        queries=tuple(q for _, qs in tasks for q in qs),
        kind=kind, eta=float(eta), ridge=float(ridge), iterations=iterations, layers=tuple(chosen),
        query_prefix=query_prefix, maps=maps, vectors=vecs, down_u=down_u, down_v=down_v,
        matrix_residual=m_res, vector_residual=v_res, down_residual=d_res,
        n_tokens=plain.n_tokens, answer_tokens=answer_tokens, model=model, method=method,
        settings=joint if method == "joint" else {},
    )
