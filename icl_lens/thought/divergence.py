"""How far an edited query-only forward is from the full-instruction forward: next-token KL.

``KL(P ‖ Q) = Σ_v P(v) (log P(v) − log Q(v))`` between next-token distributions, with
``P`` the reference (the full-instruction model, or the unpatched model for locality)
and ``Q`` the edited one, averaged over rows (float64). Used to choose a steering
vector's layer, to score a fit's held-out calibration queries when the default settings
are chosen (``python -m icl_lens.evals.thought --select``), and by the locality measure.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.model.greedy import last_logits
from icl_lens.thought.batches import prefix_ids, text_ids, with_bos


def mean_kl(reference: Float[Tensor, "n vocab"], other: Float[Tensor, "n vocab"]) -> float:
    """Mean over rows of ``KL(softmax(reference) ‖ softmax(other))``."""
    if reference.shape != other.shape:
        raise ValueError(f"logit shapes differ: {tuple(reference.shape)} vs {tuple(other.shape)}")
    p, q = reference.double().log_softmax(-1), other.double().log_softmax(-1)
    return float((p.exp() * (p - q)).sum(-1).mean())


@torch.no_grad()
def last_token_kl(model, instruction: str, queries: Sequence[str], edit=None, *, query_prefix: str = "\n",
                  batch_size: int = 16) -> float:
    """Mean ``KL(full ‖ edited)`` at each query's last token: ``[BOS, I, x]`` vs ``[BOS, p, x]`` under ``edit``.

    ``edit``: anything with ``.applied(model)`` (a thought patch, a steering vector), or None.
    """
    instr = text_ids(model, instruction, what="instruction")
    q_ids = [text_ids(model, q, what=f"query {i}") for i, q in enumerate(queries)]
    pre = prefix_ids(model, query_prefix)
    full = last_logits(model, [with_bos(model, instr + q) for q in q_ids], batch_size=batch_size)
    with (nullcontext() if edit is None else edit.applied(model)):
        alone = last_logits(model, [with_bos(model, pre + q) for q in q_ids], batch_size=batch_size)
    return mean_kl(full, alone)
