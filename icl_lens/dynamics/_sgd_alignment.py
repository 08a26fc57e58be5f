"""Implicit (token patch) versus explicit (SGD) weight updates, compared in closed form.

Dherin et al. 2025 (arXiv 2507.16003, §4, "alignment with finetuning"): the implicit
update a context makes to the first dense MLP weights of a block is compared with the
update that explicit gradient descent on the context-free input makes to the same
weights, by the normalised Frobenius inner product (cosine).

*Implicit*, per layer: the token patch ``Pₙ = Wₙ − W₀ = U vᵀ`` of the query's full
context (:class:`~icl_lens.dynamics._trajectory.Trajectory`, step n), with ``U = [u_gate; u_in]``.

*Explicit*, per layer: SGD on ``W_in`` (``W_up``) and ``W_gate`` of every layer at once,
on the context-free input ``[BOS, x_t]``. On one input the gradient of a dense layer is a
sum of rank-1 terms, one per input row r (BOS and query):

    ∇_W L = Σ_r g_r x_rᵀ,   g_r = ∂L/∂(W x_r),  x_r = the MLP input at row r,

so step s adds ``−lr Σ_r g_{s,r} x_{s,r}ᵀ`` and the cumulative update after s steps is
``E_s = Σ_{j<s} Σ_r U_{j,r} V_{j,r}ᵀ`` with ``U = −lr [g_gate; g_in]``, ``V = x``. All
inner products use ``⟨u₁v₁ᵀ, u₂v₂ᵀ⟩ = (u₁·u₂)(v₁·v₂)``; no dense matrix is formed.

*The paper's protocol* (:func:`trajectory_sgd_cosines`): one SGD step per context
example ``cⱼ``, in the order the context is read, compared with the implicit trajectory
``W₀..Wₙ`` (either order of docs/design.md §3) after each example:

    cumulative(i) = cos(Wᵢ − W₀,  Σ_{j≤i} Eⱼ)          per step(i) = cos(Wᵢ − Wᵢ₋₁,  Eᵢ)

with ``Eⱼ = Σ_r U_{j,r} V_{j,r}ᵀ`` the SGD step on example ``j``. From one Gram matrix per
layer: ``⟨Pᵢ, Eⱼ⟩ = Σ_r (uᵢ·U_{j,r})(vᵢ·V_{j,r})`` and ``‖Σ_{j≤i} Eⱼ‖² = Σ_{j,k≤i} ⟨Eⱼ, E_k⟩``.

*Input and output side of a per-step cosine* (:func:`step_sides`), for a rank-1 SGD step
``Eᵢ = gᵢ aᵢᵀ`` and the implicit step ``ΔPᵢ = Pᵢ − Pᵢ₋₁`` (rank ≤ 2), exactly:

    cos(ΔPᵢ, Eᵢ) = cos(ΔPᵢ âᵢ, gᵢ) · ‖ΔPᵢ âᵢ‖ / ‖ΔPᵢ‖_F        (âᵢ = aᵢ / ‖aᵢ‖)

the *output side* (does the implicit step move the example's input direction the way SGD
does?) times the *input share* (how much of the implicit step reads that input direction,
in [0, 1]; ``|cos(v, aᵢ)|`` when ``ΔPᵢ = u vᵀ`` is rank-1). Both hold in either order.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.stats._bootstrap import MeanCI, bootstrap_mean
from icl_lens.core._factored import diff_norm, patch_norm, safe_divide, stack_outputs
from icl_lens.dynamics._trajectory import Trajectory


def _terms(u: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Flatten ``[layer, step, row, d]`` factors into ``[layer, step·row, d]`` rank-1 terms (float64)."""
    return u.flatten(1, 2).double(), v.flatten(1, 2).double()


def inner_with_terms(
    u: Float[Tensor, "layer k d_u"], v: Float[Tensor, "layer k d_in"],
    term_u: Float[Tensor, "layer m d_u"], term_v: Float[Tensor, "layer m d_in"],
) -> Float[Tensor, "layer k m"]:
    """``⟨u_k v_kᵀ, term_u_m term_v_mᵀ⟩`` for every pair: ``(u·term_u)(v·term_v)``."""
    return torch.einsum("lku,lmu->lkm", u, term_u) * torch.einsum("lkd,lmd->lkm", v, term_v)


def cumulative_sum_norms(term_u: Float[Tensor, "layer m d_u"], term_v: Float[Tensor, "layer m d_in"],
                         group: int) -> Float[Tensor, "layer s"]:
    """``‖Σ_{first s·group terms}‖_F`` for s = 1..m/group, from one Gram matrix per layer."""
    gram = torch.einsum("lau,lbu->lab", term_u, term_u) * torch.einsum("lad,lbd->lab", term_v, term_v)
    m = gram.shape[-1]
    ends = range(group, m + 1, group)
    return torch.stack([gram[:, :e, :e].sum((-2, -1)) for e in ends], dim=-1).clamp_min(0).sqrt()


def step_gram(exp_u: Float[Tensor, "*b n row d_u"], exp_v: Float[Tensor, "*b n row d_in"]) -> Float[Tensor, "*b n n"]:
    """``⟨Eⱼ, E_k⟩`` of SGD steps made of rank-1 rows: ``Σ_{r,s} (U_{j,r}·U_{k,s})(V_{j,r}·V_{k,s})`` (float64)."""
    eu, ev = exp_u.to(torch.float64), exp_v.to(torch.float64)
    return (torch.einsum("...ard,...bsd->...arbs", eu, eu) * torch.einsum("...ard,...bsd->...arbs", ev, ev)).sum((-1, -3))


def trajectory_sgd_cosines(
    imp_u: Float[Tensor, "*b step d_u"], imp_v: Float[Tensor, "*b step d_in"],
    exp_u: Float[Tensor, "*b n row d_u"], exp_v: Float[Tensor, "*b n row d_in"],
    gram: Float[Tensor, "*b n n"] | None = None,
) -> tuple[Float[Tensor, "*b n"], Float[Tensor, "*b n"]]:
    """Cumulative and per-step cosines of an implicit trajectory with one SGD step per example.

    ``imp_u``/``imp_v``: the trajectory's factors ``Pᵢ = uᵢ vᵢᵀ = Wᵢ − W₀`` for steps
    i = 0..n (``P₀`` is normally 0). ``exp_u``/``exp_v``: SGD step ``j = 1..n`` is
    ``Σ_row exp_u[j, row] exp_v[j, row]ᵀ`` (already carrying ``−lr``). Column ``i − 1`` of
    the results is ``cos(Pᵢ, Σ_{j≤i} Eⱼ)`` and ``cos(Pᵢ − Pᵢ₋₁, Eᵢ)``; 0 where a side is 0.
    Any leading dimensions (layer, prompt) broadcast. Float64. ``gram``: the steps'
    :func:`step_gram`, when already computed (it depends on the SGD run only).
    """
    iu, iv, eu, ev = (x.to(torch.float64) for x in (imp_u, imp_v, exp_u, exp_v))
    n = eu.shape[-3]
    if iu.shape[-2] != n + 1:
        raise ValueError(f"the trajectory has {iu.shape[-2]} steps, the SGD run {n} (need n + 1 and n)")
    # inner[i, j] = ⟨Pᵢ, Eⱼ⟩
    inner = (torch.einsum("...id,...jrd->...ijr", iu, eu) * torch.einsum("...id,...jrd->...ijr", iv, ev)).sum(-1)
    gram = step_gram(eu, ev) if gram is None else gram.to(torch.float64)
    cum_gram = gram.cumsum(-1).cumsum(-2)
    exp_cum_norm = torch.diagonal(cum_gram, dim1=-2, dim2=-1).clamp_min(0).sqrt()  # ‖Σ_{j≤i} Eⱼ‖
    exp_step_norm = torch.diagonal(gram, dim1=-2, dim2=-1).clamp_min(0).sqrt()
    imp_norm = patch_norm(iu[..., 1:, :], iv[..., 1:, :])
    cum_inner = torch.diagonal(inner[..., 1:, :].cumsum(-1), dim1=-2, dim2=-1)  # Σ_{j≤i} ⟨Pᵢ, Eⱼ⟩
    cumulative = safe_divide(cum_inner, imp_norm * exp_cum_norm)
    step_inner = torch.diagonal(inner[..., 1:, :], dim1=-2, dim2=-1) - torch.diagonal(inner[..., :-1, :], dim1=-2, dim2=-1)
    step_norm = diff_norm(iu[..., 1:, :], iv[..., 1:, :], iu[..., :-1, :], iv[..., :-1, :])
    return cumulative, safe_divide(step_inner, step_norm * exp_step_norm)


def step_sides(
    imp_u: Float[Tensor, "*b step d_u"], imp_v: Float[Tensor, "*b step d_in"],
    exp_u: Float[Tensor, "*b n d_u"], exp_v: Float[Tensor, "*b n d_in"],
) -> tuple[Float[Tensor, "*b n"], Float[Tensor, "*b n"]]:
    """Output side ``cos(ΔPᵢ âᵢ, gᵢ)`` and input share ``‖ΔPᵢ âᵢ‖ / ‖ΔPᵢ‖_F`` of each per-step cosine.

    ``imp_u``/``imp_v``: the trajectory ``Pᵢ = uᵢ vᵢᵀ``, i = 0..n; ``exp_u``/``exp_v``: the rank-1
    SGD steps ``Eᵢ = exp_u[i] exp_v[i]ᵀ``, i = 1..n. Their product is ``cos(ΔPᵢ, Eᵢ)`` (module
    docstring); 0 where a side is 0. Float64.
    """
    iu, iv, eu, ev = (x.to(torch.float64) for x in (imp_u, imp_v, exp_u, exp_v))
    if iu.shape[-2] != eu.shape[-2] + 1:
        raise ValueError(f"the trajectory has {iu.shape[-2]} steps, the SGD run {eu.shape[-2]} (need n + 1 and n)")
    a_hat = safe_divide(ev, ev.norm(dim=-1, keepdim=True))
    moved = (iu[..., 1:, :] * (iv[..., 1:, :] * a_hat).sum(-1, keepdim=True)
             - iu[..., :-1, :] * (iv[..., :-1, :] * a_hat).sum(-1, keepdim=True))  # ΔPᵢ âᵢ
    moved_norm = moved.norm(dim=-1)
    out_side = safe_divide((moved * eu).sum(-1), moved_norm * eu.norm(dim=-1))
    share = safe_divide(moved_norm, diff_norm(iu[..., 1:, :], iv[..., 1:, :], iu[..., :-1, :], iv[..., :-1, :]))
    return out_side, share


def patches_vs_update(
    imp_u: Float[Tensor, "*b step d_u"], imp_v: Float[Tensor, "*b step d_in"],
    exp_u: Float[Tensor, "*b m d_u"], exp_v: Float[Tensor, "*b m d_in"],
) -> Float[Tensor, "*b step"]:
    """``cos(uᵢ vᵢᵀ, Σ_m exp_u[m] exp_v[m]ᵀ)`` for every implicit patch ``i``: each against one fixed update."""
    iu, iv, eu, ev = (x.to(torch.float64) for x in (imp_u, imp_v, exp_u, exp_v))
    inner = (torch.einsum("...id,...md->...im", iu, eu) * torch.einsum("...id,...md->...im", iv, ev)).sum(-1)
    gram = torch.einsum("...ad,...bd->...ab", eu, eu) * torch.einsum("...ad,...bd->...ab", ev, ev)
    return safe_divide(inner, patch_norm(iu, iv) * gram.sum((-1, -2)).clamp_min(0).sqrt()[..., None])


def random_direction_cosines(dim: int, shape: tuple[int, ...], *, generator: torch.Generator | None = None
                             ) -> Float[Tensor, "..."]:
    """Cosines of a fixed direction with independent uniformly random directions in ``R^dim``.

    The baseline for an alignment cosine between two updates of a ``dim``-dimensional
    weight space (``dim = d_u · d_in``): ``cos = z / sqrt(z² + χ²_{dim−1})`` with
    ``z ~ N(0, 1)``, so the mean is 0 and the typical size ``|cos| ≈ sqrt(2/(π dim))``. The
    χ² draw is exact up to ``dim = 512`` and uses the Wilson–Hilferty cube above.
    """
    if dim < 2:
        raise ValueError(f"dim must be ≥ 2, got {dim}")
    z = torch.randn(shape, generator=generator, dtype=torch.float64)
    k = dim - 1
    if k <= 511:
        rest = torch.randn(*shape, k, generator=generator, dtype=torch.float64).pow(2).sum(-1)
    else:
        c = 2.0 / (9.0 * k)
        rest = k * (1 - c + torch.randn(shape, generator=generator, dtype=torch.float64) * c ** 0.5).pow(3)
    return z / (z.pow(2) + rest).sqrt()


@dataclass(frozen=True, eq=False)
class AlignmentTable:
    """Alignment cosines of many prompts: ``per_prompt[key][prompt, layer]`` = the mean over steps ``i``.

    Keys read ``"<comparison>:<order>:<kind>"`` (e.g. ``"sgd:absorb:step"``); ``dim`` is the
    dimension of one layer's weight space (``d_u · d_in``), the scale of the random baseline.
    Means over prompts come with 95% percentile-bootstrap intervals (:mod:`icl_lens.stats._bootstrap`).
    """

    name: str
    dim: int
    per_prompt: dict[str, Float[Tensor, "prompt layer"]]

    @property
    def n_layers(self) -> int:
        return next(iter(self.per_prompt.values())).shape[1]

    def ci(self, key: str, layer: int | None = None) -> MeanCI:
        """Signed mean over prompts (each prompt's mean over layers, or one layer) with its 95% interval."""
        c = self.per_prompt[key].double()
        return bootstrap_mean((c.mean(1) if layer is None else c[:, layer]).cpu().numpy())

    def summary(self) -> pd.DataFrame:
        """One row per key: signed mean, 95% interval and mean |cos| (of the per-prompt, per-layer values)."""
        rows = []
        for key, c in self.per_prompt.items():
            comparison, order, kind = key.split(":")
            ci = self.ci(key)
            rows.append({"comparison": comparison, "order": order, "kind": kind, "mean": ci.mean, "low": ci.low,
                         "high": ci.high, "mean_abs": float(c.abs().double().mean()), "prompts": ci.n})
        return pd.DataFrame(rows)

    def per_layer(self, keys=None) -> pd.DataFrame:
        """Per layer and key: signed mean over prompts with its 95% interval."""
        rows = []
        for key in keys or self.per_prompt:
            for layer in range(self.n_layers):
                ci = self.ci(key, layer)
                rows.append({"key": key, "layer": layer, "mean": ci.mean, "low": ci.low, "high": ci.high})
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        frames = []
        for key, c in self.per_prompt.items():
            P, L = c.shape
            frames.append(pd.DataFrame({"key": key, "prompt": torch.arange(P).repeat_interleave(L).numpy(),
                                        "layer": torch.arange(L).repeat(P).numpy(),
                                        "cosine": c.flatten().double().cpu().numpy()}))
        return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True, eq=False)
class FinetuneAlignment:
    """Implicit trajectory of one query and the explicit SGD updates on its context-free input.

    ``explicit_u_in``/``explicit_u_gate``/``explicit_v`` have shape ``[layer, sgd_step, row, d]``:
    SGD step s added ``Σ_row u vᵀ`` (u already carries ``−lr``). ``rows`` names the
    context-free input's positions (BOS and query). ``losses[s]`` is the loss before step s
    (``losses[-1]`` after the last step).
    """

    implicit: Trajectory
    explicit_u_in: Float[Tensor, "layer sgd_step row d_mlp"]
    explicit_u_gate: Float[Tensor, "layer sgd_step row d_mlp"] | None
    explicit_v: Float[Tensor, "layer sgd_step row d_model"]
    rows: tuple[int, ...]
    losses: Float[Tensor, " sgd_step_plus_1"]
    lr: float
    target_token: str
    loss_name: str

    @property
    def layers(self) -> tuple[int, ...]:
        return self.implicit.layers

    @property
    def n_sgd_steps(self) -> int:
        return self.explicit_v.shape[1]

    def _row_slice(self, rows: str) -> slice:
        if rows == "all":
            return slice(None)
        if rows == "query":
            return slice(len(self.rows) - 1, None)
        raise ValueError(f"rows must be 'all' or 'query', got {rows!r}")

    def _explicit_terms(self, rows: str = "all") -> tuple[Tensor, Tensor]:
        sel = self._row_slice(rows)
        u = stack_outputs(self.explicit_u_in, self.explicit_u_gate)
        return _terms(u[:, :, sel], self.explicit_v[:, :, sel])

    def _group(self, rows: str) -> int:
        return len(self.rows[self._row_slice(rows)])

    def explicit_norms(self, rows: str = "all") -> Float[Tensor, "layer sgd_step"]:
        """``‖E_s‖_F`` after s = 1..steps SGD steps.

        ``rows="query"`` keeps only the gradient terms of the query row (``g_t x_tᵀ``), the
        part of the SGD update that reads the query's own MLP input, leaving out the BOS row.
        """
        tu, tv = self._explicit_terms(rows)
        return cumulative_sum_norms(tu, tv, group=self._group(rows))

    def implicit_norms(self) -> Float[Tensor, " layer"]:
        """``‖Wₙ − W₀‖_F``, the full token patch of the query."""
        return self.implicit.cumulative_norms()[:, -1]

    def _implicit_steps(self) -> tuple[Tensor, Tensor]:
        return self.implicit.stacked_u().double(), self.implicit.v.double()

    def cosine_by_sgd_step(self, rows: str = "all") -> Float[Tensor, "layer sgd_step"]:
        """``cos(Wₙ − W₀, E_s)`` for s = 1..steps: the full implicit update vs the explicit update so far."""
        iu, iv = self._implicit_steps()
        tu, tv = self._explicit_terms(rows)
        inner = inner_with_terms(iu[:, -1:], iv[:, -1:], tu, tv)[:, 0]  # layer, term
        cum = inner.reshape(inner.shape[0], -1, self._group(rows)).sum(-1).cumsum(-1)
        den = patch_norm(iu[:, -1], iv[:, -1])[:, None] * self.explicit_norms(rows)
        return safe_divide(cum, den)

    def cosine(self, rows: str = "all") -> Float[Tensor, " layer"]:
        """``cos(Wₙ − W₀, E_steps)`` per layer: implicit vs total explicit update."""
        return self.cosine_by_sgd_step(rows)[:, -1]

    def cumulative_cosine(self, rows: str = "all") -> Float[Tensor, "layer step"]:
        """``cos(Wᵢ − W₀, E_steps)`` for context prefix lengths i = 0..n (0 at i = 0)."""
        iu, iv = self._implicit_steps()
        tu, tv = self._explicit_terms(rows)
        inner = inner_with_terms(iu, iv, tu, tv).sum(-1)  # layer, step
        den = patch_norm(iu, iv) * self.explicit_norms(rows)[:, -1:]
        return safe_divide(inner, den)

    def meta_gradient_cosine(self, rows: str = "all") -> Float[Tensor, "layer n"]:
        """``cos(Wᵢ − Wᵢ₋₁, E_steps)`` for i = 1..n: each context token's meta-gradient vs SGD."""
        iu, iv = self._implicit_steps()
        tu, tv = self._explicit_terms(rows)
        inner = inner_with_terms(iu, iv, tu, tv).sum(-1)
        step_inner = inner[:, 1:] - inner[:, :-1]
        den = self.implicit.meta_gradient_norms() * self.explicit_norms(rows)[:, -1:]
        return safe_divide(step_inner, den)

    def cosine_with_explicit_of(self, other: "FinetuneAlignment", rows: str = "all") -> Float[Tensor, " layer"]:
        """``cos(Wₙ − W₀ of self, E_steps of other)``: a control pairing this prompt's implicit
        update with another prompt's explicit update (same model and layers)."""
        if other.layers != self.layers:
            raise ValueError("both results must cover the same layers")
        iu, iv = self._implicit_steps()
        tu, tv = other._explicit_terms(rows)
        inner = inner_with_terms(iu[:, -1:], iv[:, -1:], tu, tv)[:, 0].sum(-1)
        return safe_divide(inner, patch_norm(iu[:, -1], iv[:, -1]) * other.explicit_norms(rows)[:, -1])

    def to_frame(self) -> pd.DataFrame:
        """Tidy table (layer, step, metric, value).

        ``cosine`` / ``cosine_query_row`` / ``implicit_norm`` / ``explicit_norm`` (step = -1: whole run),
        ``cosine_by_sgd_step`` / ``explicit_norm_by_sgd_step`` (step = SGD step s, 1..steps),
        ``cumulative_cosine`` (step = context prefix length i, 0..n),
        ``meta_gradient_cosine`` (step = i, 1..n).
        """
        series = {
            "cosine": (self.cosine()[:, None], -1),
            "cosine_query_row": (self.cosine("query")[:, None], -1),
            "implicit_norm": (self.implicit_norms()[:, None], -1),
            "explicit_norm": (self.explicit_norms()[:, -1:], -1),
            "cosine_by_sgd_step": (self.cosine_by_sgd_step(), 1),
            "explicit_norm_by_sgd_step": (self.explicit_norms(), 1),
            "cumulative_cosine": (self.cumulative_cosine(), 0),
            "meta_gradient_cosine": (self.meta_gradient_cosine(), 1),
        }
        rows = []
        for metric, (values, first) in series.items():
            values = values.detach().cpu().double()
            for k, layer in enumerate(self.layers):
                for j in range(values.shape[1]):
                    rows.append((layer, first + j if first >= 0 else -1, metric, float(values[k, j])))
        return pd.DataFrame(rows, columns=["layer", "step", "metric", "value"])
