"""`ThoughtPatch`: a prompt turned into a permanent weight edit (arXiv 2510.08734).

Per layer ``l`` it holds the *input map* ``M[l]`` (``d_model × d_model``; the thought
matrix of each dense layer that reads the MLP input is ``Δ = W M[l]``, so ``W_in``,
``W_gate`` and ``W_up`` each get their own least-squares fit), the *vector* ``v[l]``
(the thought vector: a bias on the MLP branch, or a post-FFN norm gain where the block
has that norm (Gemma 2/3, OLMo-2): the block family's ``vector_site``, see
:mod:`icl_lens.core._least_squares`) and, for kind ``"both+down"``, the
down-projection map ``ΔW_out[l] = Σ_k down_u[l, k] down_v[l, k]ᵀ`` (factored, rank at
most the number of fitted rows). Layers that were not patched hold zeros. The patched
model is prompted as it was fitted: ``[BOS] + query_prefix + query``
(:meth:`ThoughtPatch.prompt_ids`).
It applies as weight edits through hooks (:meth:`ThoughtPatch.applied`, the shared
mechanism of :mod:`icl_lens.model._weight_edits`) or exports to a plain Hugging Face
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

from icl_lens.core._factored import sum_norm
from icl_lens.model._block_family import VectorSite, first_dense_weights
from icl_lens.model._weight_edits import MLPEdit, edits_applied
from icl_lens.thought._defaults import FIT_FILE, ThoughtFit


def thought_edits(maps: dict[int, Tensor], vectors: dict[int, Tensor], site: VectorSite,
                  downs: dict[int, tuple[Tensor, Tensor]] | None = None) -> dict[int, MLPEdit]:
    """Per layer: ``Δ_d = W_d M`` of every first dense layer, the vector at its ``site``, ``ΔW_out = uᵀ v``."""
    downs = downs or {}
    edits = {}
    for layer in sorted(set(maps) | set(vectors) | set(downs)):
        out_u, out_v = downs.get(layer, (None, None))
        edits[layer] = MLPEdit(m=maps.get(layer), out_u=out_u, out_v=out_v, **VectorSite(site).edit(vectors.get(layer)))
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
    vector_site: VectorSite
    instruction: str
    queries: tuple[str, ...]
    kind: str
    eta: float
    ridge: float
    iterations: int
    layers: tuple[int, ...]
    query_prefix: str
    maps: Float[Tensor, "layer d_model d_model"]
    vectors: Float[Tensor, "layer d_model"]
    down_u: Float[Tensor, "layer k d_model"]  # ΔW_out[l] = down_u[l]ᵀ down_v[l]; k = 0 without a down map
    down_v: Float[Tensor, "layer k d_mlp"]
    matrix_residual: Float[Tensor, " layer"]  # ‖D − M A‖/‖D‖ after the fit (0 where exact)
    vector_residual: Float[Tensor, " layer"]  # ‖ρ − fitted‖/‖ρ‖ after the fit
    down_residual: Float[Tensor, " layer"]  # ‖r − ΔW_out h‖/‖r‖ of the down fit (its own target r)
    n_tokens: int  # calibration rows of the query-only pass (query tokens, plus answer tokens)
    answer_tokens: int = 0  # the fit's answer_tokens (0: query tokens only, as in the paper)
    model: object = field(repr=False, compare=False, default=None)
    method: str = "fit"  # "fit" (Algorithm 1, closed form), "joint" (one fit over several tasks), "distill" (gradient
    # steps) or "composed" (edits added)
    settings: dict = field(default_factory=dict)  # the method's own settings (distillation: steps, lr, losses)
    fit: ThoughtFit | None = None  # the settings it was fitted (or distilled) with; None for an added composition

    @property
    def has_matrix(self) -> bool:
        return self.kind in ("matrix", "both", "both+down")

    @property
    def has_vector(self) -> bool:
        return self.kind in ("vector", "both", "both+down")

    @property
    def has_down(self) -> bool:
        return self.kind == "both+down"

    def _parts(self) -> tuple[dict[int, Tensor], dict[int, Tensor], dict[int, tuple[Tensor, Tensor]]]:
        maps = {l: self.maps[l] for l in self.layers} if self.has_matrix else {}
        vecs = {l: self.vectors[l] for l in self.layers} if self.has_vector else {}
        downs = {l: (self.down_u[l], self.down_v[l]) for l in self.layers} if self.has_down else {}
        return maps, vecs, downs

    def prompt_ids(self, query: str, model=None) -> list[int]:
        """Token ids the patched model reads for ``query``: ``[BOS] + query_prefix + query`` (as fitted)."""
        from icl_lens.thought._instruction_batches import prefix_ids, text_ids, with_bos

        model = self._model(model)
        return with_bos(model, prefix_ids(model, self.query_prefix) + text_ids(model, query, what="query"))

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

    def down_norms(self) -> Float[Tensor, " layer"]:
        """``‖ΔW_out‖_F`` per layer, from the factors (0 without a down map)."""
        norms = torch.zeros(self.maps.shape[0], dtype=torch.float64)
        if self.has_down and self.down_u.shape[1]:
            for l in self.layers:
                norms[l] = float(sum_norm(self.down_u[l].double(), self.down_v[l].double()))
        return norms

    def to_frame(self) -> pd.DataFrame:
        """One row per layer: patched?, matrix, vector and down-map norms, fit residuals."""
        mn, vn, dn = self.matrix_norms().double(), self.vector_norms().double(), self.down_norms()
        return pd.DataFrame([
            {"layer": l, "patched": l in self.layers, "matrix_norm": float(mn[l]), "vector_norm": float(vn[l]),
             "down_norm": float(dn[l]), "matrix_residual": float(self.matrix_residual[l]),
             "vector_residual": float(self.vector_residual[l]), "down_residual": float(self.down_residual[l])}
            for l in range(self.maps.shape[0])
        ])

    def edits(self) -> dict[int, MLPEdit]:
        """This patch as weight edits (of any model of its shape: an input map does not read the weights)."""
        maps, vecs, downs = self._parts()
        return thought_edits(maps, vecs, self.vector_site, downs)

    @contextmanager
    def applied(self, model=None):
        """Run ``model`` (default: the one it was fitted on) with this patch; hooks removed on exit."""
        model = self._model(model)
        with edits_applied(model, self.edits()) as m:
            yield m

    def save_pretrained(self, directory: str | Path, model=None) -> Path:
        """Write a Hugging Face model directory (weights edited, tokenizer included) and, beside the weights,
        ``icl_lens_thought.json``: the patch's :class:`ThoughtFit` (read back by :meth:`ThoughtFit.load`), method,
        instruction and calibration queries."""
        import json

        from icl_lens.thought._hf_export import export_thought_model

        maps, vecs, downs = self._parts()
        out = export_thought_model(self._model(model), maps, vecs, directory, downs=downs)
        about = {"fit": None if self.fit is None else self.fit.to_dict(), "method": self.method,
                 "settings": self.settings, "instruction": self.instruction, "queries": list(self.queries),
                 "model_name": self.model_name}
        (out / FIT_FILE).write_text(json.dumps(about, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return out

    def random_control(self, seed: int = 0, model=None) -> "ThoughtPatch":
        """Control: same per-layer ``‖ΔW‖_F``, vector norm and ``‖ΔW_out‖_F`` (and rank), random Gaussian directions."""
        model = self._model(model)
        gen = torch.Generator().manual_seed(seed)
        target, down_target = self.matrix_norms(model), self.down_norms()
        maps, vecs = torch.zeros_like(self.maps), torch.zeros_like(self.vectors)
        down_u, down_v = torch.zeros_like(self.down_u), torch.zeros_like(self.down_v)
        for l in self.layers:
            if self.has_matrix and float(target[l]) > 0:
                r = _random_like_norm(self.maps[l], 1.0, gen)
                maps[l] = r * (float(target[l]) / self._delta_norm(l, model, r))
            if self.has_vector:
                vecs[l] = _random_like_norm(self.vectors[l], float(torch.linalg.norm(self.vectors[l])), gen)
            if self.has_down and float(down_target[l]) > 0:
                k = int((self.down_u[l].abs().sum(-1) > 0).sum())  # rows in use: the same rank
                u = _random_like_norm(self.down_u[l, :k], 1.0, gen)
                v = _random_like_norm(self.down_v[l, :k], 1.0, gen)
                down_u[l, :k] = u * (float(down_target[l]) / float(sum_norm(u.double(), v.double())))
                down_v[l, :k] = v
        return replace(self, maps=maps, vectors=vecs, down_u=down_u, down_v=down_v,
                       instruction=f"random control (seed {seed})")

    @classmethod
    def composed(cls, patches: "list[ThoughtPatch]") -> "ThoughtPatch":
        """Several patches applied at once: their edits added (input maps and vectors summed, down-projection
        factors stacked, so ``ΔW_out`` is the sum). They must share the model, kind and query prefix."""
        patches = list(patches)
        if not patches:
            raise ValueError("composed needs at least one patch")
        first = patches[0]
        for p in patches[1:]:
            for name in ("model_name", "kind", "query_prefix", "vector_site"):
                if getattr(p, name) != getattr(first, name):
                    raise ValueError(f"patches differ in {name}: {getattr(first, name)!r} vs {getattr(p, name)!r}")
        down_u = torch.cat([p.down_u for p in patches], dim=1)
        down_v = torch.cat([p.down_v for p in patches], dim=1)
        zeros = torch.zeros_like(first.matrix_residual)
        return replace(first, instruction=" + ".join(p.instruction for p in patches),
                       queries=tuple(q for p in patches for q in p.queries),
                       layers=tuple(sorted({l for p in patches for l in p.layers})),
                       maps=sum(p.maps for p in patches), vectors=sum(p.vectors for p in patches),
                       down_u=down_u, down_v=down_v, matrix_residual=zeros, vector_residual=zeros.clone(),
                       down_residual=zeros.clone(), n_tokens=sum(p.n_tokens for p in patches), method="composed",
                       settings={"parts": [p.method for p in patches]},
                       fit=first.fit if all(p.fit == first.fit for p in patches) else None)

    def to(self, device: torch.device | str) -> "ThoughtPatch":
        return replace(self, maps=self.maps.to(device), vectors=self.vectors.to(device),
                       down_u=self.down_u.to(device), down_v=self.down_v.to(device))
