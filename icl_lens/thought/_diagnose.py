"""Where an edited query-only forward departs from the full-instruction forward, layer by layer.

For queries ``xⱼ`` read as ``[BOS, I, xⱼ]`` (contextual) and as ``[BOS, p, xⱼ]`` under an
edit (a thought patch; None for the unpatched model), per layer ``l``:

- ``divergence``: the mean over queries of ``‖o_l − O_l‖ / ‖O_l‖`` at the query's last
  token (``o``/``O``: block outputs without/with the instruction);
- ``attn_bos``, ``attn_pos1``, ``attn_qfirst``: the attention (mean over heads and
  queries) that the last query token pays to BOS, to position 1 (the prefix's first
  token, or the query's first token when there is no prefix) and to the query's first
  token, in the query-only pass; ``norm_pos1``, ``norm_qfirst``: the block-output norms
  at those positions;
- ``attn_bos_context``, ``attn_qfirst_context``, ``norm_qfirst_context``: the same in
  ``[BOS, I, xⱼ]``, where the query's first token sits after the instruction.

SmolLM2's secondary attention sink shows as ``norm_pos1 ≫ norm_qfirst_context`` when
position 1 holds the query's first token.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.model._block_family import block_family
from icl_lens.model._reading import activations_captured
from icl_lens.thought._instruction_batches import prefix_ids, text_ids, with_bos


COLUMNS = ("divergence", "attn_bos", "attn_pos1", "attn_qfirst", "norm_pos1", "norm_qfirst", "attn_bos_context",
           "attn_qfirst_context", "norm_qfirst_context")


@dataclass(frozen=True)
class LayerDiagnosis:
    """Per-layer divergence and sink attention of an edited query-only forward (means over queries)."""

    divergence: Float[Tensor, " layer"]
    attn_bos: Float[Tensor, " layer"]
    attn_pos1: Float[Tensor, " layer"]
    attn_qfirst: Float[Tensor, " layer"]
    norm_pos1: Float[Tensor, " layer"]
    norm_qfirst: Float[Tensor, " layer"]
    attn_bos_context: Float[Tensor, " layer"]
    attn_qfirst_context: Float[Tensor, " layer"]
    norm_qfirst_context: Float[Tensor, " layer"]
    n_queries: int

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"layer": range(len(self.divergence)), **{c: getattr(self, c).tolist() for c in COLUMNS}})


@torch.no_grad()
def diagnose(model, instruction: str, queries: Sequence[str], edit=None, *, query_prefix: str = "\n") -> LayerDiagnosis:
    """Layer-by-layer comparison of ``[BOS, p, x]`` under ``edit`` with ``[BOS, I, x]`` (one query at a time)."""
    family = block_family(model)
    n_layers = model.cfg.n_layers
    names = {f"blocks.{l}.attn.hook_pattern" for l in range(n_layers)} | {family.resid_post(l) for l in range(n_layers)}
    instr = text_ids(model, instruction, what="instruction")
    pre = prefix_ids(model, query_prefix)
    sums = {k: torch.zeros(n_layers, dtype=torch.float64) for k in COLUMNS}

    def run(ids: list[int]) -> dict[str, Tensor]:
        with activations_captured(model, sorted(names)) as cache:
            model(torch.tensor([ids], device=model.cfg.device), return_type=None)
        return {n: cache[n][0] for n in names}

    queries = list(queries)
    for i, q in enumerate(queries):
        q_ids = text_ids(model, q, what=f"query {i}")
        ctx_ids = with_bos(model, instr + q_ids)
        first_ctx = len(ctx_ids) - len(q_ids)
        ctx = run(ctx_ids)
        with (nullcontext() if edit is None else edit.applied(model)):
            alone = run(with_bos(model, pre + q_ids))
        first = 1 + len(pre) if with_bos(model, []) else len(pre)
        for l in range(n_layers):
            o, big_o = alone[family.resid_post(l)], ctx[family.resid_post(l)]
            pat, pat_ctx = alone[f"blocks.{l}.attn.hook_pattern"], ctx[f"blocks.{l}.attn.hook_pattern"]
            add = {"divergence": (o[-1] - big_o[-1]).norm() / big_o[-1].norm(),
                   "attn_bos": pat[:, -1, 0].mean(), "attn_pos1": pat[:, -1, min(1, o.shape[0] - 1)].mean(),
                   "attn_qfirst": pat[:, -1, first].mean(), "norm_pos1": o[min(1, o.shape[0] - 1)].norm(),
                   "norm_qfirst": o[first].norm(), "attn_bos_context": pat_ctx[:, -1, 0].mean(),
                   "attn_qfirst_context": pat_ctx[:, -1, first_ctx].mean(), "norm_qfirst_context": big_o[first_ctx].norm()}
            for k, v in add.items():
                sums[k][l] += float(v)
    n = len(queries)
    return LayerDiagnosis(**{k: v / n for k, v in sums.items()}, n_queries=n)
