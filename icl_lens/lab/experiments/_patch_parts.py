"""Where the context effect lives in a lab model: the W_in patches, the skip corrections, or both (docs/design.md §2).

For each prompt's query (``n`` context pairs), the query token is run ALONE with every
layer's token patch split in two (Dherin et al. 2025, arXiv 2507.16003): the rank-1
``W_in`` edit ``u vᵀ`` and the skip-connection correction ``attn_C − attn_0``
(:meth:`icl_lens.patches._patch_set.TokenPatches.keep_parts`). Variants: ``none`` (the
context-free model), ``w_in`` (only the weight patches), ``correction`` (only the
corrections), ``full`` (both: the contextual prediction, exactly). Reported per variant:

- the task error ``(ŷ − y)² / d_x`` (normalised MSE, 1 ≈ ignoring the context);
- the unexplained share ``Σ (ŷ_variant − ŷ_C)² / Σ (ŷ_none − ŷ_C)²`` over prompts (0: the
  variant reproduces the context's effect on the prediction, 1: no better than no context).

Without skip connections the correction is zero and the ``W_in`` patch is the whole effect.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.stats._bootstrap import bootstrap_mean
from icl_lens.lab._checkpoints import load_lab_model
from icl_lens.lab._model import RegressionModel
from icl_lens.lab._patching import lab_token_patches, patched_context_free
from icl_lens.lab._tasks import sample_prompts

VARIANTS = {"none": (False, False), "w_in": (True, False), "correction": (False, True), "full": (True, True)}


@dataclass(frozen=True, eq=False)
class PatchPartsResult:
    """Query predictions per variant and prompt, the contextual prediction and the target."""

    name: str
    d_x: int
    predictions: dict[str, Float[Tensor, " prompt"]]
    contextual: Float[Tensor, " prompt"]
    targets: Float[Tensor, " prompt"]

    def summary(self) -> pd.DataFrame:
        base = ((self.predictions["none"] - self.contextual) ** 2).double().sum()
        rows = []
        for k, pred in self.predictions.items():
            err = bootstrap_mean((((pred - self.targets) ** 2) / self.d_x).double().numpy())
            left = float(((pred - self.contextual) ** 2).double().sum() / base) if base > 0 else float("nan")
            rows.append({"variant": k, "task_mse": err.mean, "low": err.low, "high": err.high, "unexplained": left})
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"prompt": range(len(self.targets)), "target": self.targets.double().numpy(),
                             "contextual": self.contextual.double().numpy(),
                             **{k: v.double().numpy() for k, v in self.predictions.items()}})


@torch.no_grad()
def patch_parts(name: str = "softmax", *, n_prompts: int = 64, n_context: int | None = None, seed: int = 3,
                model: RegressionModel | None = None) -> PatchPartsResult:
    """Query predictions with the full patch, only the ``W_in`` patches, only the corrections, and none."""
    model = model if model is not None else load_lab_model(name)
    cfg = model.cfg
    n = cfg.n_context_train if n_context is None else n_context
    p = sample_prompts(n_prompts, n, cfg.d_x, generator=torch.Generator().manual_seed(seed), dtype=model.dtype,
                       query_flag=cfg.query_flag)
    patches = lab_token_patches(model, p.tokens)
    preds = {k: patched_context_free(model, p.tokens, patches.keep_parts(w_in=w, correction=c))[:, -1]
             for k, (w, c) in VARIANTS.items()}
    return PatchPartsResult(name, cfg.d_x, preds, model(p.tokens)[:, -1], p.targets)
