"""Steering vector baseline: the instruction as one residual-stream addition at one layer.

The activation-steering recipe that thought patches are compared with (Mazzawi, Dherin
et al. 2025, arXiv 2510.08734, derive the thought vector as a least-squares version of
it). For an instruction ``I``, calibration queries ``x₁…x_q`` and a layer ``l``:

    s_l = mean over every query token i of  ( resid_post_l([BOS, I, xⱼ])ᵢ − resid_post_l([BOS, p, xⱼ])ᵢ )

(``p``: the same query prefix as the thought patch, :mod:`icl_lens.thought._instruction_batches`).
Steering adds ``s_l`` to the output of block ``l`` at every position; that is the edit
``MLPEdit(bias=s_l)`` of layer ``l`` (the bias enters the residual stream after the MLP
branch, after the post-FFN norm where there is one), applied through the one edit
mechanism, :mod:`icl_lens.model._weight_edits`. Nothing is fitted layer by layer: every
``s_l`` comes from the two unpatched passes.

The layer is chosen on the calibration queries only: the one whose steered query-only
forward is closest to the full-instruction forward, by the mean next-token KL
``KL(full ‖ steered)`` at each query's last token (:attr:`SteeringVector.train_kl`,
:func:`icl_lens.thought._divergence.mean_kl`).
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.model._block_family import block_family
from icl_lens.model._greedy import last_logits
from icl_lens.model._types import patch_dtype
from icl_lens.model._weight_edits import MLPEdit, edits_applied
from icl_lens.thought._instruction_batches import calibration_ids, prefix_ids, query_batch, read_query_tokens, text_ids, with_bos
from icl_lens.thought._divergence import mean_kl


@dataclass(frozen=True, eq=False)
class SteeringVector:
    """Mean residual difference (with − without the instruction) after every block, and the chosen layer."""

    model_name: str
    instruction: str
    queries: tuple[str, ...]
    query_prefix: str
    vectors: Float[Tensor, "layer d_model"]
    train_kl: Float[Tensor, " layer"]  # mean KL(full ‖ steered at that layer) on the calibration queries
    layer: int
    model: object = field(repr=False, compare=False, default=None)

    def edits(self, layer: int | None = None) -> dict[int, MLPEdit]:
        """The steering edit: ``bias = s_l`` on block ``layer`` (default: the chosen one)."""
        layer = self.layer if layer is None else int(layer)
        if not 0 <= layer < self.vectors.shape[0]:
            raise IndexError(f"layer {layer} is outside the model (0..{self.vectors.shape[0] - 1})")
        return {layer: MLPEdit(bias=self.vectors[layer])}

    @contextmanager
    def applied(self, model=None, layer: int | None = None):
        """Run ``model`` (default: the one it was computed on) steered; hooks removed on exit."""
        model = model if model is not None else self.model
        if model is None:
            raise ValueError("this SteeringVector holds no model; pass the model it was computed on")
        with edits_applied(model, self.edits(layer)) as m:
            yield m

    def prompt_ids(self, query: str, model=None) -> list[int]:
        """``[BOS] + query_prefix + query``, as the vector was computed."""
        model = model if model is not None else self.model
        return with_bos(model, prefix_ids(model, self.query_prefix) + text_ids(model, query, what="query"))

    def to_frame(self) -> pd.DataFrame:
        """One row per layer: vector norm, calibration KL, chosen?"""
        norms = torch.linalg.vector_norm(self.vectors.double(), dim=-1)
        return pd.DataFrame([{"layer": l, "norm": float(norms[l]), "train_kl": float(self.train_kl[l]),
                              "chosen": l == self.layer} for l in range(self.vectors.shape[0])])


@torch.no_grad()
def steering_vector(model, instruction: str, queries: Sequence[str], *, query_prefix: str = "\n",
                    layers: Sequence[int] | None = None, batch_size: int = 16) -> SteeringVector:
    """Steering vectors of every layer from the calibration ``queries``; the layer chosen by calibration KL.

    ``layers``: candidate layers for the choice (default all).
    """
    instr, q_ids, pre = calibration_ids(model, instruction, queries, query_prefix)
    n_layers = model.cfg.n_layers
    candidates = list(range(n_layers)) if layers is None else sorted({int(l) for l in layers})
    if not candidates or not all(0 <= l < n_layers for l in candidates):
        raise ValueError(f"layers must be a non-empty subset of 0..{n_layers - 1}, got {layers}")
    family, dtype = block_family(model), patch_dtype(model)
    reads = {f"r{l}": family.resid_post(l) for l in range(n_layers)}
    last = family.resid_post(n_layers - 1)
    with_i = read_query_tokens(model, query_batch(model, q_ids, prefix=instr), reads, stop=last,
                               batch_size=batch_size, dtype=dtype)
    without = read_query_tokens(model, query_batch(model, q_ids, prefix=pre), reads, stop=last,
                                batch_size=batch_size, dtype=dtype)
    vectors = torch.stack([(with_i[f"r{l}"] - without[f"r{l}"]).mean(0) for l in range(n_layers)])
    full = last_logits(model, [with_bos(model, instr + q) for q in q_ids], batch_size=batch_size)
    plain = [with_bos(model, pre + q) for q in q_ids]
    train_kl = torch.full((n_layers,), float("nan"), dtype=torch.float64)
    for l in candidates:
        with edits_applied(model, {l: MLPEdit(bias=vectors[l])}):
            train_kl[l] = mean_kl(full, last_logits(model, plain, batch_size=batch_size))
    best = min(candidates, key=lambda l: float(train_kl[l]))
    return SteeringVector(model_name=model.cfg.model_name, instruction=instruction,
                          queries=tuple(queries), query_prefix=query_prefix, vectors=vectors, train_kl=train_kl,
                          layer=best, model=model)
