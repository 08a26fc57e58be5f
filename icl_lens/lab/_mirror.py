"""The two mirror-image solutions of in-context regression with softmax attention (issue 39).

The task is odd: with ``y = wᵀx``, the pair ``(−x, −y)`` belongs to the same task as ``(x, y)``.
A softmax head can solve it two ways, which give the same predictions on the task but are
each other's mirror image:

- attend to the context inputs *similar* to the query (scores increasing with ``xⱼ·x_q``:
  ``Σⱼ αⱼ yⱼ`` correlates with ``y_q``) and read the label out with a positive slope;
- attend to the *opposite* inputs (scores decreasing with ``xⱼ·x_q``: ``Σⱼ αⱼ yⱼ``
  anti-correlates with ``y_q``) and read it out with a negative slope.

Which one training finds is decided at initialisation (the sign of the initial preference
below predicts it). The two differ where the task does not constrain them: how the query's
prediction moves when every context label moves together, the *label response*

    ρ = Σⱼ ∂ŷ_q/∂yⱼ        (> 0 for the similar-input solution, < 0 for the opposite one).

In the single block of Dherin et al. 2025 (arXiv 2507.16003, §5) an SGD step on ``W_in`` of the
context-free model is (almost) a shift of every prediction toward the example's label (all
context-free MLP inputs point the same way), so the implicit step's cosine with it takes the
sign of ρ: the per-step alignment's sign is that of the solution, not a convention of the cosine.

Functions: :func:`similarity_preference` (per head of the first layer, the correlation of the
query's attention scores with ``xⱼ·x_q``), :func:`label_response` (ρ and the task slope of the
predictions), :func:`readout_slope` (the MLP readout along the direction in which the
attention output carries the labels) and :func:`orient_attention` (at initialisation, negate
the query projection of every head that prefers opposite inputs: every seed then starts in
the similar-input basin; the recipe flag ``orient`` of :data:`icl_lens.lab.RECIPES`).
"""
from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from icl_lens.lab._model import LAB_FAMILY, RegressionModel
from icl_lens.lab._tasks import RegressionPrompts, sample_prompts
from icl_lens.model._reading import activations_captured

PROBE_PROMPTS = 256
PROBE_SEED = 12_345  # a fixed probe batch, apart from the training (seed + 1) and evaluation seeds


def probe_prompts(model: RegressionModel, n_prompts: int = PROBE_PROMPTS, seed: int = PROBE_SEED) -> RegressionPrompts:
    """The fixed probe batch of the diagnostics (``n_context_train`` pairs, the model's token layout and dtype)."""
    cfg = model.cfg
    return sample_prompts(n_prompts, cfg.n_context_train, cfg.d_x, generator=torch.Generator().manual_seed(seed),
                          dtype=model.dtype, query_flag=cfg.query_flag)


def _softmax_first_layer(model: RegressionModel) -> None:
    if model.cfg.arch != "softmax":
        raise ValueError(f"the attention preference is defined for softmax attention, not {model.cfg.arch!r}")


@torch.no_grad()
def similarity_preference(model: RegressionModel, prompts: RegressionPrompts | None = None) -> Float[Tensor, " head"]:
    """Per head of layer 0: the Pearson correlation, over prompts and context keys, of the query's attention
    score with ``xⱼ·x_q`` (> 0: the head attends to inputs similar to the query; < 0: to opposite ones)."""
    _softmax_first_layer(model)
    p = prompts if prompts is not None else probe_prompts(model)
    name = LAB_FAMILY.mixer(0, "attn_scores")
    with activations_captured(model, [name], stop_after=name) as got:
        model(p.tokens)
    scores = got[name][:, :, -1, :-1].double()  # batch × head × context key
    xs, _ = p.context_pairs()
    dots = torch.einsum("bnd,bd->bn", xs.double(), p.tokens[:, -1, : p.d_x].double())
    s = scores - scores.mean((0, 2), keepdim=True)
    d = (dots - dots.mean())[:, None]
    return (s * d).sum((0, 2)) / (s.pow(2).sum((0, 2)) * d.pow(2).sum()).sqrt()


def label_response(model: RegressionModel, prompts: RegressionPrompts | None = None
                   ) -> tuple[Float[Tensor, " prompt"], float]:
    """``ρ = Σⱼ ∂ŷ_q/∂yⱼ`` per prompt (autograd through the label slots of the context tokens) and the task
    slope ``Σ ŷ_q y_q / Σ y_q²`` of the query predictions (> 0 for a model that solves the task)."""
    p = prompts if prompts is not None else probe_prompts(model)
    tokens = p.tokens.clone().requires_grad_(True)
    with torch.enable_grad():
        pred = model(tokens)[:, -1]
        (grad,) = torch.autograd.grad(pred.sum(), tokens)
    rho = grad[:, :-1, p.d_x].sum(-1).detach()
    slope = float((pred.detach().double() * p.targets.double()).sum() / p.targets.double().pow(2).sum())
    return rho, slope


def readout_slope(model: RegressionModel, prompts: RegressionPrompts | None = None) -> Float[Tensor, " prompt"]:
    """The one-block model's readout along the label's value direction, per prompt: ``J · e`` with
    ``J = ∂ŷ_q/∂A_q`` at the query's contextual MLP input ``A_q`` and ``e`` the unit direction in which moving
    every context label moves ``A_q`` (``∂A_q/∂c`` for labels ``yⱼ + c``, normalised). ``ρ = J · ∂A_q/∂c``, so
    its sign is ρ's; the slope separates the readout from how much the attention weights the labels."""
    if model.cfg.n_layers != 1 or model.cfg.skip:
        raise ValueError("readout_slope is defined for one block without skip connections (A = the MLP input)")
    p = prompts if prompts is not None else probe_prompts(model)
    block = model.blocks[0]
    shift = torch.zeros_like(p.tokens)
    shift[:, :-1, p.d_x] = 1.0  # every context label
    with torch.enable_grad():
        c = torch.zeros(p.tokens.shape[0], dtype=p.tokens.dtype, requires_grad=True)
        # one block without skip connections: A = LN₂(M(LN₁(embed(tokens)))), ŷ = read_out(MLP(A))
        A = block.ln2(block.mix(block.ln1(model.embed(model.check_tokens(p.tokens + c[:, None, None] * shift)))))
        pred = model.read_out(block.mlp(A))[:, -1]
        J = torch.autograd.grad(pred.sum(), A, retain_graph=True)[0][:, -1]
        e = torch.stack([torch.autograd.grad(A[:, -1, k].sum(), c, retain_graph=True)[0] for k in range(A.shape[-1])], -1)
    e = e / e.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    return (J * e).sum(-1).detach()


@torch.no_grad()
def orient_attention(model: RegressionModel, prompts: RegressionPrompts | None = None) -> Bool[Tensor, " head"]:
    """Negate the query projection ``W_Q`` of every head of layer 0 whose scores fall with ``xⱼ·x_q``
    (:func:`similarity_preference` < 0), in place; returns which heads were flipped. Meant for an untrained
    model: its scores' sign, not their size, changes, so every head starts preferring similar inputs."""
    pref = similarity_preference(model, prompts)
    mix = model.blocks[0].mix
    flip = pref < 0
    rows = flip.repeat_interleave(mix.d_head)
    mix.W_Q.weight[rows] *= -1
    return flip
