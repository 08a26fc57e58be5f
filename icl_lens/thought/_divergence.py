"""How far an edited query-only forward is from the full-instruction forward: next-token KL.

``KL(P ‖ Q) = Σ_v P(v) (log P(v) − log Q(v))`` between next-token distributions, with
``P`` the reference (the full-instruction model, or the unpatched model for locality)
and ``Q`` the edited one, averaged over rows (float64). Used to choose a steering
vector's layer, to score a fit's held-out calibration queries when the default settings
are chosen (``python -m experiments.thought --select``), and by the locality measure
(:func:`text_kl`: unpatched against edited on texts unrelated to the task). A
:class:`KLReference` (:func:`answer_reference`, :func:`text_reference`) keeps the reference
side of either, so many edits are scored against it with their own forwards only.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.model._greedy import tail_logits
from icl_lens.thought._instruction_batches import continuation_ids, prefix_ids, text_ids, with_bos


def mean_kl(reference: Float[Tensor, "n vocab"], other: Float[Tensor, "n vocab"]) -> float:
    """Mean over rows of ``KL(softmax(reference) ‖ softmax(other))``."""
    if reference.shape != other.shape:
        raise ValueError(f"logit shapes differ: {tuple(reference.shape)} vs {tuple(other.shape)}")
    p, q = reference.double().log_softmax(-1), other.double().log_softmax(-1)
    return float((p.exp() * (p - q)).sum(-1).mean())


@dataclass(frozen=True, eq=False)
class KLReference:
    """The reference side of a next-token KL, computed once, so that many edits are scored against it with only
    their own forwards (distillation's checkpoints, :mod:`icl_lens.thought._distill`): ``kl(edit)`` is
    :func:`answer_kl` (from :func:`answer_reference`) or :func:`text_kl` (from :func:`text_reference`) for that
    edit, without recomputing the reference."""

    rows: tuple[tuple[int, ...], ...]  # what the edited side reads (BOS included)
    counts: tuple[int, ...]  # the scored positions: the last counts[i] of rows[i]
    logits: tuple[Float[Tensor, "count vocab"], ...]  # the reference's logits there, one per row
    batch_size: int
    model: object = field(repr=False)

    @torch.no_grad()
    def kl(self, edit=None) -> float:
        """Mean ``KL(reference ‖ edited)`` over the scored positions; ``edit``: anything with ``.applied(model)``,
        or None (the unedited model). ``batch_size`` rows at a time (a 262k vocabulary's logits add up)."""
        total, b = 0.0, self.batch_size
        with (nullcontext() if edit is None else edit.applied(self.model)):
            for i in range(0, len(self.rows), b):
                other = tail_logits(self.model, self.rows[i:i + b], self.counts[i:i + b], batch_size=b)
                total += sum(mean_kl(r, o) * len(r) for r, o in zip(self.logits[i:i + b], other))
        return total / sum(self.counts)


@torch.no_grad()
def answer_reference(model, instruction: str, queries: Sequence[str], *, query_prefix: str = "\n",
                     answer_tokens: int = 0, batch_size: int = 16) -> KLReference:
    """The full-instruction side of :func:`answer_kl` (its greedy answers and logits), computed once."""
    instr = text_ids(model, instruction, what="instruction")
    q_ids = [text_ids(model, q, what=f"query {i}") for i, q in enumerate(queries)]
    pre = prefix_ids(model, query_prefix)
    answers = continuation_ids(model, instr, q_ids, answer_tokens, batch_size=batch_size)
    read = [q + a[:-1] for q, a in zip(q_ids, answers)]
    counts = tuple(max(len(a), 1) for a in answers)
    full = tail_logits(model, [with_bos(model, instr + r) for r in read], counts, batch_size=batch_size)
    return KLReference(tuple(tuple(with_bos(model, pre + r)) for r in read), counts, tuple(full), batch_size, model)


def answer_kl(model, instruction: str, queries: Sequence[str], edit=None, *, query_prefix: str = "\n",
              answer_tokens: int = 0, batch_size: int = 16) -> float:
    """Mean ``KL(full ‖ edited)`` over the positions that predict each query's answer.

    ``[BOS, I, x, y]`` vs ``[BOS, p, x, y]`` under ``edit``, where ``y`` is the full
    model's own greedy answer (at most ``answer_tokens`` tokens, ending after its first
    newline; :func:`~icl_lens.thought._instruction_batches.continuation_ids`), read by both (teacher
    forcing). The positions are the query's last token and every answer token but the
    last, i.e. where ``y₁ … y_m`` are predicted; ``answer_tokens=0``: the last query token
    only. ``edit``: anything with ``.applied(model)`` (a thought patch, a steering
    vector), or None.
    """
    return answer_reference(model, instruction, queries, query_prefix=query_prefix, answer_tokens=answer_tokens,
                            batch_size=batch_size).kl(edit)


@torch.no_grad()
def text_reference(model, texts: Sequence[Sequence[int]]) -> KLReference:
    """The unedited side of :func:`text_kl` on ``texts`` (token ids, BOS included), computed once and kept: its
    logits at every position (``Σ len × vocab`` floats; :func:`text_kl` itself holds one text's at a time)."""
    if not texts:
        raise ValueError("text_kl needs at least one text")
    rows = tuple(tuple(ids) for ids in texts)
    counts = tuple(len(ids) for ids in rows)
    return KLReference(rows, counts, tuple(tail_logits(model, rows, counts, batch_size=1)), 1, model)


def text_kl(model, texts: Sequence[Sequence[int]], edit=None) -> float:
    """Mean next-token ``KL(unpatched ‖ edited)`` over every position of every text (token ids, BOS included),
    weighted by length; 0 for ``edit=None``. One text at a time (:func:`text_reference` keeps them all)."""
    if not texts:
        raise ValueError("text_kl needs at least one text")
    return sum(text_reference(model, [ids]).kl(edit) * len(ids) for ids in texts) / sum(len(ids) for ids in texts)
