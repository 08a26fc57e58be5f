"""Experiment 3 — convergence of the implicit dynamics by architecture (arXiv 2507.16003, §5).

For each architecture and prompt, the meta-gradient norm of pair ``i`` is the Frobenius
norm of the whole model's step, ``g(i) = sqrt(Σ_l ‖ΔW_l(i) − ΔW_l(i−1)‖²)``, for
``i = 1..n_max`` with ``n_max`` several times the training context length. We fit
``g(i) ≈ c i^(−α)`` (:func:`icl_lens.core.power_law.power_law_fit`) to the mean over
prompts, and per prompt for the spread; ``late/early`` is the mean step over the last
quarter divided by the mean over the first ``n_train`` pairs. The papers' claim:
attention's steps shrink (``α > 0``), RNN-style layers' do not. The prediction error
after ``i`` pairs is recorded beside it.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core.factored import diff_norm
from icl_lens.core.power_law import power_law_fit
from icl_lens.lab.checkpoints import load_lab_model
from icl_lens.lab.regression_dynamics import implicit_trajectory, reproduced_predictions
from icl_lens.lab.mixers import ARCHITECTURES
from icl_lens.lab.tasks import sample_prompts


@dataclass(frozen=True, eq=False)
class ConvergenceResult:
    """Meta-gradient norms ``[arch] → prompt × layer × i`` and squared errors ``prompt × i`` (i = 0..n_max)."""

    n_train: int
    step_norms: dict[str, Float[Tensor, "prompt layer n"]]
    sq_errors: dict[str, Float[Tensor, "prompt n_plus_1"]]
    fit_from: int

    @property
    def n_max(self) -> int:
        return next(iter(self.step_norms.values())).shape[-1]

    def total_norms(self, arch: str) -> Float[Tensor, "prompt n"]:
        return self.step_norms[arch].pow(2).sum(1).sqrt()

    def to_frame(self) -> pd.DataFrame:
        frames = []
        for arch, norms in self.step_norms.items():
            tot = self.total_norms(arch)
            P, n = tot.shape
            frames.append(pd.DataFrame({
                "arch": arch, "prompt": torch.arange(P).repeat_interleave(n).numpy(),
                "pairs_seen": torch.arange(1, n + 1).repeat(P).numpy(),
                "meta_gradient_norm": tot.flatten().double().numpy(),
                "sq_error": self.sq_errors[arch][:, 1:].flatten().double().numpy()}))
        return pd.concat(frames, ignore_index=True)

    def summary(self) -> pd.DataFrame:
        rows = []
        i = torch.arange(1, self.n_max + 1, dtype=torch.float64)
        fit = i >= self.fit_from
        beyond = i >= self.n_train
        for arch in self.step_norms:
            tot = self.total_norms(arch).double()
            mean = tot.mean(0)
            alpha = power_law_fit(mean[fit], x=i[fit]).exponent[0]
            alpha_beyond = power_law_fit(mean[beyond], x=i[beyond]).exponent[0]
            per_prompt = power_law_fit(tot[:, fit], x=i[fit]).exponent
            late = tot[:, -self.n_max // 4:].mean(1)
            early = tot[:, : self.n_train].mean(1)
            err = self.sq_errors[arch].double()
            rows.append({
                "arch": arch,
                "alpha_mean_curve": float(alpha),
                "alpha_beyond_train": float(alpha_beyond),
                "alpha_per_prompt_mean": float(per_prompt.mean()),
                "alpha_per_prompt_std": float(per_prompt.std()),
                "late_over_early": float((late / early).mean()),
                "late_step_cv_across_prompts": float(late.std() / late.mean()),
                "late_step_norm": float(late.mean()),
                "norm_mse_at_n_train": float(err[:, self.n_train].mean()),
                "norm_mse_at_n_max": float(err[:, -1].mean()),
            })
        return pd.DataFrame(rows)


def convergence_by_architecture(archs=ARCHITECTURES, *, n_prompts: int = 16, n_max: int = 64,
                                fit_from: int = 4, seed: int = 2) -> ConvergenceResult:
    """Meta-gradient norms for context lengths ``1..n_max`` (the models were trained up to 16)."""
    norms, errors, n_train = {}, {}, None
    for arch in archs:
        model = load_lab_model(arch)
        n_train = model.cfg.n_context_train
        p = sample_prompts(n_prompts, n_max, model.cfg.d_x, generator=torch.Generator().manual_seed(seed))
        per_prompt, errs = [], []
        for b in range(n_prompts):
            ctx, q = p.tokens[b, :-1], p.tokens[b, -1]
            traj = implicit_trajectory(model, ctx, q)
            # ‖W(i) − W(i−1)‖ in the model's dtype (Trajectory.meta_gradient_norms works in float64)
            per_prompt.append(diff_norm(traj.u_in[:, 1:], traj.v[:, 1:], traj.u_in[:, :-1], traj.v[:, :-1]))
            errs.append((reproduced_predictions(model, ctx, q) - p.targets[b]) ** 2 / model.cfg.d_x)
        norms[arch], errors[arch] = torch.stack(per_prompt), torch.stack(errs)
    return ConvergenceResult(n_train, norms, errors, fit_from)
