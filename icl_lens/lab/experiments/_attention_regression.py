"""Experiment 6 — attention as regression (McDermott, Heath, Parhi 2026, arXiv 2606.25342).

Checked at float64 on the trained models, every layer and head:

- softmax attention output ``z_t`` == Nadaraya–Watson estimator with kernel
  ``exp(q·k/√d)`` on the same keys/values (the causal prefix) — an exact identity;
- normalised linear attention == Nadaraya–Watson with kernel ``φ(q)·φ(k)``, and == the
  fixed-state read-out ``S_t φ(q_t)/(ζ_tᵀ φ(q_t))``;
- each linear-attention state update ``S_t − S_{t−1}`` == ``−∇_S`` of the Hebbian loss
  ``−⟨S φ(k_t), v_t⟩`` at ``S_{t−1}`` (autograd); each delta-rule update == ``−β_t ∇_S`` of
  ``½‖S k_t − v_t‖²``, and the step shrinks that loss by exactly ``(1 − β_t)²``.

Rows hold the max relative error of each identity (and, for the delta rule, the fraction
of steps that decreased the current pair's loss).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from icl_lens.lab._kernel_regression import feature_kernel_regression, nadaraya_watson
from icl_lens.lab._online_regression import delta_loss, hebbian_loss, loss_gradient
from icl_lens.lab._checkpoints import load_lab_model
from icl_lens.lab._model import LAB_FAMILY
from icl_lens.lab._tasks import sample_prompts
from icl_lens.model._reading import activations_captured


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(torch.finfo(b.dtype).tiny))


@dataclass(frozen=True, eq=False)
class RegressionViewResult:
    """One row per identity checked."""

    rows: tuple[dict, ...]

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.rows))

    def error(self, check: str) -> float:
        return next(r["max_rel_error"] for r in self.rows if r["check"] == check)


def _read(model, tokens: torch.Tensor, mixer: str, with_input: bool = False) -> dict[str, torch.Tensor]:
    """The contextual layer's hook points ``mixer`` (letters or names) of every layer, read in one forward."""
    names = [LAB_FAMILY.mixer(l, h) for l in range(model.cfg.n_layers) for h in mixer]
    names += [LAB_FAMILY.mix_in(l) for l in range(model.cfg.n_layers)] if with_input else []
    with activations_captured(model, names) as cache:
        model(tokens)
    return cache


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)  # batch pos head d → batch head pos d


@torch.no_grad()
def attention_as_regression(*, n_prompts: int = 8, n_context: int = 16, seed: int = 4) -> RegressionViewResult:
    """The six identities above, worst case over prompts, layers, heads and positions."""
    rows = []
    dt = torch.float64
    p = sample_prompts(n_prompts, n_context, 4, generator=torch.Generator().manual_seed(seed), dtype=dt)
    T = n_context + 1
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    model = load_lab_model("softmax", dt)
    cache = _read(model, p.tokens, "qkvz")
    err = max(_rel(nadaraya_watson(*(_heads_first(cache[LAB_FAMILY.mixer(l, h)]) for h in "qkv"), mask=causal),
                   _heads_first(cache[LAB_FAMILY.mixer(l, "z")])) for l in range(model.cfg.n_layers))
    rows.append({"arch": "softmax", "check": "softmax attention == Nadaraya-Watson (exp kernel)", "max_rel_error": err})

    model = load_lab_model("linear", dt)
    cache = _read(model, p.tokens, "qkvz", with_input=True)
    nw, state, hebb = 0.0, 0.0, 0.0
    for l, block in enumerate(model.blocks):
        q, k, v = (_heads_first(cache[LAB_FAMILY.mixer(l, h)]) for h in "qkv")
        z = _heads_first(cache[LAB_FAMILY.mixer(l, "z")])
        nw = max(nw, _rel(feature_kernel_regression(q, k, v, mask=causal), z))
        S = block.mix.states(cache[LAB_FAMILY.mix_in(l)])  # batch pos head dv dk
        zeta = cache[LAB_FAMILY.mixer(l, "k")].cumsum(1)
        qq = cache[LAB_FAMILY.mixer(l, "q")]
        readout = torch.einsum("bthvk,bthk->bthv", S, qq) / (zeta * qq).sum(-1, keepdim=True)
        state = max(state, _rel(readout, cache[LAB_FAMILY.mixer(l, "z")]))
        prev = torch.cat([torch.zeros_like(S[:, :1]), S[:, :-1]], 1)
        kk, vv = cache[LAB_FAMILY.mixer(l, "k")], cache[LAB_FAMILY.mixer(l, "v")]
        hebb = max(hebb, _rel(S - prev, -loss_gradient(hebbian_loss, prev, kk, vv)))
    rows += [{"arch": "linear", "check": "linear attention == Nadaraya-Watson (feature kernel)", "max_rel_error": nw},
             {"arch": "linear", "check": "linear attention == fixed-state read-out S φ(q)/(ζ·φ(q))", "max_rel_error": state},
             {"arch": "linear", "check": "state update == -grad Hebbian loss -<S k, v>", "max_rel_error": hebb}]

    model = load_lab_model("delta", dt)
    cache = _read(model, p.tokens, ("k", "v", "beta"), with_input=True)
    grad_err, shrink_err, decreased, total = 0.0, 0.0, 0, 0
    for l, block in enumerate(model.blocks):
        S = block.mix.states(cache[LAB_FAMILY.mix_in(l)])
        prev = torch.cat([torch.zeros_like(S[:, :1]), S[:, :-1]], 1)
        k, v = cache[LAB_FAMILY.mixer(l, "k")], cache[LAB_FAMILY.mixer(l, "v")]
        beta = cache[LAB_FAMILY.mixer(l, "beta")]
        grad_err = max(grad_err, _rel(S - prev, -beta[..., None, None] * loss_gradient(delta_loss, prev, k, v)))
        before, after = delta_loss(prev, k, v), delta_loss(S, k, v)
        shrink_err = max(shrink_err, _rel(after, (1 - beta) ** 2 * before))
        decreased += int((after < before).sum())
        total += after.numel()
    rows += [{"arch": "delta", "check": "state update == -beta grad delta loss ½‖S k − v‖²", "max_rel_error": grad_err},
             {"arch": "delta", "check": "loss after step == (1-beta)² × loss before", "max_rel_error": shrink_err,
              "fraction_steps_decreasing_loss": decreased / total}]
    return RegressionViewResult(tuple(rows))
