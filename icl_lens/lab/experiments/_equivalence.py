"""Experiment 1 — numerical equivalence (Dherin et al. 2025, arXiv 2507.16003, Theorem 2.2, §5).

For every prompt and position ``t``: the contextual forward's prediction ``ŷ_C(t)`` and
final residual must equal those of the token run ALONE with every layer's token patch
(``ΔW_in = u vᵀ`` plus the skip-connection bias) applied. Reported as
``max |ŷ_C − ŷ_patched| / max |ŷ_C|`` (and the same for the last residual stream) over
all prompts and positions, per architecture and dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from icl_lens.lab._checkpoints import load_lab_model
from icl_lens.lab._model import LAB_FAMILY
from icl_lens.lab._mixers import ARCHITECTURES
from icl_lens.lab._patching import lab_token_patches, patched_context_free
from icl_lens.lab._tasks import sample_prompts
from icl_lens.model._reading import activations_captured

DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclass(frozen=True, eq=False)
class EquivalenceResult:
    """One row per (architecture, dtype)."""

    rows: tuple[dict, ...]

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.rows))

    def worst(self, arch: str, dtype: str) -> float:
        """The larger of the two relative errors for ``arch`` at ``dtype``."""
        r = next(r for r in self.rows if r["arch"] == arch and r["dtype"] == dtype)
        return max(r["rel_error_prediction"], r["rel_error_residual"])


@torch.no_grad()
def numerical_equivalence(archs=ARCHITECTURES, *, n_prompts: int = 64, n_context: int = 16,
                          dtypes=("float64", "float32"), seed: int = 0) -> EquivalenceResult:
    """Contextual vs patched context-free forward on ``n_prompts`` prompts × ``n_context + 1`` positions."""
    rows = []
    for arch in archs:
        for name in dtypes:
            model = load_lab_model(arch, DTYPES[name])
            p = sample_prompts(n_prompts, n_context, model.cfg.d_x, generator=torch.Generator().manual_seed(seed), dtype=DTYPES[name])
            last = LAB_FAMILY.resid_post(model.cfg.n_layers - 1)
            with activations_captured(model, [last]) as contextual:
                pred_c = model(p.tokens)
            resid_c = contextual[last]
            patches = lab_token_patches(model, p.tokens)
            with activations_captured(model, [last]) as alone:
                pred_0 = patched_context_free(model, p.tokens, patches)
            resid_0 = alone[last].reshape(resid_c.shape)
            rows.append({
                "arch": arch, "dtype": name, "prompts": n_prompts, "positions": n_context + 1,
                "rel_error_prediction": float((pred_c - pred_0).abs().max() / pred_c.abs().max()),
                "rel_error_residual": float((resid_c - resid_0).abs().max() / resid_c.abs().max()),
                "mean_patch_norm": float(patches.norms().mean()),
                "mean_correction_norm": float(patches.correction.norm(dim=-1).mean()),
            })
    return EquivalenceResult(tuple(rows))
