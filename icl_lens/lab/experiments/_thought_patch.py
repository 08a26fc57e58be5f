"""Experiment 4 — a static thought patch from K calibration queries (arXiv 2507.16003 §5; arXiv 2510.08734, Algorithm 1).

For one prompt ``I`` (``n`` context pairs of one ``w``), layer by layer (η = 1):

1. contextual pass on ``[I, x_k]`` for the ``K`` calibration queries → ``A_l,k`` (MLP input)
   and the block output ``R_l,k``;
2. non-contextual pass on ``[x_k]`` with layers ``< l`` already edited → ``a_l,k``;
3. thought matrix ``Δ_l = (Σ W δ aᵀ)(Σ a aᵀ + λI)⁻¹``, ``δ = A − a``
   (:func:`icl_lens.core._least_squares.input_map`, ``Δ = W M``), ``λ = ridge · tr(Σ a aᵀ)/d_model`` (:func:`~icl_lens.core._least_squares.relative_ridge`);
4. thought vector: the mean gap between ``R_l,k`` and the edited non-contextual block
   output, added as an MLP-output bias (it carries the skip-connection part).

Then the edited model, given only the query, is scored on the calibration queries
(train) and on fresh queries (test): normalised MSE to the true ``y = wᵀx`` and to the
contextual model's own predictions (fidelity).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core._least_squares import input_map, relative_ridge
from icl_lens.lab._checkpoints import load_lab_model
from icl_lens.lab._model import LAB_FAMILY, RegressionModel
from icl_lens.lab._tasks import context_tokens, query_tokens
from icl_lens.model._reading import activations_captured
from icl_lens.model._weight_edits import MLPEdit, edits_applied


def _with_context(prompt: Tensor, x: Tensor) -> Tensor:
    return torch.cat([prompt[None].expand(x.shape[0], -1, -1), query_tokens(x)[:, None]], dim=1)


def _run(model: RegressionModel, tokens: Tensor, edits: dict, names: list[str]) -> tuple[Tensor, dict]:
    with edits_applied(model, edits), activations_captured(model, names) as got:
        pred = model(tokens)[:, -1]
    return pred, {n: x[:, -1] for n, x in got.items()}


@torch.no_grad()
def fit_thought_patch(model: RegressionModel, prompt: Float[Tensor, "n d_token"], calib_x: Float[Tensor, "k d_x"],
                      *, ridge: float = 1e-2) -> dict[int, MLPEdit]:
    """Algorithm 1 of arXiv 2510.08734 on the lab model: one static ``(Δ_l, b_l)`` per layer."""
    L = model.cfg.n_layers
    names = [name for l in range(L) for name in (LAB_FAMILY.mlp_input(l), LAB_FAMILY.resid_post(l))]
    _, ctx = _run(model, _with_context(prompt, calib_x), {}, names)
    alone = query_tokens(calib_x)[:, None]
    edits: dict[int, MLPEdit] = {}
    for l in range(L):
        _, got = _run(model, alone, edits, [LAB_FAMILY.mlp_input(l)])
        a = got[LAB_FAMILY.mlp_input(l)]
        m = input_map(ctx[LAB_FAMILY.mlp_input(l)] - a, a, ridge=relative_ridge(a, ridge))  # Δ = W_in M
        u_in = model.blocks[l].mlp.W_in.weight.T  # the lab block's W_in input is not hooked apart: factored form
        edits[l] = MLPEdit(v=m, u_in=u_in)
        _, got = _run(model, alone, edits, [LAB_FAMILY.resid_post(l)])
        bias = (ctx[LAB_FAMILY.resid_post(l)] - got[LAB_FAMILY.resid_post(l)]).mean(0)
        edits[l] = MLPEdit(v=m, u_in=u_in, bias=bias)
    return edits


@dataclass(frozen=True, eq=False)
class ThoughtPatchResult:
    """Rows per (prompt, K): train/test normalised MSE to ``y`` and to the contextual model, and baselines."""

    rows: tuple[dict, ...]

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.rows))

    def summary(self) -> pd.DataFrame:
        cols = ["train_mse", "test_mse", "train_fidelity", "test_fidelity", "contextual_test_mse", "no_context_test_mse"]
        return self.to_frame().groupby("K", as_index=False)[cols].mean()


@torch.no_grad()
def static_thought_patch(arch: str = "softmax", *, ks=(1, 2, 4, 8, 16, 32, 64), n_prompts: int = 8,
                         n_context: int = 16, n_test: int = 256, ridge: float = 1e-2, seed: int = 3,
                         model=None) -> ThoughtPatchResult:
    """Train vs test error of the thought patch as the number of calibration queries ``K`` grows."""
    model = model if model is not None else load_lab_model(arch)
    d = model.cfg.d_x
    g = torch.Generator().manual_seed(seed)
    rows = []
    for b in range(n_prompts):
        w = torch.randn(d, generator=g)
        xc = torch.randn(n_context, d, generator=g)
        prompt = context_tokens(xc, xc @ w)
        pool = torch.randn(max(ks), d, generator=g)
        test_x = torch.randn(n_test, d, generator=g)
        ctx_test, _ = _run(model, _with_context(prompt, test_x), {}, [])
        plain_test, _ = _run(model, query_tokens(test_x)[:, None], {}, [])
        for k in ks:
            cx = pool[:k]
            edits = fit_thought_patch(model, prompt, cx, ridge=ridge)
            ctx_train, _ = _run(model, _with_context(prompt, cx), {}, [])
            pt_train, _ = _run(model, query_tokens(cx)[:, None], edits, [])
            pt_test, _ = _run(model, query_tokens(test_x)[:, None], edits, [])
            mse = lambda p, t: float(((p - t) ** 2).mean() / d)  # noqa: E731
            rows.append({"prompt": b, "K": k,
                         "train_mse": mse(pt_train, cx @ w), "test_mse": mse(pt_test, test_x @ w),
                         "train_fidelity": mse(pt_train, ctx_train), "test_fidelity": mse(pt_test, ctx_test),
                         "contextual_test_mse": mse(ctx_test, test_x @ w),
                         "no_context_test_mse": mse(plain_test, test_x @ w)})
    return ThoughtPatchResult(tuple(rows))
