"""`Trajectory`: the implicit weights W₀..Wₙ of one query as context is consumed (docs/design.md §3).

Dherin et al. 2025 (arXiv 2507.16003, §3, "implicit learning dynamics"). For query ``t``
with context ``c₁..cₙ`` (the positions strictly between a kept BOS and ``t``), ``Wᵢ`` is
the set of per-layer weights that makes the context-free input (``[BOS, x_t]``, ``x_t``
at its original position) reproduce the output the model gives with context
``c₁..cᵢ``. Per layer ``l`` it is a token patch (docs/design.md §2) for the kept set
``{BOS, c₁..cᵢ, t}``:

    W_in,i   = W_in   + u_in[l,i] v[l,i]ᵀ       (W_up for gated MLPs)
    W_gate,i = W_gate + u_gate[l,i] v[l,i]ᵀ     (gated MLPs)
    b_out,i  = b_out  + correction[l,i]         (skip-connection term)

``W₀`` is the unpatched weight (``u = 0``, ``correction = 0``). That is the *prefix*
order. In the *absorb* order (the paper's) ``Wᵢ`` is the patch for the kept set
``{BOS, c_{i+1}..cₙ, t}``: ``c₁..cᵢ`` are absorbed into the weights while ``c_{i+1}..cₙ`` stay
in context, and the input ``[BOS, c_{i+1}..cₙ, x_t]`` (kept context tokens patched likewise)
reproduces the full-context output. Both orders start at ``W₀ = W`` and end at the same
``Wₙ``, the query's token patch. The meta-gradient of token ``cᵢ`` is ``Wᵢ − Wᵢ₋₁``; all metrics are closed-form in the factors
(:mod:`icl_lens.dynamics._trajectory_metrics`), never dense matrices.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from icl_lens.core._factored import stack_outputs
from icl_lens.core._power_law import power_law_fit
from icl_lens.dynamics._trajectory_metrics import (
    consecutive_alignment,
    cumulative_norms,
    meta_gradient_norms,
    step_norms_and_alignment,
    total_alignment,
)


@dataclass(frozen=True, eq=False)
class DecayFit:
    """Per layer: meta-gradient norm ``‖Wᵢ − Wᵢ₋₁‖ ≈ prefactor · i^(−exponent)`` (log-log least squares).

    ``exponent > 0`` means the steps shrink as context grows; the implicit weights
    converge only if the steps are summable as well (``exponent > 1``). ``r_squared``
    is the goodness of fit in log-log space; ``n_points`` counts the steps with nonzero
    norm that entered the fit (NaN fit values where it is below 2).
    """

    layers: tuple[int, ...]
    exponent: Float[Tensor, " layer"]
    prefactor: Float[Tensor, " layer"]
    r_squared: Float[Tensor, " layer"]
    n_points: Int[Tensor, " layer"]

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({
            "layer": list(self.layers),
            "exponent": self.exponent.double().numpy(),
            "prefactor": self.prefactor.double().numpy(),
            "r_squared": self.r_squared.double().numpy(),
            "n_points": self.n_points.numpy(),
        })


@dataclass(frozen=True, eq=False)
class StepMetrics:
    """Per layer: meta-gradient norms ``‖Wᵢ − Wᵢ₋₁‖`` (column k: context length ``norm_steps[k]``; 1..n for a
    full trajectory), the cosine of consecutive meta-gradients ``cos(Gᵢ₋₁, Gᵢ)`` (column k: ``i =
    alignment_steps[k]``; 2..n) and the power-law :class:`DecayFit` of the norms against i."""

    layers: tuple[int, ...]
    meta_gradient_norms: Float[Tensor, "layer n"]
    consecutive_alignment: Float[Tensor, "layer m"]
    fit: DecayFit
    norm_steps: tuple[int, ...]
    alignment_steps: tuple[int, ...]

    def to_frame(self) -> pd.DataFrame:
        """Tidy table (layer, step, metric, value); ``step`` is the prefix length i."""
        rows = []
        for metric, values, steps in (("meta_gradient_norm", self.meta_gradient_norms, self.norm_steps),
                                      ("consecutive_alignment", self.consecutive_alignment, self.alignment_steps)):
            values = values.detach().cpu().double()
            for k, layer in enumerate(self.layers):
                rows += [(layer, step, metric, float(values[k, j])) for j, step in enumerate(steps)]
        return pd.DataFrame(rows, columns=["layer", "step", "metric", "value"])


@dataclass(frozen=True, eq=False)
class Trajectory:
    """Implicit weights ``Wᵢ`` (i = 0..n context tokens) of one query, per layer, factored.

    Tensor rows follow ``layers`` (row k is model layer ``layers[k]``); steps follow the
    prefix length i = 0..n; ``context_positions[i-1]`` is the prompt position of ``cᵢ``.

    ``compact``: ``u_in`` holds ``R δ`` (d_model floats) instead of ``U = [W_gate; W_in] δ``, with
    ``R`` of the thin QR ``[W_gate; W_in] = Q R`` (as :func:`icl_lens.patch_norms` uses), and
    ``u_gate`` is None. ``Uᵢ·Uⱼ = (R δᵢ)·(R δⱼ)``, so every Frobenius metric below (norms,
    cosines, fits, :meth:`to_frame`) is the same; the factors themselves cannot be applied or
    compared with other updates (:meth:`stacked_u` refuses).

    ``steps``: a *coarse* trajectory holds ``Wᵢ`` for these prefix lengths only (column k is
    ``W_{steps[k]}``; ``trajectory(..., steps=...)``), each equal to the full trajectory's; None: all
    of 0..n. Of a coarse one, :meth:`step_metrics`, :meth:`cumulative_norms` (0 among the steps),
    :meth:`correction_norms` and :meth:`to_frame` give the values at the steps held; the methods that
    need every step refuse.

    ``kept_only_hidden``: the step-0 copy's input to the unembedding, the unpatched kept-only forward's
    last row (``trajectory(..., readout=True)``); None otherwise.
    """

    tokens: tuple[str, ...]
    query: int
    layers: tuple[int, ...]
    context_positions: tuple[int, ...]
    u_in: Float[Tensor, "layer step d_u"]  # d_mlp (d_model when compact)
    u_gate: Float[Tensor, "layer step d_mlp"] | None
    v: Float[Tensor, "layer step d_model"]
    correction: Float[Tensor, "layer step d_model"]
    model_name: str = ""
    kept_bos: bool = True
    order: str = "prefix"
    compact: bool = False
    steps: tuple[int, ...] | None = None
    kept_only_hidden: Float[Tensor, " d_model"] | None = None

    @property
    def n_context(self) -> int:
        """n, the number of context tokens (steps are 0..n)."""
        return len(self.context_positions)

    @property
    def coarse(self) -> bool:
        """Whether only some prefix lengths are held (:attr:`steps`)."""
        return self.steps is not None

    @property
    def step_lengths(self) -> tuple[int, ...]:
        """The prefix length i of each column (``0..n`` unless coarse)."""
        return tuple(range(self.n_context + 1)) if self.steps is None else self.steps

    def joined(self, other: Trajectory) -> Trajectory:
        """This trajectory's steps and ``other``'s (the same query, prompt, layers, order and form; no step held by
        both) in one, ordered by prefix length: the full trajectory when together they hold every step. The
        dashboard refines its coarse drawing this way, computing only the steps the coarse one lacks."""
        same = ("tokens", "query", "layers", "context_positions", "model_name", "kept_bos", "order", "compact")
        differ = [name for name in same if getattr(self, name) != getattr(other, name)]
        if differ:
            raise ValueError(f"cannot join trajectories that differ in {', '.join(differ)}")
        if (self.u_gate is None) != (other.u_gate is None):
            raise ValueError("cannot join trajectories that differ in u_gate (one model's gated MLP, one's not)")
        both = set(self.step_lengths) & set(other.step_lengths)
        if both:
            raise ValueError(f"both trajectories hold steps {sorted(both)}; join disjoint ones")
        lengths = self.step_lengths + other.step_lengths
        columns = sorted(range(len(lengths)), key=lengths.__getitem__)
        index = torch.tensor(columns, device=self.v.device)

        def cat(a: Tensor | None, b: Tensor | None) -> Tensor | None:
            return None if a is None else torch.cat([a, b.to(a.device)], dim=1)[:, index]

        steps = tuple(lengths[k] for k in columns)
        return replace(self, u_in=cat(self.u_in, other.u_in), u_gate=cat(self.u_gate, other.u_gate),
                       v=cat(self.v, other.v), correction=cat(self.correction, other.correction),
                       steps=None if steps == tuple(range(self.n_context + 1)) else steps,
                       kept_only_hidden=(self.kept_only_hidden if self.kept_only_hidden is not None
                                         else other.kept_only_hidden))

    def _every_step(self, what: str) -> None:
        if self.coarse:
            raise ValueError(f"{what} needs every step; this trajectory is coarse (steps={self.steps}): compute it "
                             f"with steps=None")

    def stacked_u(self) -> Float[Tensor, "layer step d_u"]:
        """``[u_gate; u_in]`` (or ``u_in``): the output factor of each step's whole patch."""
        if self.compact:
            raise ValueError("a compact trajectory holds R δ, not the output factors: compute it with compact=False")
        self._every_step("stacked_u")
        return self._outputs()

    def _outputs(self) -> Tensor:
        """The output factors as the Frobenius metrics read them (``R δ`` when compact)."""
        return stack_outputs(self.u_in, self.u_gate)

    def meta_gradient_norms(self) -> Float[Tensor, "layer n"]:
        """``‖Wᵢ₊₁ − Wᵢ‖_F``; column k is the meta-gradient of context token ``c_{k+1}``."""
        self._every_step("meta_gradient_norms")
        return meta_gradient_norms(self._outputs(), self.v)

    def step_metrics(self) -> StepMetrics:
        """Meta-gradient norms, consecutive alignment and decay fit from one pass over the factors
        (what the dashboard's trajectory panel draws; the same numbers as the three methods)."""
        outputs = [self.u_in] if self.u_gate is None else [self.u_gate, self.u_in]
        norms, consecutive = step_norms_and_alignment(outputs, self.v)  # of neighbouring columns
        lengths = self.step_lengths
        unit = [b - a == 1 for a, b in zip(lengths, lengths[1:])]  # column pair k is one step, i = lengths[k+1]
        norm_cols = [k for k, one in enumerate(unit) if one]
        align_cols = [k for k in range(len(unit) - 1) if unit[k] and unit[k + 1]]
        if self.coarse:
            norms, consecutive = norms[:, norm_cols], consecutive[:, align_cols]
        norm_steps = tuple(lengths[k + 1] for k in norm_cols)
        fit = power_law_fit(norms, None if not self.coarse else torch.tensor(norm_steps, dtype=torch.float64))
        return StepMetrics(layers=self.layers, meta_gradient_norms=norms, consecutive_alignment=consecutive,
                           fit=DecayFit(layers=self.layers, exponent=fit.exponent, prefactor=fit.prefactor,
                                        r_squared=fit.r_squared, n_points=fit.n_points),
                           norm_steps=norm_steps, alignment_steps=tuple(lengths[k + 2] for k in align_cols))

    def cumulative_norms(self) -> Float[Tensor, "layer step"]:
        """``‖Wᵢ − W₀‖_F`` for i = 0..n (column n is the full token patch norm; of a coarse trajectory, i in
        :attr:`steps`)."""
        if self.step_lengths[0] != 0:
            raise ValueError("cumulative norms need W₀: the coarse trajectory's steps do not hold 0")
        return cumulative_norms(self._outputs(), self.v)

    def consecutive_alignment(self) -> Float[Tensor, "layer m"]:
        """Cosine of consecutive meta-gradients; column k is ``cos(G_{k+1}, G_{k+2})`` (n−1 columns)."""
        self._every_step("consecutive_alignment")
        return consecutive_alignment(self._outputs(), self.v)

    def total_alignment(self) -> Float[Tensor, "layer n"]:
        """Cosine of each meta-gradient ``G_{k+1}`` with the total update ``Wₙ − W₀``."""
        self._every_step("total_alignment")
        return total_alignment(self._outputs(), self.v)

    def correction_norms(self) -> Float[Tensor, "layer step"]:
        """``‖attn_C − attn_0‖`` of each step (the skip-connection term, reported beside the patch)."""
        return torch.linalg.vector_norm(self.correction.double(), dim=-1)

    def decay_fit(self) -> DecayFit:
        """Power-law fit of the meta-gradient norm against the number of consumed tokens i (of a coarse
        trajectory: at the context lengths whose norm it holds, :meth:`step_metrics`)."""
        return self.step_metrics().fit

    def step_tokens(self) -> tuple[str, ...]:
        """Token consumed at each step i = 0..n ('' at step 0, which consumes nothing)."""
        self._every_step("step_tokens")
        return self._token_at(range(self.n_context + 1))

    def _token_at(self, lengths) -> tuple[str, ...]:
        return tuple("" if i == 0 else self.tokens[self.context_positions[i - 1]] for i in lengths)

    def to_frame(self) -> pd.DataFrame:
        """Tidy table (layer, step, token, metric, value); ``step`` is the prefix length i.

        Metrics: ``cumulative_norm`` and ``correction_norm`` (steps 0..n),
        ``meta_gradient_norm`` and ``total_alignment`` (steps 1..n, the step that consumed
        token cᵢ), ``consecutive_alignment`` (steps 2..n: ``cos(Gᵢ₋₁, Gᵢ)``).
        Of a coarse trajectory: the steps it holds (meta-gradient norms and consecutive alignment where
        :meth:`step_metrics` has them; no total alignment).
        """
        lengths = self.step_lengths
        if self.coarse:
            metrics = self.step_metrics()
            series = {
                "cumulative_norm": (self.cumulative_norms(), lengths),
                "correction_norm": (self.correction_norms(), lengths),
                "meta_gradient_norm": (metrics.meta_gradient_norms, metrics.norm_steps),
                "consecutive_alignment": (metrics.consecutive_alignment, metrics.alignment_steps),
            }
        else:
            series = {
                "cumulative_norm": (self.cumulative_norms(), lengths),
                "correction_norm": (self.correction_norms(), lengths),
                "meta_gradient_norm": (self.meta_gradient_norms(), lengths[1:]),
                "total_alignment": (self.total_alignment(), lengths[1:]),
                "consecutive_alignment": (self.consecutive_alignment(), lengths[2:]),
            }
        rows = []
        for metric, (values, steps) in series.items():
            values = values.detach().cpu().double()
            words = self._token_at(steps)
            for k, layer in enumerate(self.layers):
                rows += [(layer, step, words[j], metric, float(values[k, j])) for j, step in enumerate(steps)]
        return pd.DataFrame(rows, columns=["layer", "step", "token", "metric", "value"])
