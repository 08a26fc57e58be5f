"""The one way icl_lens edits a model's MLPs: factored low-rank updates applied through hooks.

Every weight edit in the toolkit — a token patch (Dherin et al. 2025, arXiv 2507.16003),
a thought patch (Mazzawi, Dherin et al. 2025, arXiv 2510.08734), a steering vector, the
running update of explicit SGD, the regression lab's edits — changes the MLP's first
dense layer(s) ``W`` (``W_in``; ``W_gate`` and ``W_up`` for gated MLPs) and/or its down
projection ``W_out`` by sums of rank-1 terms, and may add a vector after the MLP branch:

    W_d  ←  W_d + Σ_k u_d[k] v[k]ᵀ          for d ∈ {in, gate}  (v shared by both)
    W_d x  ←  W_d x + b_d                    a bias on a first dense layer's output (per position:
                                             zero "probes" whose gradient is ∂L/∂(W_d x), explicit SGD)
    W_out  ←  W_out + Σ_k out_u[k] out_v[k]ᵀ                     (down projection)
    branch output  ←  branch output + bias                       (skip correction, bias site)
    post-FFN norm output  ←  (1 + w + g) ⊙ ŷ                     (gain site, Gemma-style)

The bias enters the residual stream at the block output of every position, so a
steering vector (a residual-stream addition at one layer) is the edit ``bias = s`` of
that layer: one mechanism for both.

A weight edit acts on whatever input arrives, so the hooks add ``Σ_k u_d[k] (v[k]·x)``
to each dense output for the actual MLP input ``x`` (and ``Σ_k out_u[k] (out_v[k]·h)``
to the down projection's output for its actual input ``h``); no ``d_mlp × d_model``
matrix is formed per token. A static input map ``Δ_d = W_d M`` of every first dense layer (a
thought matrix, :attr:`MLPEdit.m`) is applied to their input instead, ``W_d (x + M x)``: one
``d_model × d_model`` product per token rather than a ``d_mlp``-sized one per dense layer. (It is
the factored sum with ``v[k] = M[k, :]``, ``u_d[k] = W_d[:, k]``, the form a block whose dense
inputs are not hooked apart, :meth:`BlockFamily.dense_inputs`, is given: the regression lab's.)

An :class:`MLPEdit` has leading dimensions ``()`` (one edit for every position) or
``(batch, pos)`` (one edit per position of the input, e.g. each query's own token
patch); a ``pos`` of 1 broadcasts one edit per row over all its positions (e.g. each
SGD run's weights applied to many probe queries run alone). Arithmetic runs in the edit's dtype (float32 for half-precision models) and
the result is cast to the activation's dtype. Hooks live only inside
:func:`edits_applied`.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core._norms import rms_normalize
from icl_lens.model._block_family import BlockFamily, block_family, post_norm_eps
from icl_lens.model._reading import hooks_attached


@dataclass(frozen=True, eq=False)
class MLPEdit:
    """One layer's edit: ``ΔW_d = W_d M + Σ_k u_d[k] v[k]ᵀ`` (d = in, gate; ``m`` = M), ``ΔW_out``, a branch bias,
    a post-norm gain, and biases ``in_bias``/``gate_bias`` on the first dense layers' outputs.

    ``v``/``u_in``/``u_gate`` are ``[*lead, k, d]``, ``bias`` is ``[*lead, d_model]`` and
    ``in_bias``/``gate_bias`` are ``[*lead, d_mlp]`` with
    ``lead = ()`` (shared) or ``(batch, pos)`` (per input position); ``out_u``/``out_v``
    (``ΔW_out = Σ_j out_u[j] out_v[j]ᵀ``, ``[j, d_model]`` and ``[j, d_mlp]``) and ``gain``
    are always shared.
    """

    v: Float[Tensor, "*lead k d_model"] | None = None
    u_in: Float[Tensor, "*lead k d_mlp"] | None = None
    u_gate: Float[Tensor, "*lead k d_mlp"] | None = None
    bias: Float[Tensor, "*lead d_model"] | None = None
    gain: Float[Tensor, " d_model"] | None = None
    out_u: Float[Tensor, "j d_model"] | None = None
    out_v: Float[Tensor, "j d_mlp"] | None = None
    in_bias: Float[Tensor, "*lead d_mlp"] | None = None
    gate_bias: Float[Tensor, "*lead d_mlp"] | None = None
    m: Float[Tensor, "d_model d_model"] | None = None  # the static input map: ΔW_d = W_d M for every first dense layer

    def __post_init__(self) -> None:
        if (self.out_u is None) != (self.out_v is None):
            raise ValueError("out_u and out_v come together (ΔW_out = Σ_j out_u[j] out_v[j]ᵀ)")
        if self.out_u is not None and (self.out_u.ndim != 2 or self.out_v.ndim != 2
                                       or self.out_u.shape[0] != self.out_v.shape[0]):
            raise ValueError(f"out_u [j, d_model] and out_v [j, d_mlp] must share j; got "
                             f"{tuple(self.out_u.shape)} and {tuple(self.out_v.shape)}")

    @staticmethod
    def input_map(m: Float[Tensor, "d_model d_model"], *, bias: Tensor | None = None,
                  gain: Tensor | None = None) -> "MLPEdit":
        """The static edit ``Δ_d = W_d M`` of every first dense layer (with a branch bias or a gain)."""
        return MLPEdit(m=m, bias=bias, gain=gain)


def _coefficients(x: Tensor, v: Tensor) -> Tensor:
    """``v[k]·x`` for every position: ``[batch, pos, k]``."""
    x, v = x.to(v.dtype), v.to(x.device)  # a model split over devices: the edit goes to its layer's device
    return x @ v.T if v.ndim == 2 else torch.einsum("bpd,bpkd->bpk", x, v)


def _combine(coef: Tensor, u: Tensor) -> Tensor:
    """``Σ_k coef[k] u[k]`` for every position: ``[batch, pos, d_out]``."""
    u = u.to(device=coef.device, dtype=coef.dtype)
    return coef @ u if u.ndim == 2 else torch.einsum("bpk,bpkd->bpd", coef, u)


def _edit_hooks(model, edits: dict[int, MLPEdit], family: BlockFamily | None = None) -> list[tuple[str, object]]:
    """Forward hooks ``(name, fn)`` that apply ``edits`` (layer → edit); only :func:`edits_applied` adds them."""
    family = family or block_family(model)
    n_layers = len(model.blocks)
    hooks: list[tuple[str, object]] = []
    for layer, edit in edits.items():
        if not 0 <= layer < n_layers:
            raise IndexError(f"layer {layer} is outside the model (0..{n_layers - 1})")
        state: dict[str, Tensor] = {}
        if edit.m is not None:  # W_d (x + M x) for every first dense layer d
            if (inputs := family.dense_inputs(layer)) is None:
                raise ValueError(f"the {family.name} block's dense inputs are not hooked apart: give the input map in "
                                 "factored form, MLPEdit(v=M, u_in=W_inᵀ)")
            hooks += [(name, lambda x, hook, m=edit.m: x + _coefficients(x, m).to(x.dtype)) for name in inputs]
        if edit.v is not None:
            def read_input(x, hook, v=edit.v, state=state):
                state["coef"] = _coefficients(x, v)

            hooks.append((family.mlp_input(layer), read_input))
            for name, u in ((family.dense_in_out(layer), edit.u_in), (family.dense_gate_out(layer), edit.u_gate)):
                if u is not None:
                    hooks.append((name, lambda out, hook, u=u, state=state: out + _combine(state["coef"], u).to(out.dtype)))
        for name, b in ((family.dense_in_out(layer), edit.in_bias), (family.dense_gate_out(layer), edit.gate_bias)):
            if b is not None:
                hooks.append((name, lambda out, hook, b=b: out + b.to(device=out.device, dtype=out.dtype)))
        if edit.out_u is not None:
            def read_hidden(h, hook, v=edit.out_v, state=state):
                state["out_coef"] = h.to(v.dtype) @ v.T

            hooks.append((family.dense_out_input(layer), read_hidden))
            hooks.append((family.dense_out_output(layer),
                          lambda out, hook, u=edit.out_u, state=state: out + (state["out_coef"] @ u).to(out.dtype)))
        if edit.gain is not None:
            eps = post_norm_eps(model, layer)

            def read_branch(y, hook, eps=eps, state=state):
                state["yhat"] = rms_normalize(y, eps)

            hooks.append((family.post_norm_input(layer), read_branch))
            hooks.append((family.mlp_branch_out(layer),
                          lambda out, hook, g=edit.gain, state=state: out + (state["yhat"].to(g.dtype) * g.to(out.device)).to(out.dtype)))
        if edit.bias is not None:
            hooks.append((family.mlp_branch_out(layer), lambda out, hook, b=edit.bias: out + b.to(device=out.device, dtype=out.dtype)))
    return hooks


@contextmanager
def edits_applied(model, edits: dict[int, MLPEdit], *, family: BlockFamily | None = None):
    """Within the block, ``model`` runs with ``edits`` (layer → :class:`MLPEdit`). Hooks removed on exit.

    Reading activations under the edits is the read door's (:func:`~icl_lens.model.activations_captured`,
    nested inside this block)."""
    with hooks_attached(model, _edit_hooks(model, edits, family)):
        yield model
