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
   multi-token arithmetic answers miss the target on both embedded models). The contextual
   reads of ``[BOS, I, xⱼ yⱼ]`` are taken in the greedy run that writes ``yⱼ`` (the prompt in
   one pass, then one token a step over the key/value cache, and ``yⱼ``'s last token read once
   more: :func:`~icl_lens.thought._instruction_batches.continuations_read`), the same
   activations as a pass over the answered prompts up to rounding, without that pass.
2. For ``l = 0 … L−1`` (``iterations`` sweeps), *non-contextual reads* of
   ``[BOS, p, xⱼ]`` at layer ``l`` with every patch fitted so far applied (block ``l`` run
   on the residual the patched blocks before it left, kept from the last step):
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
texts (block by block beside the sweep, :mod:`icl_lens.thought._preserved_keys`, so
one layer's covariances are held) and every fit gets the penalty of changing its output on
their keys: the
matrix fit ``w·Σ a₀a₀ᵀ`` over their MLP inputs, the down fit ``w·Σ h₀h₀ᵀ`` over their
hidden activations, the gain ``w·Σ ŷ₀⊙ŷ₀`` (diagonal), the bias ``s·n`` (a constant moves
every token alike), with ``w = s · tr(Σ xxᵀ)/tr(Σ k₀k₀ᵀ)`` of each fit's own rows
(:func:`icl_lens.core._least_squares.preserve_weight`). The keys are the unpatched
model's, as in MEMIT (not re-read after earlier layers are patched).

*Null-space projection* (issue 38; AlphaEdit, Fang et al. 2025, arXiv 2410.02355;
:mod:`icl_lens.thought._null_space`): with ``null_space = ε``, the matrix fit reads the
rows ``P_a aᵢ`` and its step is ``M̃ P_a``, the down fit reads ``P_h hᵢ`` and its factors
are ``v P_h``, where ``P`` removes the top eigenvectors of the same preserved keys'
covariance (the smallest number holding ``1 − ε`` of its trace): the update does not act
on those keys. The penalty, if any, is then that of the projected keys, ``w · P K₀K₀ᵀ P``.

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

Cost (issue 41): one contextual forward over the batch (stopped after the last block),
plus, per sweep, the short query-only batch taken through the blocks once: block ``l``
runs from the residual entering it (kept from the step before, under the patch of the
layers before ``l`` as fitted) up to the MLP input for the matrix read, whole for the
vector and down read, and whole once more under its new patch to give block ``l+1`` its
residual: about three blocks per layer, ``O(L)``, where a forward from the embedding to
each read cost ``L(L+1)`` blocks a sweep (the test keeps that path as its reference; the
results agree to float rounding). With preserve texts, one unpatched pass over them per
sweep, one block per layer beside the fit. Never one forward per query per layer.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
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
from icl_lens.model._block_family import VectorSite, block_family, original, post_norm_eps
from icl_lens.model._prompts import PromptError, bos_id
from icl_lens.model._reading import NonFiniteActivationError
from icl_lens.model._types import patch_dtype
from icl_lens.thought._null_space import null_space_projector
from icl_lens.thought._instruction_batches import (batch_steps, calibration_ids, continuations_read, query_batch,
                                                   read_query_tokens, text_ids)
from icl_lens.thought._defaults import KIND_PARTS, ThoughtFit
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


def thought_patch(model: Model, instruction: str, queries: Sequence[str], fit: ThoughtFit | None = None,
                  **settings) -> ThoughtPatch:
    """Turn ``instruction`` into a weight edit fitted on the calibration ``queries`` (Algorithm 1).

    ``fit``: the settings (:class:`~icl_lens.thought.ThoughtFit`; default ``ThoughtFit()``, the
    documented default); ``settings``: any of its fields as keyword arguments, replacing those of
    ``fit`` (``kind``, ``eta``, ``ridge``, ``layers``, ``iterations``, ``query_prefix``,
    ``answer_tokens``, ``preserve``, ``preserve_strength``, ``batch_size``; their meaning is on
    :class:`~icl_lens.thought.ThoughtFit`). The patched model must be prompted as it was fitted
    (:meth:`ThoughtPatch.prompt_ids`); the result keeps its ``fit``.
    """
    return _fit(model, [(instruction, queries)], ThoughtFit.of(fit, **settings), method="fit")


def thought_patch_joint(model: Model, tasks: Sequence[tuple[str, Sequence[str]]], fit: ThoughtFit | None = None,
                        **settings) -> ThoughtPatch:
    """One thought patch fitted over the rows of several tasks at once (method ``"joint"``).

    ``tasks``: ``(instruction, calibration queries)`` pairs. Each task's queries are read
    after its own instruction in the contextual pass; the query-only pass is the same for
    all (``[BOS] + query_prefix + query``), and every fit of Algorithm 1 (input map,
    vector, down map) is the one least squares over all tasks' rows stacked, anchors
    included, with the preserve penalty weighted against those rows as in a single fit.
    ``fit``, ``settings``: those of :func:`thought_patch`. One task gives :func:`thought_patch`'s fit.
    """
    return _fit(model, list(tasks), ThoughtFit.of(fit, **settings), method="joint")


@dataclass
class _Calibration:
    """Step 1: the token ids a fit reads, checked: each task's instruction and queries (answer rows appended),
    the query prefix, the layers to patch, and the preserve texts; with answer rows, also the contextual reads
    of :func:`_target_reads` per task, taken while the answers were generated."""

    instructions: list[list[int]]
    queries: list[list[list[int]]]  # per task, per query
    prefix: list[int]
    layers: list[int]
    keep: list[list[int]]  # the preserve texts' ids (none without the penalty)
    contextual: list[dict[str, Tensor]] | None = None


def _target_reads(model, family) -> dict[str, str]:
    """The contextual reads the fit matches: every layer's MLP input ``A{l}`` and block output ``O{l}``."""
    reads = {f"A{l}": family.mlp_input(l) for l in range(model.cfg.n_layers)}
    reads.update({f"O{l}": family.resid_post(l) for l in range(model.cfg.n_layers)})
    return reads


def _calibration(model, tasks, fit: ThoughtFit, family, dtype) -> _Calibration:
    if isinstance(tasks, str) or not tasks or not all(isinstance(t, (tuple, list)) and len(t) == 2 for t in tasks):
        raise PromptError("tasks must be a non-empty list of (instruction, queries) pairs")
    ids = [calibration_ids(model, instruction, queries, fit.query_prefix) for instruction, queries in tasks]
    instr_ids, query_ids, pre_ids = [i for i, _, _ in ids], [q for _, q, _ in ids], ids[0][2]
    n_layers = model.cfg.n_layers
    chosen = list(range(n_layers)) if fit.layers is None else list(fit.layers)
    bad = [l for l in chosen if not 0 <= l < n_layers]
    if bad or not chosen:
        raise ValueError(f"layers must be a non-empty subset of 0..{n_layers - 1}, got {list(chosen)}")
    contextual = None
    if fit.answer_tokens:  # each task's own answers, under its own instruction, read as they are written
        runs = [continuations_read(model, instr, qs, fit.answer_tokens, _target_reads(model, family),
                                   batch_size=fit.batch_size, dtype=dtype) for instr, qs in zip(instr_ids, query_ids)]
        query_ids = [[q + a for q, a in zip(qs, answers)] for qs, (answers, _) in zip(query_ids, runs)]
        contextual = [got for _, got in runs]
    preserve = fit.preserve
    if preserve is None:
        from icl_lens.thought._preserve import preserve_texts

        preserve = preserve_texts(model) if fit.reads_preserve else ()
    keep = ([text_ids(model, t, what=f"preserve text {i}") for i, t in enumerate(preserve)]
            if fit.reads_preserve else [])
    return _Calibration(instr_ids, query_ids, pre_ids, chosen, keep, contextual)


@dataclass
class _Targets:
    """Step 2: the unpatched contextual reads the fit matches, per layer: MLP inputs ``A`` and block outputs ``O``
    of every query token (task by task), and of the anchor positions in the query-only pass (``A_keep``,
    ``O_keep``; absent without BOS and prefix)."""

    A: list[Tensor]
    O: list[Tensor]
    A_keep: list[Tensor]
    O_keep: list[Tensor | None]
    anchor: bool


def _targets(model, family, cal: _Calibration, plain, fit: ThoughtFit, dtype) -> _Targets:
    # Contextual rows: each task's queries after its own instruction, stacked task by task; the query-only batch
    # holds the same queries in the same order, so row i is one token in both.
    # (With answer rows they were read while the answers were generated: the same rows, no second pass.)
    n_layers, cfg = model.cfg.n_layers, model.cfg
    reads = _target_reads(model, family)
    last = family.resid_post(n_layers - 1)
    gots = cal.contextual or [read_query_tokens(model, query_batch(model, qs, prefix=instr), reads, stop=last,
                                                batch_size=fit.batch_size, dtype=dtype)
                              for instr, qs in zip(cal.instructions, cal.queries)]
    cal.contextual = None  # read once: A and O below hold these rows
    A = [torch.cat([got[f"A{l}"] for got in gots]) for l in range(n_layers)]
    O = [torch.cat([got[f"O{l}"] for got in gots]) for l in range(n_layers)]
    del gots
    for layer in range(n_layers):
        _check(A[layer], "contextual MLP input", layer)
        _check(O[layer], "contextual block output", layer)
    # Rows whose target is their own unpatched state: the anchor positions before the query
    # (BOS, prefix; for BOS that is also its contextual state).
    anchor = bos_id(model) is not None or bool(cal.prefix)
    A_keep, O_keep = [torch.zeros(0, cfg.d_model, dtype=dtype, device=cfg.device)] * n_layers, [None] * n_layers
    if anchor:
        got = read_query_tokens(model, plain, reads, stop=last, anchors=True, batch_size=fit.batch_size, dtype=dtype)
        A_keep = [got[f"A{l}_anchor"] for l in range(n_layers)]
        O_keep = [got[f"O{l}_anchor"] for l in range(n_layers)]
    return _Targets(A, O, A_keep, O_keep, anchor)


@dataclass
class _Fitter:
    """Step 3: the patch as it grows, layer by layer (input maps, vectors, down factors and their residuals), and
    the query-only reads under it."""

    model: object
    family: object
    plain: object  # the query-only batch
    targets: _Targets
    keys: PreservedKeys
    fit: ThoughtFit
    dtype: torch.dtype
    maps: Tensor = field(init=False)
    vecs: Tensor = field(init=False)
    patched_maps: dict = field(init=False, default_factory=dict)
    patched_vecs: dict = field(init=False, default_factory=dict)
    downs: dict = field(init=False, default_factory=dict)  # layer -> [(u, v), ...] of every sweep
    steps: list | None = field(init=False, default=None)  # the query-only batch at the block the sweep has reached
    _projectors: dict = field(init=False, default_factory=dict)  # (key side, layer) -> P, the current layer's

    def __post_init__(self) -> None:
        cfg, n = self.model.cfg, self.model.cfg.n_layers
        self.site = self.family.vector_site
        self.parts = KIND_PARTS[self.fit.kind]
        self.maps = torch.zeros(n, cfg.d_model, cfg.d_model, dtype=self.dtype, device=cfg.device)
        self.vecs = torch.zeros(n, cfg.d_model, dtype=self.dtype, device=cfg.device)
        self.residuals = {k: torch.zeros(n, dtype=torch.float64) for k in ("matrix", "vector", "down")}

    def edits(self):
        joined = {l: (torch.cat([u for u, _ in f]), torch.cat([v for _, v in f])) for l, f in self.downs.items()}
        return thought_edits(self.patched_maps, self.patched_vecs, self.site, joined)

    def read(self, names: dict[str, str], stop: str) -> dict[str, Tensor]:
        """Query rows under the current patch, and the anchor rows as ``key_keep``: the block the sweep has reached
        runs on the residual the patched blocks before it left (:meth:`sweep`)."""
        got = read_query_tokens(self.model, self.plain, names, edits=self.edits(), stop=stop,
                                anchors=self.targets.anchor, batch_size=self.fit.batch_size, dtype=self.dtype,
                                steps=self.steps)
        out = {k: got[k] for k in names}
        if self.targets.anchor:
            out.update({f"{k}_keep": got[f"{k}_anchor"] for k in names})
        return out

    def penalty(self, name: str, layer: int, rows: Tensor):
        """The preserve penalty of one fit: ``w · K₀K₀ᵀ`` of the preserved keys (None without preserve texts or
        strength); with the null-space projection ``P``, of the projected keys, ``w · P K₀K₀ᵀ P`` (``rows``: the
        projected rows)."""
        cov = self.keys.get(name, layer)
        if cov is None or not self.fit.preserve_strength:
            return None
        proj = self.projector(name, layer)
        if proj is not None:
            cov = proj @ cov @ proj
        return preserve_weight(rows, cov, self.fit.preserve_strength) * cov

    def projector(self, name: str, layer: int) -> Tensor | None:
        """The null-space projector of a key side (``"a"``, ``"h"``) at ``layer``, or None without ``null_space``
        (:mod:`icl_lens.thought._null_space`)."""
        if self.fit.null_space is None or name not in ("a", "h"):
            return None
        if (name, layer) not in self._projectors:  # one layer's projectors are held, like its covariances
            cov = self.keys.get(name, layer)
            self._projectors = {k: p for k, p in self._projectors.items() if k[1] == layer}
            self._projectors[(name, layer)] = None if cov is None else null_space_projector(
                cov, self.fit.null_space, always=self.keys.get(f"{name}_bos", layer))
        return self._projectors[(name, layer)]

    def projected(self, name: str, layer: int, rows: Tensor) -> Tensor:
        """``rows`` (keys) through the layer's null-space projector (themselves without one)."""
        proj = self.projector(name, layer)
        return rows if proj is None else rows @ proj

    def fit_matrix(self, layer: int) -> None:
        """(a) the input map ``M`` of the layer's dense layers that read the MLP input."""
        eta, ridge, t = self.fit.eta, self.fit.ridge, self.targets
        got = self.read({"a": self.family.mlp_input(layer)}, self.family.mlp_input(layer))
        a = got["a"]
        _check(a, "non-contextual MLP input", layer)
        target = t.A[layer] - a - a @ self.maps[layer].T
        rows_a, rows_t = a, target
        if t.anchor:
            a0 = got["a_keep"]
            rows_a = torch.cat([a0, a])
            rows_t = torch.cat([t.A_keep[layer] - a0 - a0 @ self.maps[layer].T, target])
        rows_a = self.projected("a", layer, rows_a)  # null space: Δ̃ fitted on P a, applied as Δ̃ P
        step = input_map(rows_t, rows_a, ridge=relative_ridge(rows_a, ridge), penalty=self.penalty("a", layer, rows_a))
        self.maps[layer] += eta * self.projected("a", layer, step)
        self.residuals["matrix"][layer] = relative_residual(t.A[layer] - a, a @ self.maps[layer].T)
        self.patched_maps[layer] = self.maps[layer]

    def fit_vector_and_down(self, layer: int) -> None:
        """(b) the vector at the family's site, then (c) the down projection's fit of what it leaves."""
        model, family, eta, ridge, t = self.model, self.family, self.fit.eta, self.fit.ridge, self.targets
        dtype, site, parts = self.dtype, self.site, self.parts
        if "vector" in parts:
            self.patched_vecs[layer] = self.vecs[layer]
        names = {"o": family.resid_post(layer)}
        if "down" in parts:
            names["h"] = family.dense_out_input(layer)
        if site is VectorSite.GAIN:
            names["y"] = family.post_norm_input(layer)
        got = self.read(names, names["o"])
        rho = t.O[layer] - got["o"]
        _check(rho, "non-contextual block output", layer)
        rho_keep = t.O_keep[layer] - got["o_keep"] if t.anchor else None
        fitted = torch.zeros_like(rho)
        fitted_keep = torch.zeros_like(rho_keep) if t.anchor else None
        if site is VectorSite.GAIN:
            eps = post_norm_eps(model, layer)
            yhat = rms_normalize(got["y"], eps).to(dtype)
            yhat_keep = rms_normalize(got["y_keep"], eps).to(dtype) if t.anchor else None
        if "vector" in parts:  # fitted on the query rows only
            if site is VectorSite.GAIN:
                step = gain_vector(rho, yhat, ridge=relative_ridge(yhat, ridge), penalty=self.penalty("y", layer, yhat))
                fitted = eta * step * yhat
                fitted_keep = eta * step * yhat_keep if t.anchor else None
            else:
                step = mean_vector(rho, penalty=self.fit.preserve_strength * rho.shape[0] if self.keys.keep_ids else 0.0)
                fitted = (eta * step).expand_as(rho)
                fitted_keep = (eta * step).expand_as(rho_keep) if t.anchor else None
            self.vecs[layer] += eta * step
            self.residuals["vector"][layer] = relative_residual(rho, fitted)
        if "down" in parts:
            h, r = got["h"], rho - fitted
            if t.anchor:
                h, r = torch.cat([got["h_keep"], h]), torch.cat([rho_keep - fitted_keep, r])
            if site is VectorSite.GAIN:  # through the post-FFN norm, to first order: Δy = rms(y) Δŷ
                y = torch.cat([got["y_keep"], got["y"]]) if t.anchor else got["y"]
                rms = torch.sqrt((y * y).mean(-1, keepdim=True) + post_norm_eps(model, layer))
                scale = _post_norm_gain(model, layer, dtype) + self.vecs[layer]
                damp = GAIN_DAMPING * float((scale * scale).mean())
                r = rms * r * scale / (scale * scale + damp)  # argmin ‖scale⊙Δŷ − r‖² + damp‖Δŷ‖²
            _check(r, "down-projection target", layer)
            h = self.projected("h", layer, h)
            u, v = factored_least_squares(r, h, ridge=relative_ridge(h, ridge), penalty=self.penalty("h", layer, h))
            v = self.projected("h", layer, v)
            self.downs.setdefault(layer, []).append((eta * u, v))
            self.residuals["down"][layer] = relative_residual(r, (h @ v.T) @ (eta * u))

    def sweep(self, layers: Sequence[int]) -> None:
        """One pass over ``layers`` (increasing): each layer's patch is in place before the next layer is measured.

        The query-only batch goes through the blocks once, from the embedding: each block runs on the residual
        the blocks before it left under the patch as it stands (its fit finished), is read (the matrix, then the
        vector and down fits), and runs once more under its own new patch to give the next block's residual. So
        a sweep costs about three blocks per layer, where a forward up to each layer for each read cost
        ``L(L+1)`` blocks in all."""
        if self.steps is None:
            self.steps = batch_steps(self.model, self.plain, self.fit.batch_size)
        else:
            for steps in self.steps:
                steps.restart()
        for layer in range(max(layers) + 1):
            if layer in layers:
                if "matrix" in self.parts:
                    self.fit_matrix(layer)
                if "vector" in self.parts or "down" in self.parts:
                    self.fit_vector_and_down(layer)
            if layer < max(layers):
                read_query_tokens(self.model, self.plain, {}, edits=self.edits(), batch_size=self.fit.batch_size,
                                  steps=self.steps, advance=True)


def _post_norm_gain(model, layer: int, dtype) -> Tensor:
    """The post-FFN norm's effective per-coordinate gain (``1 + w`` for Gemma 3): its output for an all-ones input."""
    norm = original(model.blocks[layer].ln2_post)
    ones = torch.ones(model.cfg.d_model, dtype=next(norm.parameters()).dtype, device=model.cfg.device)
    with torch.no_grad():
        return (norm(ones) * math.sqrt(1.0 + post_norm_eps(model, layer))).to(dtype)


def _patch(model, family, tasks, cal: _Calibration, fitter: _Fitter, plain, fit: ThoughtFit, method: str
           ) -> ThoughtPatch:
    """Step 4: the fitted parts as a :class:`ThoughtPatch` (down factors padded to one rank), checked finite."""
    cfg, n_layers, d, dtype = model.cfg, model.cfg.n_layers, model.cfg.d_model, fitter.dtype
    if not (torch.isfinite(fitter.maps).all() and torch.isfinite(fitter.vecs).all()):
        raise NonFiniteActivationError("the fitted thought patch is not finite")
    rank = max((sum(u.shape[0] for u, _ in f) for f in fitter.downs.values()), default=0)
    down_u = torch.zeros(n_layers, rank, d, dtype=dtype, device=cfg.device)
    down_v = torch.zeros(n_layers, rank, cfg.d_mlp, dtype=dtype, device=cfg.device)
    for layer, f in fitter.downs.items():
        u, v = torch.cat([u for u, _ in f]), torch.cat([v for _, v in f])
        down_u[layer, : u.shape[0]], down_v[layer, : v.shape[0]] = u, v
    if not (torch.isfinite(down_u).all() and torch.isfinite(down_v).all()):
        raise NonFiniteActivationError("the fitted down-projection map is not finite")
    joint = {"instructions": [i for i, _ in tasks], "n_queries": [len(list(q)) for _, q in tasks]}
    res = fitter.residuals
    return ThoughtPatch(
        model_name=cfg.model_name,
        family=family.name, vector_site=fitter.site, instruction=" + ".join(i for i, _ in tasks),
        queries=tuple(q for _, qs in tasks for q in qs),
        kind=fit.kind, eta=fit.eta, ridge=fit.ridge, iterations=fit.iterations, layers=tuple(cal.layers),
        query_prefix=fit.query_prefix, maps=fitter.maps, vectors=fitter.vecs, down_u=down_u, down_v=down_v,
        matrix_residual=res["matrix"], vector_residual=res["vector"], down_residual=res["down"],
        n_tokens=plain.n_tokens, answer_tokens=fit.answer_tokens, model=model, method=method,
        settings=joint if method == "joint" else {}, fit=fit,
    )


def _fit(model: Model, tasks: Sequence[tuple[str, Sequence[str]]], fit: ThoughtFit, *, method: str) -> ThoughtPatch:
    """Algorithm 1 over the rows of every ``(instruction, queries)`` task, stacked (see :func:`thought_patch`):
    the calibration ids, the contextual targets, the layer sweeps, the patch."""
    family, dtype = block_family(model), patch_dtype(model)
    cal = _calibration(model, tasks, fit, family, dtype)
    plain = query_batch(model, [q for qs in cal.queries for q in qs], prefix=cal.prefix)
    targets = _targets(model, family, cal, plain, fit, dtype)
    keys = PreservedKeys(model, family, cal.keep, cal.layers, KIND_PARTS[fit.kind], dtype,
                         bos=fit.null_space is not None)
    fitter = _Fitter(model, family, plain, targets, keys, fit, dtype)
    for _ in range(fit.iterations):
        fitter.sweep(cal.layers)
    return _patch(model, family, tasks, cal, fitter, plain, fit, method)
