"""Loss curves of in-context learning vs explicit finetuning on the same examples (arXiv 2507.16003, §5).

The first experiment of Dherin et al. 2025, on any lab model. For each prompt (task
``w``) with pairs ``c₁..cₙ`` and a shared set of held-out probe queries ``x_p``:

- *in context*: the prediction on ``x_p`` with the first ``i`` pairs in the prompt,
  ``i = 0..n`` (``i = 0`` is the context-free model);
- *finetuned*: the context-free model (``x_p`` alone) after ``i`` SGD steps on the first
  MLP matrix ``W_in`` (every layer's), one pair per step in the same order, loss
  ``½(ŷ − y)²`` (:func:`icl_lens.lab._regression_dynamics.sgd_on_pairs`), for every learning rate of
  a sweep (half decades from 1e-3 to 10); the best rate minimises the test error averaged
  over ``i = 1..n`` (diverging rates excluded).

Test error: mean over probes of ``(ŷ − wᵀx_p)²``, divided by ``d_x`` (the variance of ``y``).

Function-space alignment: per prompt and ``i``, the cosine over the probes between the
change of predictions caused by the context, ``Δf_ctx(i) = f_ctx(i) − f₀``, and by the
finetuning, ``Δf_sgd(i) = f_sgd(i) − f₀``; the control pairs ``Δf_ctx`` of one prompt with
``Δf_sgd`` of the next. Both changes reduce the error, i.e. both point roughly along the
residual ``y − f₀``; ``residual_cosines`` measures that, which is why a high function-space
cosine is nearly implied by both methods learning at all.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.stats._bootstrap import bootstrap_mean
from icl_lens.core._factored import safe_divide
from icl_lens.lab._checkpoints import load_lab_model
from icl_lens.lab._regression_dynamics import sgd_on_pairs
from icl_lens.lab._model import RegressionModel
from icl_lens.lab._tasks import prefix_batch, sample_prompts

LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0, 10.0)


def _cos(a: Tensor, b: Tensor) -> Tensor:
    a, b = a.double(), b.double()
    return safe_divide((a * b).sum(-1), a.norm(dim=-1) * b.norm(dim=-1))


@dataclass(frozen=True, eq=False)
class LossCurves:
    """Predictions on the probe queries after ``i = 0..n`` examples, in context and by SGD (every rate)."""

    name: str
    lrs: tuple[float, ...]
    d_x: int
    targets: Float[Tensor, "prompt probe"]
    in_context: Float[Tensor, "prompt n_plus_1 probe"]
    finetuned: Float[Tensor, "lr prompt n_plus_1 probe"]

    @property
    def n_context(self) -> int:
        return self.in_context.shape[1] - 1

    def errors(self) -> tuple[Float[Tensor, "prompt n_plus_1"], Float[Tensor, "lr prompt n_plus_1"]]:
        """Normalised test MSE per prompt and ``i``: in context, and finetuned at every rate."""
        err = lambda f: ((f - self.targets[..., None, :]) ** 2).mean(-1).double() / self.d_x  # noqa: E731
        return err(self.in_context), err(self.finetuned)

    @property
    def best(self) -> int:
        """Index of the rate with the lowest finetuned error averaged over ``i = 1..n`` (and prompts);
        a rate whose runs diverge (non-finite error) is never the best."""
        _, ft = self.errors()
        mean = ft[:, :, 1:].mean((1, 2))
        return int(torch.where(torch.isfinite(mean), mean, torch.full_like(mean, float("inf"))).argmin())

    def curves(self) -> pd.DataFrame:
        """Mean normalised test MSE against ``i`` with its 95% bootstrap interval over prompts."""
        ctx, ft = self.errors()
        rows = []
        for method, err in (("in context", ctx), (f"finetuned (lr {self.lrs[self.best]:g})", ft[self.best])):
            for i in range(self.n_context + 1):
                ci = bootstrap_mean(err[:, i].numpy())
                rows.append({"method": method, "examples": i, "test_mse": ci.mean, "low": ci.low, "high": ci.high})
        return pd.DataFrame(rows)

    def sweep(self) -> pd.DataFrame:
        """Per rate: finetuned error after ``n`` examples and averaged over ``i = 1..n``."""
        _, ft = self.errors()
        return pd.DataFrame({"lr": list(self.lrs), "test_mse_at_n": ft[:, :, -1].mean(1).numpy(),
                             "test_mse_mean_over_i": ft[:, :, 1:].mean((1, 2)).numpy(),
                             "best": [k == self.best for k in range(len(self.lrs))]})

    def function_cosines(self) -> dict[str, Float[Tensor, "prompt n"]]:
        """Per prompt and ``i = 1..n``: cos(Δf_ctx, Δf_sgd), the mismatched control, and each change's
        cosine with the residual ``y − f₀``."""
        f0 = self.in_context[:, :1]
        d_ctx = self.in_context[:, 1:] - f0
        d_sgd = self.finetuned[self.best][:, 1:] - f0
        resid = (self.targets[:, None] - f0).expand_as(d_ctx)
        return {"same_prompt": _cos(d_ctx, d_sgd), "control": _cos(d_ctx, d_sgd.roll(-1, 0)),
                "context_vs_residual": _cos(d_ctx, resid), "finetuned_vs_residual": _cos(d_sgd, resid)}

    def to_frame(self) -> pd.DataFrame:
        ctx, ft = self.errors()
        P, n1 = ctx.shape
        frames = [pd.DataFrame({"method": "in context", "lr": float("nan"), "prompt": torch.arange(P).repeat_interleave(n1).numpy(),
                                "examples": torch.arange(n1).repeat(P).numpy(), "test_mse": ctx.flatten().numpy()})]
        for k, lr in enumerate(self.lrs):
            frames.append(pd.DataFrame({"method": "finetuned", "lr": lr, "prompt": torch.arange(P).repeat_interleave(n1).numpy(),
                                        "examples": torch.arange(n1).repeat(P).numpy(), "test_mse": ft[k].flatten().numpy()}))
        return pd.concat(frames, ignore_index=True)


@torch.no_grad()
def in_context_predictions(model: RegressionModel, context: Float[Tensor, "prompt n d_token"],
                           probes: Float[Tensor, "probe d_x"]) -> Float[Tensor, "prompt n_plus_1 probe"]:
    """``model([c₁..cᵢ, x_p])`` for every prompt, ``i = 0..n`` and probe (one batched forward per prompt)."""
    out = []
    queries = model.query_tokens(probes)
    for ctx in model.check_tokens(context):
        rows = torch.stack([prefix_batch(ctx, q) for q in queries])  # probe, i, pos
        m, n1 = rows.shape[:2]
        pred = model(rows.reshape(m * n1, n1, -1)).reshape(m, n1, n1)
        out.append(torch.diagonal(pred, dim1=1, dim2=2).T)
    return torch.stack(out)


def loss_curves(name: str = "single_block", *, n_prompts: int = 64, n_probes: int = 32, n_context: int | None = None,
                lrs: tuple[float, ...] = LRS, seed: int = 5, model: RegressionModel | None = None) -> LossCurves:
    """Test error against the number of examples consumed, in context and by finetuning ``W_in`` (a rate sweep)."""
    model = model if model is not None else load_lab_model(name)
    cfg = model.cfg
    n = cfg.n_context_train if n_context is None else n_context
    g = torch.Generator().manual_seed(seed)
    p = sample_prompts(n_prompts, n, cfg.d_x, generator=g, dtype=model.dtype, query_flag=cfg.query_flag)
    probes = torch.randn(n_probes, cfg.d_x, generator=g, dtype=model.dtype)
    xs, ys = p.context_pairs()
    S = len(lrs)
    rates = torch.tensor(lrs, dtype=model.dtype).repeat_interleave(n_prompts)
    sgd = sgd_on_pairs(model, xs.repeat(S, 1, 1), ys.repeat(S, 1), rates, probes=probes[None])
    finetuned = sgd.probe_predictions.reshape(S, n_prompts, n + 1, n_probes)
    return LossCurves(name, tuple(lrs), cfg.d_x, p.weights @ probes.T,
                      in_context_predictions(model, p.tokens[:, :-1], probes), finetuned)
