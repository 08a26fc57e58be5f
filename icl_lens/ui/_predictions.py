"""Top-k next-token predictions at the selected query, with and without its context.

With context: the contextual forward, ``softmax(logits(x_1..x_t))``. Without context: the
kept-only forward (BOS + query at its original position, docs/design.md §2) with no patch,
``softmax(logits(x_keep))``. The kept-only forward with every token patch applied gives the
contextual logits again (the identity of Dherin et al. 2025, arXiv 2507.16003); the panel
shows that forward's largest logit difference from the contextual one as a check. Both
forwards are the library's (:func:`icl_lens.model._greedy.last_logits`,
:func:`icl_lens.patches._kept_only.kept_only_logits_many`); the patch parts are dropped with
``TokenPatches.keep_parts``. The dashboard runs neither: its contextual logits are the PatchSession's
own pass, and its kept-only ones the trajectory's step-0 copy (``trajectory(..., readout=True)``, the
same forward for one more row), both through the unembedding at once
(:meth:`~icl_lens.patches._incremental.PatchSession.logits_with`). It draws the predictions with the
trajectory's first drawing and runs the check after the refined trajectory (:func:`identity_error`):
it is a forward with every patch applied, more than the predictions themselves cost (issue 41).
"""
from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, replace

import ipywidgets as W
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from icl_lens.patches._patch_set import TokenPatches
from icl_lens.spikes._generation import predictive_stats
from icl_lens.model._greedy import last_logits
from icl_lens.patches._kept_only import kept_only_logits_many
from icl_lens.model._prompts import str_tokens
from icl_lens.ui._panels import token_label

DEFAULT_TOP_K = 8
SIDES = ("with context", "without context")


@dataclass(frozen=True, eq=False)
class NextTokenPredictions:
    """The ``k`` most likely next tokens after ``query``, with context and with the kept tokens only."""

    query: int
    query_token: str
    kept_positions: tuple[int, ...]
    token_ids: dict[str, Int[Tensor, " k"]]  # by side ("with context", "without context")
    tokens: dict[str, tuple[str, ...]]
    probabilities: dict[str, Float[Tensor, " k"]]
    patched_error: float | None  # max |kept-only forward with patches − contextual forward| (None: not checked yet)

    def to_frame(self) -> pd.DataFrame:
        rows = [{"query": self.query, "context": side, "rank": r + 1, "token_id": int(i), "token": t,
                 "probability": float(p)}
                for side in SIDES
                for r, (i, t, p) in enumerate(zip(self.token_ids[side], self.tokens[side], self.probabilities[side]))]
        return pd.DataFrame(rows)


@torch.no_grad()
def next_token_predictions(model, ids: Int[Tensor, " pos"], patches: TokenPatches, query: int,
                           k: int = DEFAULT_TOP_K, contextual: Float[Tensor, " vocab"] | None = None,
                           check: bool = True, unpatched: Float[Tensor, " vocab"] | None = None) -> NextTokenPredictions:
    """Top-``k`` next tokens at ``query`` from the contextual and the unpatched kept-only forwards.

    ``contextual``: the contextual logits at ``query`` when the caller has them (the dashboard's
    :meth:`~icl_lens.patches._incremental.PatchSession.logits_at`); else a forward over ``ids[: query + 1]``.
    ``unpatched``: the unpatched kept-only logits when the caller has them (the dashboard's, from the
    trajectory's step-0 copy, :attr:`~icl_lens.dynamics._trajectory.Trajectory.kept_only_hidden`); else that
    forward runs here. ``check``: also run the kept-only forward with every patch (``patched_error``; False:
    None, for :func:`identity_error` later)."""
    n = int(ids.numel())
    if not 0 <= query < n:
        raise ValueError(f"query {query} is outside the prompt's {n} positions")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if contextual is None:
        contextual = last_logits(model, [ids[: query + 1].tolist()])[0]
    rows = [] if unpatched is not None else [(ids, patches.keep_parts(w_in=False, correction=False), query)]
    rows += [(ids, patches, query)] if check else []
    kept = list(kept_only_logits_many(model, rows)) if rows else []
    if unpatched is None:
        unpatched = kept.pop(0)
    found = {}
    for side, logits in zip(SIDES, (contextual, unpatched)):
        logp, _ = predictive_stats(logits)
        top = torch.topk(logp, min(k, logp.numel()))
        found[side] = (top.indices.cpu(), top.values.exp().cpu())
    return NextTokenPredictions(
        query=query, query_token=patches.tokens[query], kept_positions=tuple(patches.kept_positions(query)),
        token_ids={s: found[s][0] for s in SIDES},
        tokens={s: str_tokens(model, found[s][0]) for s in SIDES},
        probabilities={s: found[s][1] for s in SIDES},
        patched_error=_error(kept[0], contextual) if check else None)


def _error(patched: Tensor, contextual: Tensor) -> float:
    return float((patched.double() - contextual.double()).abs().max())


@torch.no_grad()
def identity_error(model, ids: Int[Tensor, " pos"], patches: TokenPatches, query: int,
                   contextual: Float[Tensor, " vocab"]) -> float:
    """max |kept-only forward with every patch − ``contextual``| at ``query``: the check
    :func:`next_token_predictions` runs with ``check=True``, run on its own."""
    return _error(kept_only_logits_many(model, [(ids, patches, query)])[0], contextual)


def predictions_html(pred: NextTokenPredictions | None, label=token_label, prompt: str = "") -> str:
    """Two tables side by side (with / without context), a bar per probability; static HTML.
    ``prompt``: the prompt's name in compare mode ("A")."""
    if pred is None:
        return ""
    whose = f"prompt {prompt}: " if prompt else ""
    kept = ", ".join(str(p) for p in pred.kept_positions)
    tables = []
    for side, note in zip(SIDES, ("contextual forward", f"kept-only forward, positions {kept}, no patch")):
        rows = "".join(
            f"<tr><td class='icl-pred-token' style='padding:0 6px 0 0;font-family:monospace;white-space:pre'>{html.escape(label(t))}</td>"
            f"<td class='icl-pred-p'>{float(p):.3f}</td>"
            f"<td style='width:90px'><div style='background:#1f77b4;height:9px;width:{90 * float(p):.0f}px'></div></td></tr>"
            for t, p in zip(pred.tokens[side], pred.probabilities[side]))
        tables.append(f"<div class='icl-pred-side' data-side='{side}' style='flex:1 1 260px;min-width:0'>"
                      f"<b>{side}</b> <small>({html.escape(note)})</small>"
                      f"<table style='border-collapse:collapse;font-size:12px;line-height:1.25'>{rows}</table></div>")
    return (f"<div class='icl-predictions' data-query='{pred.query}'>"
            f"<b>{whose}next token after position {pred.query} ({html.escape(label(pred.query_token))!s})</b> "
            f"<small class='icl-pred-check'>· kept-only forward with every patch: "
            + ("checking…" if pred.patched_error is None else
               f"max |Δlogit| = {pred.patched_error:.2g} from the contextual one") + "</small>"
            f"<div style='display:flex;flex-wrap:wrap;gap:12px'>{''.join(tables)}</div></div>")


class PredictionsPanel:
    """Shows :class:`NextTokenPredictions` (computed by the dashboard's worker); ``k`` is its control."""

    def __init__(self, k: int = DEFAULT_TOP_K):
        self.k = W.BoundedIntText(value=k, min=1, max=50, description="top-k", layout=W.Layout(width="140px"))
        self.html = W.HTML()  # stretches to the dashboard's width (100% plus a margin would stick out)
        self.widget = self.html
        self._cache: dict = {}

    def compute(self, model, ids, patches: TokenPatches, query: int, k: int,
                logits: Callable[[], tuple[Tensor, Tensor | None]] | None = None) -> tuple[NextTokenPredictions, bool]:
        """Cached by model, token ids, query and k (``(result, fresh)``); ``logits()``, called on a miss only,
        gives the contextual logits at ``query`` and the unpatched kept-only ones or None (see
        :func:`next_token_predictions`). Unchecked (``patched_error`` None) until :meth:`check`."""
        hit = self.cached(model, ids, query, k)
        if hit is not None:
            return hit, False
        contextual, unpatched = (None, None) if logits is None else logits()
        result = next_token_predictions(model, ids, patches, query, k, contextual, check=False, unpatched=unpatched)
        self._remember(self._key(model, ids, query, k), result)
        return result, True

    def cached(self, model, ids, query: int, k: int) -> NextTokenPredictions | None:
        """The predictions of :meth:`compute` for these arguments if it holds them, else None."""
        return self._cache.get(self._key(model, ids, query, k))

    def check(self, model, ids, patches: TokenPatches, pred: NextTokenPredictions, k: int,
              contextual: Callable[[], Tensor]) -> tuple[NextTokenPredictions, bool]:
        """``pred`` with its :func:`identity_error` (``(result, fresh)``; cached with the predictions)."""
        if pred.patched_error is not None:
            return pred, False
        result = replace(pred, patched_error=identity_error(model, ids, patches, pred.query, contextual()))
        self._remember(self._key(model, ids, pred.query, k), result)
        return result, True

    @staticmethod
    def _key(model, ids, query: int, k: int) -> tuple:
        return id(model), tuple(ids.tolist()), query, k

    def _remember(self, key, result: NextTokenPredictions) -> None:
        self._cache = {key: result, **dict([kv for kv in self._cache.items() if kv[0] != key][:7])}

    def show(self, pred: NextTokenPredictions | None, prompt: str = "") -> None:
        self.html.value = predictions_html(pred, token_label, prompt)
