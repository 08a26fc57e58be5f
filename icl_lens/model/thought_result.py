"""`ThoughtPatch`: a prompt turned into a permanent weight edit (arXiv 2510.08734).

Per layer ``l`` it holds the *input map* ``M[l]`` (``d_model × d_model``; the thought
matrix of each dense layer that reads the MLP input is ``Δ = W M[l]``, so ``W_in``,
``W_gate`` and ``W_up`` each get their own least-squares fit) and the *vector* ``v[l]``
(the thought vector: a bias on the MLP branch for GPT-2/Llama, a post-FFN norm gain for
Gemma 3, see :mod:`icl_lens.core.thought_math`). Layers that were not patched hold zeros.
It applies through hooks (:meth:`ThoughtPatch.applied`) or exports to a plain Hugging
Face directory (:meth:`ThoughtPatch.save_pretrained`).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core.thought_math import random_like_norm


@dataclass(frozen=True, eq=False)
class ThoughtPatch:
    """Thought matrices (as input maps) and thought vectors of every patched layer."""

    model_name: str
    family: str
    vector_site: str  # "bias" or "gain"
    instruction: str
    queries: tuple[str, ...]
    kind: str
    eta: float
    ridge: float
    iterations: int
    layers: tuple[int, ...]
    maps: Float[Tensor, "layer d_model d_model"]
    vectors: Float[Tensor, "layer d_model"]
    matrix_residual: Float[Tensor, " layer"]  # ‖D − M A‖/‖D‖ after the fit (0 where exact)
    vector_residual: Float[Tensor, " layer"]  # ‖ρ − fitted‖/‖ρ‖ after the fit
    n_tokens: int
    model: object = field(repr=False, compare=False, default=None)

    @property
    def has_matrix(self) -> bool:
        return self.kind in ("matrix", "both")

    @property
    def has_vector(self) -> bool:
        return self.kind in ("vector", "both")

    def _parts(self) -> tuple[dict[int, Tensor | None], dict[int, Tensor | None]]:
        maps = {l: self.maps[l] for l in self.layers} if self.has_matrix else {}
        vecs = {l: self.vectors[l] for l in self.layers} if self.has_vector else {}
        return maps, vecs

    def _model(self, model):
        model = model if model is not None else self.model
        if model is None:
            raise ValueError("this ThoughtPatch holds no model; pass the model it was fitted on")
        return model

    def weight_deltas(self, layer: int, model=None, m: Tensor | None = None) -> dict[str, Float[Tensor, "d_mlp d_model"]]:
        """Dense ``Δ = W M`` of one layer: ``{"in": …}`` plus ``{"gate": …}`` for gated MLPs."""
        from icl_lens.model.block_family import block_family

        model = self._model(model)
        fam, mlp = block_family(model), model.blocks[layer].mlp
        m = (self.maps[layer] if m is None else m).detach()
        with torch.no_grad():
            return self._deltas(fam, mlp, m)

    @staticmethod
    def _deltas(fam, mlp, m: Tensor) -> dict[str, Tensor]:
        from icl_lens.model.block_family import dense_weight

        out = {"in": dense_weight(mlp.__getattr__("in")).to(m.dtype) @ m}
        if fam.gated:
            out["gate"] = dense_weight(mlp.gate).to(m.dtype) @ m
        return out

    def _delta_norm(self, layer: int, model=None, m: Tensor | None = None) -> float:
        return float(torch.sqrt(sum(torch.linalg.norm(d) ** 2 for d in self.weight_deltas(layer, model, m).values())))

    def matrix_norms(self, model=None) -> Float[Tensor, " layer"]:
        """``‖ΔW‖_F`` per layer, ``sqrt(‖Δ_gate‖² + ‖Δ_up‖²)`` for gated MLPs (0 if no matrix part)."""
        norms = torch.zeros(self.maps.shape[0], dtype=self.maps.dtype)
        if self.has_matrix:
            for l in self.layers:
                norms[l] = self._delta_norm(l, model)
        return norms

    def vector_norms(self) -> Float[Tensor, " layer"]:
        return torch.linalg.vector_norm(self.vectors, dim=-1) if self.has_vector else torch.zeros(self.vectors.shape[0])

    def to_frame(self) -> pd.DataFrame:
        """One row per layer: patched?, matrix norm, vector norm, fit residuals."""
        mn, vn = self.matrix_norms().double(), self.vector_norms().double()
        return pd.DataFrame([
            {"layer": l, "patched": l in self.layers, "matrix_norm": float(mn[l]), "vector_norm": float(vn[l]),
             "matrix_residual": float(self.matrix_residual[l]), "vector_residual": float(self.vector_residual[l])}
            for l in range(self.maps.shape[0])
        ])

    @contextmanager
    def applied(self, model=None):
        """Run ``model`` (default: the one it was fitted on) with this patch; hooks removed on exit."""
        from icl_lens.model.thought_apply import thought_applied

        maps, vecs = self._parts()
        with thought_applied(self._model(model), maps, vecs) as m:
            yield m

    def save_pretrained(self, directory: str | Path, model=None) -> Path:
        """Write a Hugging Face model directory (weights edited, tokenizer included)."""
        from icl_lens.model.thought_export import export_thought_model

        maps, vecs = self._parts()
        return export_thought_model(self._model(model), maps, vecs, directory)

    def random_control(self, seed: int = 0, model=None) -> "ThoughtPatch":
        """Control: same per-layer ``‖ΔW‖_F`` and vector norm, random Gaussian directions."""
        model = self._model(model)
        gen = torch.Generator().manual_seed(seed)
        target = self.matrix_norms(model)
        maps, vecs = torch.zeros_like(self.maps), torch.zeros_like(self.vectors)
        for l in self.layers:
            if self.has_matrix and float(target[l]) > 0:
                r = random_like_norm(self.maps[l], 1.0, gen)
                maps[l] = r * (float(target[l]) / self._delta_norm(l, model, r))
            if self.has_vector:
                vecs[l] = random_like_norm(self.vectors[l], float(torch.linalg.norm(self.vectors[l])), gen)
        return replace(self, maps=maps, vectors=vecs, instruction=f"random control (seed {seed})")

    def to(self, device: torch.device | str) -> "ThoughtPatch":
        return replace(self, maps=self.maps.to(device), vectors=self.vectors.to(device))
