"""Explicit SGD on the first dense MLP weights, kept factored, versus the implicit update.

Dherin et al. 2025 (arXiv 2507.16003, §4): the implicit update of a context is compared
with explicit finetuning on the context-free input. Here (see
:mod:`icl_lens.core.finetune_alignment` for the formulas):

- input: the context-free input of query ``t``, ``[BOS, x_t]`` (``x_t`` at its original
  position id; just ``[x_t]`` without a BOS), the same input the token patches act on;
- trained weights: ``W_in`` (``W_up``) and ``W_gate`` of every layer, all at once; no
  biases, norms, attention or embeddings;
- loss (default): cross-entropy at the query toward the contextual next-token prediction
  (argmax of the model's logits at ``t`` with the full context); or any callback
  ``loss(logits_at_query, contextual_logits) -> scalar``;
- optimiser: plain SGD, ``W ← W − lr ∇_W L``, ``steps`` times.

The model's parameters are never written: the current explicit update is applied
as a factored edit ``ΔW x = Σ U (V·x)`` (:mod:`icl_lens.model.weight_edits`), and the gradient is read with
``torch.autograd.grad`` at zero-valued probes added to the dense outputs,
``∇_W L = Σ_rows g xᵀ`` with ``g = ∂L/∂(W x)``. No ``.grad`` is accumulated anywhere.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from icl_lens.core.finetune_alignment import FinetuneAlignment
from icl_lens.model.block_family import block_family
from icl_lens.model.kept_only import kept_only_masks
from icl_lens.model.trajectory_capture import Prompt, resolve_query, trajectory
from icl_lens.model.weight_edits import MLPEdit, edits_applied

LossFn = Callable[[Tensor, Tensor], Tensor]


def contextual_target_loss(logits_at_query: Tensor, contextual_logits: Tensor) -> Tensor:
    """Cross-entropy of the context-free logits toward the contextual argmax token."""
    return F.cross_entropy(logits_at_query[None], contextual_logits.argmax()[None])


def finetune_alignment(
    model,
    prompt: Prompt,
    *,
    query: int = -1,
    lr: float = 1e-3,
    steps: int = 5,
    loss: LossFn | None = None,
) -> FinetuneAlignment:
    """Explicit SGD on the context-free input vs the implicit token-patch update, per layer.

    Returns a :class:`FinetuneAlignment` holding the implicit :class:`Trajectory` of the
    query and the explicit updates in factored form; ``.cosine()`` is the per-layer
    cosine between the token patch ``Wₙ − W₀`` and the total SGD update, and
    ``.cosine_by_sgd_step()`` / ``.meta_gradient_cosine()`` / ``.cumulative_cosine()``
    follow it along the SGD steps and along the context. The model is left unchanged.
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not (isinstance(lr, (int, float)) and lr > 0 and lr == lr and lr != float("inf")):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    setup = resolve_query(model, prompt, query)
    implicit = trajectory(model, setup.ids, query=setup.query)
    family = block_family(model)
    ids, t = setup.ids, setup.query
    loss_fn = loss or contextual_target_loss
    with torch.no_grad():
        contextual = model(ids[: t + 1][None])[0, -1].detach()
    kept = torch.tensor(([0] if setup.kept_bos else []) + [t], device=ids.device)[None]
    mask = kept_only_masks(model, kept)
    n_layers, n_rows, dtype = model.cfg.n_layers, kept.shape[1], model.cfg.dtype
    hist_v: list[list[Tensor]] = [[] for _ in range(n_layers)]
    hist_in: list[list[Tensor]] = [[] for _ in range(n_layers)]
    hist_gate: list[list[Tensor]] = [[] for _ in range(n_layers)]
    losses: list[float] = []

    def run(probes_in, probes_gate) -> tuple[Tensor, list[Tensor]]:
        inputs: list[Tensor | None] = [None] * n_layers
        edits = {layer: MLPEdit(v=torch.stack(hist_v[layer]), u_in=torch.stack(hist_in[layer]),
                                u_gate=torch.stack(hist_gate[layer]) if family.gated else None)
                 for layer in range(n_layers) if hist_v[layer]}

        def read(x, hook, layer):
            inputs[layer] = x[0]

        probes = [(family.mlp_input(layer), lambda x, hook, layer=layer: read(x, hook, layer)) for layer in range(n_layers)]
        probes += [(family.dense_in_out(layer), lambda x, hook, p=probes_in[layer]: x + p[None]) for layer in range(n_layers)]
        if family.gated:
            probes += [(family.dense_gate_out(layer), lambda x, hook, p=probes_gate[layer]: x + p[None])
                       for layer in range(n_layers)]
        with edits_applied(model, edits, family=family, extra_hooks=probes):
            logits = model(ids[kept], position_ids=kept, attention_mask=mask)[0, -1]
        value = loss_fn(logits, contextual)
        if value.ndim != 0 or not torch.isfinite(value):
            raise ValueError(f"the loss must be a finite scalar, got {value!r}")
        return value, inputs

    def zeros() -> list[Tensor]:
        return [torch.zeros(n_rows, model.cfg.d_mlp, dtype=dtype, device=ids.device, requires_grad=True)
                for _ in range(n_layers)]

    with torch.enable_grad():
        for _ in range(steps):
            probes_in, probes_gate = zeros(), zeros() if family.gated else []
            value, inputs = run(probes_in, probes_gate)
            grads = torch.autograd.grad(value, probes_in + probes_gate, allow_unused=True)
            losses.append(float(value.detach()))
            for layer in range(n_layers):
                g_in = grads[layer]
                hist_v[layer].extend(inputs[layer].detach())
                hist_in[layer].extend(-lr * (torch.zeros_like(probes_in[layer]) if g_in is None else g_in))
                if family.gated:
                    g_gate = grads[n_layers + layer]
                    hist_gate[layer].extend(-lr * (torch.zeros_like(probes_gate[layer]) if g_gate is None else g_gate))
        with torch.no_grad():
            final, _ = run(zeros(), zeros() if family.gated else [])
            losses.append(float(final))

    def stacked(hist: list[list[Tensor]]) -> Tensor:
        return torch.stack([torch.stack(h).reshape(steps, n_rows, -1) for h in hist]).detach()

    return FinetuneAlignment(
        implicit=implicit,
        explicit_u_in=stacked(hist_in),
        explicit_u_gate=stacked(hist_gate) if family.gated else None,
        explicit_v=stacked(hist_v),
        rows=tuple(int(p) for p in kept[0]),
        losses=torch.tensor(losses, dtype=torch.float64),
        lr=float(lr),
        target_token=model.tokenizer.decode([int(contextual.argmax())]),
        loss_name=getattr(loss_fn, "__name__", type(loss_fn).__name__),
    )
