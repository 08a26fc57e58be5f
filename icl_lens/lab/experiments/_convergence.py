"""Experiment 3 — convergence of the implicit dynamics by architecture (arXiv 2507.16003, §5).

For each architecture and prompt, the meta-gradient norm of pair ``i`` is the Frobenius
norm of the whole model's step, ``g(i) = sqrt(Σ_l ‖ΔW_l(i) − ΔW_l(i−1)‖²)``, for
``i = 1..n_max`` with ``n_max`` several times the training context length. We fit
``g(i) ≈ c i^(−α)`` (:func:`icl_lens.core._power_law.power_law_fit`) to the mean over
prompts, and per prompt for the spread; ``late/early`` is the mean step over the last
quarter divided by the mean over the first ``n_train`` pairs. ``α`` describes how fast the
steps shrink; it does not decide convergence (steps ``∝ i^−α`` with ``α ≤ 1`` do not sum).

Convergence is measured directly, as a Cauchy criterion on the whole model's implicit
weights ``W(i)`` (``P(i) = W(i) − W(0)``, every layer's patch; from one Gram matrix of the
rank-1 patches, ``⟨P(i), P(j)⟩ = Σ_l (u_i·u_j)(v_i·v_j)``):

    drift(n → N) = max_{n < m ≤ N} ‖W(m) − W(n)‖_F / ‖W(n) − W(0)‖_F

how far the weights still move after ``n`` pairs, relative to how far they have come; and the
tail sum ``Σ_{n<i≤N} g(i) / ‖P(n)‖`` (its upper bound). Claims: Dherin et al. 2025
(attention's implicit updates settle as context grows, an RNN's do not); McDermott, Heath,
Parhi 2026, arXiv 2606.25342 (a fixed-state parametric layer can learn in context with
constant memory). The prediction error after ``i`` pairs is recorded beside it. Models
come from :func:`icl_lens.lab.seeds.seed_model` (``seeds``: those in the cache are used).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core._factored import diff_norm
from icl_lens.core._power_law import power_law_fit
from icl_lens.lab.seeds import seed_model
from icl_lens.stats._bootstrap import bootstrap_mean_nested
from icl_lens.lab._regression_dynamics import implicit_trajectory, reproduced_predictions
from icl_lens.lab._mixers import ARCHITECTURES
from icl_lens.lab._tasks import sample_prompts


@dataclass(frozen=True, eq=False)
class ConvergenceResult:
    """Meta-gradient norms ``[arch] → prompt × layer × i``, squared errors ``prompt × i`` (i = 0..n_max) and the
    whole-model distances ``‖W(i) − W(j)‖`` (``prompt × i × j``, i, j = 0..n_max); ``prompt_seed[arch][p]`` is
    the training seed of prompt row ``p`` (each seed's model sees the same prompts)."""

    n_train: int
    step_norms: dict[str, Float[Tensor, "prompt layer n"]]
    sq_errors: dict[str, Float[Tensor, "prompt n_plus_1"]]
    fit_from: int
    distances: dict[str, Float[Tensor, "prompt n_plus_1 n_plus_1"]] | None = None
    prompt_seed: dict[str, tuple[int, ...]] | None = None

    def seeds(self, arch: str) -> tuple[int, ...]:
        return tuple(sorted(set(self.prompt_seed[arch]))) if self.prompt_seed else (0,)

    def by_seed(self, arch: str, values: Tensor) -> list:
        """``values`` (one per prompt row) split by training seed, for :func:`bootstrap_mean_nested`."""
        seed = torch.tensor(self.prompt_seed[arch]) if self.prompt_seed else torch.zeros(len(values), dtype=torch.long)
        return [values[seed == s].double().numpy() for s in self.seeds(arch)]

    def drift(self, arch: str, start: int, end: int | None = None) -> Float[Tensor, " prompt"]:
        """``max_{start < m ≤ end} ‖W(m) − W(start)‖ / ‖W(start) − W(0)‖`` per prompt (``end`` = n_max)."""
        end = self.n_max if end is None else end
        if not 1 <= start < end <= self.n_max:
            raise ValueError(f"need 1 ≤ start < end ≤ {self.n_max}, got {start}, {end}")
        d = self.distances[arch].double()
        return d[:, start, start + 1: end + 1].max(-1).values / d[:, start, 0]

    def tail_sum(self, arch: str, start: int) -> Float[Tensor, " prompt"]:
        """``Σ_{start < i ≤ n_max} g(i) / ‖W(start) − W(0)‖`` per prompt (an upper bound of the drift)."""
        return self.total_norms(arch).double()[:, start:].sum(-1) / self.distances[arch].double()[:, start, 0]

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
            extra = {}
            if self.distances is not None:
                half = self.n_max // 2
                for key, values in (("drift_train_to_max", self.drift(arch, self.n_train)),
                                    ("drift_half_to_max", self.drift(arch, half)),
                                    ("tail_sum_train_to_max", self.tail_sum(arch, self.n_train))):
                    ci = bootstrap_mean_nested(self.by_seed(arch, values))
                    extra.update({key: ci.mean, f"{key}_low": ci.low, f"{key}_high": ci.high})
                extra["seeds"] = len(self.seeds(arch))
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
                **extra,
            })
        return pd.DataFrame(rows)


def convergence_by_architecture(archs=ARCHITECTURES, *, n_prompts: int = 16, n_max: int = 64,
                                fit_from: int = 4, seed: int = 2, seeds=(0,)) -> ConvergenceResult:
    """Meta-gradient norms and drifts for context lengths ``1..n_max`` (the models were trained up to 16),
    for every training seed in ``seeds`` that is shipped or cached (the others are skipped)."""
    norms, errors, dists, owners, n_train = {}, {}, {}, {}, None
    for arch in archs:
        rows_n, rows_e, rows_d, own = [], [], [], []
        for s in seeds:
            try:
                model, _ = seed_model(arch, s, train_missing=False)
            except FileNotFoundError:
                continue
            n_train = model.cfg.n_context_train
            p = sample_prompts(n_prompts, n_max, model.cfg.d_x, generator=torch.Generator().manual_seed(seed))
            for b in range(n_prompts):
                ctx, q = p.tokens[b, :-1], p.tokens[b, -1]
                traj = implicit_trajectory(model, ctx, q)
                # ‖W(i) − W(i−1)‖ in the model's dtype (Trajectory.meta_gradient_norms works in float64)
                rows_n.append(diff_norm(traj.u_in[:, 1:], traj.v[:, 1:], traj.u_in[:, :-1], traj.v[:, :-1]))
                u, v = traj.u_in.double(), traj.v.double()
                gram = (torch.einsum("liu,lju->lij", u, u) * torch.einsum("lid,ljd->lij", v, v)).sum(0)  # ⟨P(i), P(j)⟩
                diag = torch.diagonal(gram)
                rows_d.append((diag[:, None] + diag[None, :] - 2 * gram).clamp_min(0).sqrt().float())
                rows_e.append((reproduced_predictions(model, ctx, q) - p.targets[b]) ** 2 / model.cfg.d_x)
                own.append(s)
        if not rows_n:
            raise FileNotFoundError(f"no trained model of {arch} for seeds {tuple(seeds)}")
        norms[arch], errors[arch], dists[arch], owners[arch] = (torch.stack(rows_n), torch.stack(rows_e),
                                                                torch.stack(rows_d), tuple(own))
    return ConvergenceResult(n_train, norms, errors, fit_from, dists, owners)
