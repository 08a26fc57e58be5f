"""`ThoughtPatch`: a prompt turned into a permanent weight edit (arXiv 2510.08734).

Per layer ``l`` it holds the *input map* ``M[l]`` (``d_model × d_model``; the thought
matrix of each dense layer that reads the MLP input is ``Δ = W M[l]``, so ``W_in``,
``W_gate`` and ``W_up`` each get their own least-squares fit) and the *vector* ``v[l]``
(the thought vector: a bias on the MLP branch, or a post-FFN norm gain where the block
has that norm (Gemma 2/3, OLMo-2): the block family's ``vector_site``, see
:mod:`icl_lens.core.least_squares`). Layers that were not patched hold zeros.
It applies as weight edits through hooks (:meth:`ThoughtPatch.applied`, the shared
mechanism of :mod:`icl_lens.model.weight_edits`) or exports to a plain Hugging Face
directory (:meth:`ThoughtPatch.save_pretrained`).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.model.block_family import first_dense_weights
from icl_lens.model.weight_edits import MLPEdit, edits_applied


def thought_edits(model, maps: dict[int, Tensor], vectors: dict[int, Tensor], site: str) -> dict[int, MLPEdit]:
    """Per layer: ``Δ_d = W_d M`` of every first dense layer, and the vector at its ``site``."""
    edits = {}
    for layer in sorted(set(maps) | set(vectors)):
        m, vec = maps.get(layer), vectors.get(layer)
        weights = first_dense_weights(model, layer) if m is not None else {}
        edits[layer] = MLPEdit(v=m, u_in=weights["in"].T if m is not None else None,
                               u_gate=weights["gate"].T if "gate" in weights else None,
                               bias=vec if site == "bias" else None, gain=vec if site == "gain" else None)
    return edits


def _random_like_norm(reference: Tensor, target_norm: float, generator: torch.Generator) -> Tensor:
    """A Gaussian random tensor shaped like ``reference``, rescaled to Frobenius norm ``target_norm``."""
    r = torch.randn(reference.shape, generator=generator, dtype=reference.dtype).to(reference.device)
    n = torch.linalg.norm(r)
    return r * (target_norm / n) if float(n) > 0 else r


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
        """Dense ``Δ = W M`` of one layer (one matrix per layer, not per token): ``{"in": …}`` plus ``{"gate": …}``."""
        m = (self.maps[layer] if m is None else m).detach()
        with torch.no_grad():
            return {name: w.to(m.dtype) @ m for name, w in first_dense_weights(self._model(model), layer).items()}

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

    def edits(self, model=None) -> dict[int, MLPEdit]:
        """This patch as weight edits of ``model`` (default: the one it was fitted on)."""
        maps, vecs = self._parts()
        return thought_edits(self._model(model), maps, vecs, self.vector_site)

    @contextmanager
    def applied(self, model=None):
        """Run ``model`` (default: the one it was fitted on) with this patch; hooks removed on exit."""
        model = self._model(model)
        with edits_applied(model, self.edits(model)) as m:
            yield m

    def save_pretrained(self, directory: str | Path, model=None) -> Path:
        """Write a Hugging Face model directory (weights edited, tokenizer included)."""
        from icl_lens.thought.export import export_thought_model

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
                r = _random_like_norm(self.maps[l], 1.0, gen)
                maps[l] = r * (float(target[l]) / self._delta_norm(l, model, r))
            if self.has_vector:
                vecs[l] = _random_like_norm(self.vectors[l], float(torch.linalg.norm(self.vectors[l])), gen)
        return replace(self, maps=maps, vectors=vecs, instruction=f"random control (seed {seed})")

    def to(self, device: torch.device | str) -> "ThoughtPatch":
        return replace(self, maps=self.maps.to(device), vectors=self.vectors.to(device))
