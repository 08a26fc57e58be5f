"""Explicit SGD on the first dense MLP weights, kept factored, versus the implicit update.

Dherin et al. 2025 (arXiv 2507.16003, §4): the implicit update of a context is compared
with explicit finetuning on the context-free input. Here (see
:mod:`icl_lens.dynamics._sgd_alignment` for the formulas):

- input: the context-free input of query ``t``, ``[BOS, x_t]`` (``x_t`` at its original
  position id; just ``[x_t]`` without a BOS), the same input the token patches act on;
- trained weights: ``W_in`` (``W_up``) and ``W_gate`` of every layer, all at once; no
  biases, norms, attention or embeddings;
- loss (default): cross-entropy at the query toward the contextual next-token prediction
  (argmax of the model's logits at ``t`` with the full context); or any callback
  ``loss(logits_at_query, contextual_logits) -> scalar``;
- optimiser: plain SGD, ``W ← W − lr ∇_W L``, ``steps`` times.

The model's parameters are never written: the current explicit update is applied
as a factored edit ``ΔW x = Σ U (V·x)`` (:mod:`icl_lens.model._weight_edits`), and the gradient is read with
``torch.autograd.grad`` at zero-valued probes added to the dense outputs,
``∇_W L = Σ_rows g xᵀ`` with ``g = ∂L/∂(W x)`` (:func:`dense_gradients`, for a batch of
independent inputs at once). No ``.grad`` is accumulated anywhere.

*The paper's protocol on a language model* (:func:`context_token_steps`): one SGD step per
context token ``cⱼ`` on its own context-free input ``[BOS, cⱼ]`` (``cⱼ`` at its original
position id), loss = cross-entropy toward the token that follows it in the prompt (the
query token after the last context token), taken at the pretrained weights ``W₀``: SGD
in the small-learning-rate limit, where the order of the steps does not matter and the
cosines do not depend on the rate. The query's own step (``[BOS, x_t]`` toward the
contextual argmax) comes from the same batched forward and backward.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from icl_lens.core._factored import stack_outputs
from icl_lens.dynamics._sgd_alignment import FinetuneAlignment
from icl_lens.model._block_family import block_family
from icl_lens.model._greedy import last_logits
from icl_lens.model._reading import activations_captured
from icl_lens.patches._kept_only import kept_only_masks
from icl_lens.dynamics._trajectory_capture import Prompt, resolve_query, trajectory
from icl_lens.model._weight_edits import MLPEdit, edits_applied

if TYPE_CHECKING:
    from icl_lens.model._types import Model

LossFn = Callable[[Tensor, Tensor], Tensor]


def contextual_target_loss(logits_at_query: Tensor, contextual_logits: Tensor) -> Tensor:
    """Cross-entropy of the context-free logits toward the contextual argmax token."""
    return F.cross_entropy(logits_at_query[None], contextual_logits.argmax()[None])


def dense_gradients(model, ids: Tensor, positions: Tensor, loss_fn: Callable[[Tensor], Tensor], *,
                    edits: dict[int, MLPEdit] | None = None, layers: Sequence[int] | None = None):
    """Gradient factors of a loss w.r.t. the first dense MLP weights of every layer, for a batch of inputs.

    ``ids``/``positions``: ``[batch, row]`` token ids and their position ids (kept-only
    inputs; sliding windows measured in original positions). ``loss_fn(logits_at_last_row)``
    maps ``[batch, vocab]`` to a scalar; with a sum over the batch each row's gradient is its
    own input's. Returns ``(loss, g_in, g_gate, x)``: per layer ``[batch, row, d]`` tensors with
    ``∇_{W_in} L = Σ_rows g_in xᵀ`` (``g_gate`` is None for ungated MLPs). ``edits`` are applied
    during the forward (:mod:`icl_lens.model._weight_edits`); the model is left unchanged.
    """
    def forward_loss() -> Tensor:
        logits = model(ids, position_ids=positions, attention_mask=kept_only_masks(model, positions),
                       logits_to_keep=1)[:, -1]  # the unembedding of the last row only
        value = loss_fn(logits)
        if value.ndim != 0 or not torch.isfinite(value):
            raise ValueError(f"the loss must be a finite scalar, got {value!r}")
        return value

    return dense_gradient_factors(model, forward_loss, tuple(ids.shape), dtype=model.cfg.dtype, device=ids.device,
                                  edits=edits, layers=layers)


def dense_gradient_factors(model, forward_loss: Callable[[], Tensor], shape: tuple[int, int], *, dtype: torch.dtype,
                           device: torch.device | str, edits: dict[int, MLPEdit] | None = None,
                           layers: Sequence[int] | None = None):
    """The gradient mechanism of :func:`dense_gradients` for any model with a block family (the
    regression lab's too): ``forward_loss()`` runs ``model`` on inputs of ``shape`` = ``[batch, row]``
    and returns a scalar loss; zero probes added to every dense output carry ``g = ∂L/∂(W x)``.
    Returns ``(loss, g_in, g_gate, x)`` as :func:`dense_gradients` does.
    """
    family = block_family(model)
    layers = tuple(range(model.cfg.n_layers)) if layers is None else tuple(layers)
    B, R = shape

    def zeros() -> dict[int, Tensor]:
        return {layer: torch.zeros(B, R, model.cfg.d_mlp, dtype=dtype, device=device, requires_grad=True)
                for layer in layers}

    probes_in, probes_gate = zeros(), zeros() if family.gated else {}
    edits = dict(edits or {})
    for layer in layers:  # the probes are biases on the dense outputs, applied after each layer's own edit
        edits[layer] = replace(edits.get(layer, MLPEdit()), in_bias=probes_in[layer], gate_bias=probes_gate.get(layer))
    sites = [family.mlp_input(layer) for layer in layers]
    with torch.enable_grad(), edits_applied(model, edits, family=family), activations_captured(model, sites) as inputs:
        value = forward_loss()
        wrt = [probes_in[layer] for layer in layers] + [probes_gate[layer] for layer in probes_gate]
        grads = torch.autograd.grad(value, wrt, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, wrt)]
    g_in = torch.stack(grads[: len(layers)]).detach()
    g_gate = torch.stack(grads[len(layers):]).detach() if family.gated else None
    x = torch.stack([inputs[site] for site in sites])
    return value.detach(), g_in, g_gate, x


def finetune_alignment(
    model: Model,
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
    The paper's per-context-token protocol is :func:`context_token_steps`.
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
    n_rows = kept.shape[1]
    hist_v, hist_in, hist_gate = [], [], []
    losses: list[float] = []

    def edits() -> dict[int, MLPEdit]:
        if not hist_v:
            return {}
        v, u_in = torch.cat(hist_v, 1), torch.cat(hist_in, 1)  # layer, k, d
        u_gate = torch.cat(hist_gate, 1) if family.gated else None
        return {layer: MLPEdit(v=v[layer], u_in=u_in[layer], u_gate=None if u_gate is None else u_gate[layer])
                for layer in range(model.cfg.n_layers)}

    def step_loss(logits: Tensor) -> Tensor:
        return loss_fn(logits[0], contextual)

    for _ in range(steps):
        value, g_in, g_gate, x = dense_gradients(model, ids[kept], kept, step_loss, edits=edits())
        losses.append(float(value))
        hist_v.append(x[:, 0])
        hist_in.append(-lr * g_in[:, 0])
        if family.gated:
            hist_gate.append(-lr * g_gate[:, 0])
    with torch.no_grad():
        with edits_applied(model, edits(), family=family):
            logits = model(ids[kept], position_ids=kept, attention_mask=kept_only_masks(model, kept))[0, -1]
        losses.append(float(loss_fn(logits, contextual)))

    def stacked(hist: list[Tensor]) -> Tensor:
        return torch.stack(hist, 1).reshape(model.cfg.n_layers, steps, n_rows, -1)

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


@dataclass(frozen=True, eq=False)
class ContextTokenSteps:
    """One gradient-descent direction per context token, and the query's own, at ``W₀`` (factored).

    Step ``j`` (context token ``c_{j+1}`` at prompt position ``positions[j]``) is
    ``Σ_row u[:, j, row] v[:, j, row]ᵀ`` per layer, ``u = −[g_gate; g_in]`` (the descent
    direction; any learning rate only scales it), ``v`` the MLP input; ``rows`` are the
    input rows (BOS, token). ``query_u``/``query_v`` hold the query's step. ``losses[j]``
    is the cross-entropy of step ``j`` toward ``targets[j]``.
    """

    layers: tuple[int, ...]
    positions: tuple[int, ...]
    targets: tuple[str, ...]
    u: Float[Tensor, "layer n row d_u"]
    v: Float[Tensor, "layer n row d_in"]
    query_u: Float[Tensor, "layer row d_u"]
    query_v: Float[Tensor, "layer row d_in"]
    losses: Float[Tensor, " n"]
    query_loss: float

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"position": list(self.positions), "target": list(self.targets),
                             "loss": self.losses.double().cpu().numpy()})


def context_token_steps(model: Model, prompt: Prompt, *, query: int = -1, layers: Sequence[int] | None = None) -> ContextTokenSteps:
    """The explicit side of the paper's protocol on a language model: one step per context token.

    Context token ``cⱼ`` (every position strictly between the kept BOS and the query) runs as
    ``[BOS, cⱼ]`` at its original position id, loss = cross-entropy toward the next prompt
    token; the query runs as ``[BOS, x_t]`` toward the contextual argmax. One batched
    forward and backward at the pretrained weights (see the module docstring).
    """
    return context_token_steps_many(model, [prompt], query=query, layers=layers)[0]


def context_token_steps_many(model: Model, prompts: Sequence[Prompt], *, query: int = -1, layers: Sequence[int] | None = None,
                             batch_rows: int = 128, progress: bool = False) -> list[ContextTokenSteps]:
    """:func:`context_token_steps` for many prompts; their rows share batched forwards and backwards
    (``batch_rows`` inputs each), so the unembedding runs once per batch instead of once per prompt."""
    setups = [resolve_query(model, p, query) for p in prompts]
    rows, targets = [], []
    queries = []
    for k, setup in enumerate(setups):
        ids, t = setup.ids, setup.query
        bos = [0] if setup.kept_bos else []
        ctx = list(setup.context_positions)
        rows += [(k, bos + [p]) for p in ctx + [t]]
        targets += [int(ids[p + 1]) for p in ctx] + [-1]  # the query's target: the contextual argmax, below
        queries.append(ids[: t + 1].tolist())
    with torch.no_grad():
        argmax = last_logits(model, queries).argmax(-1)
    for k in range(len(setups)):
        targets[[i for i, (o, _) in enumerate(rows) if o == k][-1]] = int(argmax[k])
    outs: dict[str, list[Tensor]] = {"u": [], "x": [], "ce": []}
    for start in tqdm(range(0, len(rows), batch_rows), desc="gradient steps", disable=not progress):
        chunk = range(start, min(start + batch_rows, len(rows)))
        width = {len(rows[i][1]) for i in chunk}
        if len(width) != 1:
            raise ValueError("every input of a batch must keep the same number of rows (BOS handling differs)")
        pos = torch.tensor([rows[i][1] for i in chunk], device=setups[0].ids.device)
        ids = torch.stack([setups[rows[i][0]].ids[p] for i, p in zip(chunk, pos)])
        tgt = torch.tensor([targets[i] for i in chunk], device=ids.device)
        per_row: list[Tensor] = []

        def loss_fn(logits: Tensor, tgt=tgt, per_row=per_row) -> Tensor:
            wide = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
            ce = F.cross_entropy(wide, tgt, reduction="none")
            per_row.append(ce.detach())
            return ce.sum()

        _, g_in, g_gate, x = dense_gradients(model, ids, pos, loss_fn, layers=layers)
        outs["u"].append(-stack_outputs(g_in, g_gate))
        outs["x"].append(x)
        outs["ce"].append(per_row[0].double().cpu())
    u, x, ce = torch.cat(outs["u"], 1), torch.cat(outs["x"], 1), torch.cat(outs["ce"])
    result, first = [], 0
    for k, setup in enumerate(setups):
        n = len(setup.context_positions)
        sl = slice(first, first + n + 1)
        uk, xk, cek = u[:, sl], x[:, sl], ce[sl]
        result.append(ContextTokenSteps(
            layers=tuple(range(model.cfg.n_layers)) if layers is None else tuple(layers),
            positions=tuple(setup.context_positions),
            targets=tuple(model.tokenizer.decode([targets[first + j]]) for j in range(n)),
            u=uk[:, :-1], v=xk[:, :-1], query_u=uk[:, -1], query_v=xk[:, -1], losses=cek[:-1],
            query_loss=float(cek[-1])))
        first += n + 1
    return result
