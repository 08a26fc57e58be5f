"""The public token patches, their reference method, and the equivalence check (docs/design.md §2).

A token patch of layer ``l`` and query ``t`` (Dherin et al. 2025, arXiv 2507.16003) is

    u_in = W_in (A − a),  u_gate = W_gate (A − a),  v = a/‖a‖²,  correction = attn_C − attn_0

with ``A`` the MLP input of the contextual pass and ``a`` the one of the kept-only pass
(BOS + query by default). The patch set keeps ``δ = A − a`` and forms ``u`` from the
model's dense weights when asked (:mod:`icl_lens.patches._patch_set`). :func:`token_patches` computes every layer and position from
one contextual forward (:mod:`icl_lens.patches._capture`, batched by
:mod:`icl_lens.patches._batches`; a long prompt in forwards of ``query_chunk`` queries over the cached keys and
values of the positions before them, docs/design.md §2); :func:`token_patches_naive` recomputes them with one
kept-only forward per query and layer. :func:`verify_equivalence` checks the identity
that makes them exact: the kept-only forward with every patch applied
(:mod:`icl_lens.patches._kept_only`) gives the contextual logits at ``t``.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, overload

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from icl_lens.core._kept_attention import removes_nothing
from icl_lens.patches._patch_set import TokenPatches
from icl_lens.core._token_patch import input_pseudo_inverse
from icl_lens.patches._batches import QUERY_CHUNK, batched_token_patches, is_prompt_list
from icl_lens.patches._capture import run_in_query_chunks
from icl_lens.model._block_family import block_family
from icl_lens.patches._kept_only import kept_only_logits, kept_only_masks, patches_applied
from icl_lens.model._greedy import unembedded
from icl_lens.model._prompts import encode_prompt
from icl_lens.model._reading import activations_captured

if TYPE_CHECKING:
    from icl_lens.model._types import Model

Prompt = str | Sequence[int] | Int[Tensor, " pos"]
"""One prompt: text, or its token ids (a list or a 1-D tensor)."""


@overload
def token_patches(model: Model, prompt: Prompt, *, remove: Iterable[int] | slice | None = None,  # type: ignore[overload-overlap]
                  keep_bos: bool = True, batch_size: int = 16, progress: bool = False,
                  layers: Iterable[int] | None = None, query_chunk: int | None = QUERY_CHUNK) -> TokenPatches: ...


@overload
def token_patches(model: Model, prompt: Sequence[Prompt], *, remove: Iterable[int] | slice | None = None,
                  keep_bos: bool = True, batch_size: int = 16, progress: bool = False,
                  layers: Iterable[int] | None = None, query_chunk: int | None = QUERY_CHUNK) -> list[TokenPatches]: ...


def token_patches(
    model: Model,
    prompt: Prompt | Sequence[Prompt],
    *,
    remove: Iterable[int] | slice | None = None,
    keep_bos: bool = True,
    batch_size: int = 16,
    progress: bool = False,
    layers: Iterable[int] | None = None,
    query_chunk: int | None = QUERY_CHUNK,
) -> TokenPatches | list[TokenPatches]:
    """Token patches (docs/design.md §2) of every layer and position of ``prompt``, from one forward.

    ``prompt``: text, token ids, or a list of those; a list gives a list of
    :class:`TokenPatches`, one per prompt, computed in right-padded batches of
    ``batch_size`` (each row with its own kept sets and position ids, padded keys masked;
    every row equals its single-prompt result up to rounding). ``remove``: context
    positions that count as removed for every query (default: all earlier positions
    except a leading BOS). ``keep_bos``: keep the first token when it is the tokenizer's
    BOS (attention sink), so the context-free input stays in distribution. ``layers``:
    only these layers (negative indices as Python's; default all); the result holds them in
    increasing order with their true indices (``TokenPatches.layers``), and the forward
    stops after the last one. ``query_chunk``: a prompt longer than this (in a batch of its own, nothing
    removed) runs in forwards of ``query_chunk`` queries over the cached keys and values of the positions
    before them: the same patches up to rounding, with attention scores of ``query_chunk × n`` per forward
    instead of ``n × n`` (less memory and, past the chunk, less attention arithmetic: the causal triangle
    only); ``None`` runs one forward.
    """
    if is_prompt_list(prompt):
        return batched_token_patches(model, prompt, remove=remove, keep_bos=keep_bos, batch_size=batch_size,
                                     progress=progress, layers=layers, query_chunk=query_chunk)
    return batched_token_patches(model, [prompt], remove=remove, keep_bos=keep_bos, batch_size=1, layers=layers,
                                 query_chunk=query_chunk)[0]


@torch.no_grad()
def token_patches_naive(model: Model, prompt: Prompt, *, keep_bos: bool = True) -> TokenPatches:
    """Reference method: the same patches as :func:`token_patches`, one kept-only forward per query and layer.

    For query ``t`` and layer ``l``: run the kept tokens alone (original position ids) with
    every earlier layer's patch of ``t`` applied, stopped after layer ``l``, and read ``a``
    and ``attn_0`` there; ``A`` and ``attn_C`` come from the contextual pass. Costs about
    ``n · L`` forwards; kept as an independent check of the one-pass method (tests and
    benchmarks), not for use.
    """
    fast = token_patches(model, prompt, keep_bos=keep_bos)  # kept sets and shapes; every factor is recomputed
    family = block_family(model)
    ids = fast.token_ids.to(model.cfg.device)
    acc = replace(fast, **{k: torch.zeros_like(getattr(fast, k)) for k in ("delta", "v", "correction")})
    names = {family.mlp_input(l) for l in range(model.cfg.n_layers)}
    names |= {family.attn_out(l) for l in range(model.cfg.n_layers)}
    _, cache = model.run_with_cache(ids[None], names_filter=lambda h: h in names)
    dtype = acc.v.dtype
    for t in range(ids.numel()):
        if bool(removes_nothing(fast.kept[t: t + 1], offset=t)[0]):
            continue  # nothing removed: the patch is zero by definition
        pos = torch.tensor([fast.kept_positions(t)], device=ids.device)
        for layer in range(model.cfg.n_layers):
            reads = [family.mlp_input(layer), family.attn_out(layer)]
            with patches_applied(model, acc, pos), activations_captured(model, reads) as got:
                model(ids[pos], position_ids=pos, attention_mask=kept_only_masks(model, pos), stop_at_layer=layer + 1)
            A = cache[family.mlp_input(layer)][0, t].to(dtype)
            a = got[family.mlp_input(layer)][0, -1].to(dtype)
            acc.delta[layer, t] = A - a
            acc.v[layer, t] = input_pseudo_inverse(a)[0]
            attn_c = cache[family.attn_out(layer)][0, t]
            acc.correction[layer, t] = (attn_c - got[family.attn_out(layer)][0, -1]).to(dtype)
    return replace(acc)  # a fresh norm cache: the one of ``acc`` may predate the in-place writes


@dataclass(frozen=True, eq=False)
class EquivalenceReport:
    """Per position: max |logit difference| between patched kept-only and contextual forwards."""

    tokens: tuple[str, ...]
    max_abs_err: Float[Tensor, " pos"]
    max_abs_logit: float

    @property
    def relative_error(self) -> float:
        """Worst position's error divided by the largest contextual |logit|."""
        return float(self.max_abs_err.max()) / self.max_abs_logit

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"position": range(len(self.tokens)), "token": self.tokens,
                             "max_abs_err": self.max_abs_err.double().cpu().numpy(),
                             "relative_err": (self.max_abs_err.double().cpu() / self.max_abs_logit).numpy()})


def verify_equivalence(model: Model, prompt: Prompt, patches: TokenPatches | None = None, *,
                       batch_size: int = 16, chunk_size: int = 128) -> EquivalenceReport:
    """Run the identity of docs/design.md §2 for every position of ``prompt`` (needs every layer and position).

    The contextual forward stops before the unembedding (its final hidden state is read; a prompt
    longer than ``QUERY_CHUNK`` in forwards of that many queries over a key/value cache, as
    :func:`token_patches` runs it); positions are then unembedded and compared ``chunk_size`` at a
    time, so the full-vocabulary logits of at most ``chunk_size`` positions per side are held at
    once (for Gemma 3's 262k vocabulary, 4,096 positions of float32 logits would take 4.3 GB). The
    report does not depend on ``chunk_size``.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    ids = encode_prompt(model, prompt)
    if patches is None:
        patches = token_patches(model, ids)
    if len(patches.tokens) != ids.numel() or not torch.equal(patches.token_ids, ids.cpu()):
        raise ValueError("patches were computed for a different prompt")
    if patches.layers != tuple(range(model.cfg.n_layers)) or not patches.complete:
        raise ValueError("the equivalence check needs the patches of every layer and position; these hold "
                         f"{patches.n_layers} of {model.cfg.n_layers} layers and {len(patches)} of "
                         f"{ids.numel()} positions (compute them without layers= and select())")
    hidden = _final_hidden(model, ids)
    errs, max_abs_logit = [], 0.0
    for start in range(0, ids.numel(), chunk_size):
        queries = list(range(start, min(start + chunk_size, ids.numel())))
        contextual = unembedded(model, hidden[queries])
        kept = kept_only_logits(model, ids, patches, queries, batch_size=batch_size)
        errs.append((kept - contextual).abs().amax(-1).cpu())
        max_abs_logit = max(max_abs_logit, float(contextual.abs().max()))
        del contextual, kept
    return EquivalenceReport(tokens=patches.tokens, max_abs_err=torch.cat(errs), max_abs_logit=max_abs_logit)


def _final_hidden(model: Model, ids: Int[Tensor, " pos"]) -> Float[Tensor, "pos d_model"]:
    """The contextual forward's input to the unembedding, every position; the unembedding never runs. A prompt
    longer than ``QUERY_CHUNK`` runs in forwards of that many queries over a key/value cache, as ``token_patches``
    runs it (:func:`~icl_lens.patches._capture.run_in_query_chunks`): attention scores of ``QUERY_CHUNK × n``, not
    ``n × n``, which :func:`~icl_lens.patches._memory.estimate_patches_memory` counts."""
    rows = []

    def reads(p: int, e: int):
        return [("unembed.hook_in", lambda x, hook: rows.append(x[0].detach()))], "unembed.hook_in"
    run_in_query_chunks(model, ids[None], QUERY_CHUNK, reads)
    return torch.cat(rows)


@torch.no_grad()
def noise_floor(model: Model, reference: Model, prompt: Prompt, *, chunk_size: int = 128) -> float:
    """Max |logit difference| between ``model`` (half precision) and ``reference`` (float32) on ``prompt``.

    Half-precision exactness is measured against this floor: the patched kept-only
    forward must stay within twice the half model's own distance from float32. Positions
    are unembedded ``chunk_size`` at a time, as in :func:`verify_equivalence`.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    ids = encode_prompt(model, prompt)
    half = _final_hidden(model, ids)
    full = _final_hidden(reference, ids.to(reference.cfg.device))
    floor = 0.0
    for start in range(0, ids.numel(), chunk_size):
        rows = slice(start, start + chunk_size)
        diff = (unembedded(model, half[rows], as_forward=True).float()
                - unembedded(reference, full[rows], as_forward=True).float().to(half.device))
        floor = max(floor, float(diff.abs().max()))
    return floor
