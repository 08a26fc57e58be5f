"""How far an edited query-only forward is from the full-instruction forward: next-token KL.

``KL(P ‖ Q) = Σ_v P(v) (log P(v) − log Q(v))`` between next-token distributions, with
``P`` the reference (the full-instruction model, or the unpatched model for locality)
and ``Q`` the edited one, averaged over rows (float64). Used to choose a steering
vector's layer, to score a fit's held-out calibration queries when the default settings
are chosen (``python -m experiments.thought --select``), and by the locality measure
(:func:`text_kl`: unpatched against edited on texts unrelated to the task).
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

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


@torch.no_grad()
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
    instr = text_ids(model, instruction, what="instruction")
    q_ids = [text_ids(model, q, what=f"query {i}") for i, q in enumerate(queries)]
    pre = prefix_ids(model, query_prefix)
    answers = continuation_ids(model, instr, q_ids, answer_tokens, batch_size=batch_size)
    read = [q + a[:-1] for q, a in zip(q_ids, answers)]
    counts = [max(len(a), 1) for a in answers]
    full = tail_logits(model, [with_bos(model, instr + r) for r in read], counts, batch_size=batch_size)
    with (nullcontext() if edit is None else edit.applied(model)):
        alone = tail_logits(model, [with_bos(model, pre + r) for r in read], counts, batch_size=batch_size)
    return mean_kl(torch.cat(full), torch.cat(alone))


@torch.no_grad()
def text_kl(model, texts: Sequence[Sequence[int]], edit=None) -> float:
    """Mean next-token ``KL(unpatched ‖ edited)`` over every position of every text (token ids, BOS included),
    weighted by length; 0 for ``edit=None``."""
    if not texts:
        raise ValueError("text_kl needs at least one text")
    total, positions = 0.0, 0
    for ids in texts:
        x = torch.tensor([list(ids)], device=model.cfg.device)
        ref = model(x)[0]
        with (nullcontext() if edit is None else edit.applied(model)):
            new = model(x)[0]
        total += mean_kl(ref, new) * len(ids)
        positions += len(ids)
    return total / positions
