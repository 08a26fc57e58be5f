"""Experiment 3 — convergence of the implicit dynamics by architecture (arXiv 2507.16003, §5).

For each architecture and prompt, the meta-gradient norm of pair ``i`` is the Frobenius
norm of the whole model's step, ``g(i) = sqrt(Σ_l ‖ΔW_l(i) − ΔW_l(i−1)‖²)``, for
``i = 1..n_max`` with ``n_max`` several times the training context length. We fit
``g(i) ≈ c i^(−α)`` (:func:`icl_lens.core._power_law.power_law_fit`) to the mean over
prompts, and per prompt for the spread; ``late/early`` is the mean step over the last
quarter divided by the mean over the first ``n_train`` pairs. ``α`` describes how fast the
steps shrink; it does not decide convergence (steps ``∝ i^−α`` with ``α ≤ 1`` do not sum).

Convergence is measured directly, as a Cauchy criterion on the whole implicit update
``W(i)`` of the model (``P(i) = W(i) − W(0)``: every layer's ``W_in`` patch AND its skip
correction, the MLP-output bias that carries most of the context effect in a Pre-LN model; from
one Gram matrix, ``⟨P(i), P(j)⟩ = Σ_l (u_i·u_j)(v_i·v_j) + Σ_l c_i·c_j``):

    drift(n → N) = max_{n < m ≤ N} ‖W(m) − W(n)‖ / ‖W(n) − W(0)‖

how far the weights still move after ``n`` pairs, relative to how far they have come; and the
tail sum ``Σ_{n<i≤N} g(i) / ‖P(n)‖`` (an upper bound of the drift when ``g`` is the whole step).

*Trend within the trained length* (:meth:`ConvergenceResult.trend`): ``drift(n → 2n)`` for
``n = 2, 4, …`` with ``2n ≤ n_train``; per training seed, the least-squares slope of the mean
over prompts of ``log drift(n → 2n)`` against ``log n``. A running average of noisy steps
converges at ``drift ∝ n^(−1/2)`` (slope −½); steps of constant size that do not average out
keep ``drift`` flat (slope 0). The verdict rule on these slopes lives with the evaluation
(``experiments.lab_rules``). Claims: Dherin et al. 2025
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
from icl_lens.lab._regression_dynamics import implicit_trajectory, reproduced_predictions
from icl_lens.lab._mixers import ARCHITECTURES
from icl_lens.lab._tasks import sample_prompts


@dataclass(frozen=True, eq=False)
class ConvergenceResult:
    """Meta-gradient norms of the ``W_in`` patches ``[arch] → prompt × layer × i``, squared errors ``prompt × i``
    (i = 0..n_max) and the distances ``‖W(i) − W(j)‖`` of the whole implicit update (patches and corrections,
    ``prompt × i × j``, i, j = 0..n_max); ``prompt_seed[arch][p]`` is the training seed of prompt row ``p``
    (each seed's model sees the same prompts)."""

    n_train: int
    step_norms: dict[str, Float[Tensor, "prompt layer n"]]
    sq_errors: dict[str, Float[Tensor, "prompt n_plus_1"]]
    fit_from: int
    distances: dict[str, Float[Tensor, "prompt n_plus_1 n_plus_1"]] | None = None
    prompt_seed: dict[str, tuple[int, ...]] | None = None

    def seeds(self, arch: str) -> tuple[int, ...]:
        return tuple(sorted(set(self.prompt_seed[arch]))) if self.prompt_seed else (0,)

    def drift(self, arch: str, start: int, end: int | None = None) -> Float[Tensor, " prompt"]:
        """``max_{start < m ≤ end} ‖W(m) − W(start)‖ / ‖W(start) − W(0)‖`` per prompt (``end`` = n_max)."""
        end = self.n_max if end is None else end
        if not 1 <= start < end <= self.n_max:
            raise ValueError(f"need 1 ≤ start < end ≤ {self.n_max}, got {start}, {end}")
        d = self.distances[arch].double()
        return d[:, start, start + 1: end + 1].max(-1).values / d[:, start, 0]

    def tail_sum(self, arch: str, start: int) -> Float[Tensor, " prompt"]:
        """``Σ_{start < i ≤ n_max} ‖W(i) − W(i−1)‖ / ‖W(start) − W(0)‖`` per prompt, whole update (an upper bound
        of the drift)."""
        return self.whole_steps(arch)[:, start:].sum(-1) / self.distances[arch].double()[:, start, 0]

    def whole_steps(self, arch: str) -> Float[Tensor, "prompt n"]:
        """``‖W(i) − W(i−1)‖`` of the whole implicit update (patches and corrections), i = 1..n_max."""
        d = self.distances[arch].double()
        return torch.diagonal(d[:, 1:, :-1], dim1=1, dim2=2)

    def trend_ns(self) -> tuple[int, ...]:
        """``n = 2, 4, …`` with ``2n ≤ min(n_train, n_max)``: the doublings inside the trained length."""
        ns, n = [], 2
        while 2 * n <= min(self.n_train, self.n_max):
            ns.append(n)
            n *= 2
        return tuple(ns)

    def trend(self, arch: str) -> tuple[tuple[int, ...], Float[Tensor, "seed n"], Float[Tensor, " seed"]]:
        """``(ns, log_drift, slope)``: per training seed, the mean over its prompts of ``log drift(n → 2n)`` for each
        ``n`` of :meth:`trend_ns`, and the least-squares slope of that against ``log n``."""
        ns = self.trend_ns()
        if len(ns) < 2:
            raise ValueError(f"the trend needs at least two doublings inside the trained length ({self.n_train})")
        logs = torch.stack([self.drift(arch, n, 2 * n).log() for n in ns], -1)  # prompt × n
        seed = torch.tensor(self.prompt_seed[arch]) if self.prompt_seed else torch.zeros(len(logs), dtype=torch.long)
        per_seed = torch.stack([logs[seed == s].mean(0) for s in self.seeds(arch)])
        x = torch.tensor(ns, dtype=torch.float64).log()
        xc = x - x.mean()
        slope = ((per_seed - per_seed.mean(-1, keepdim=True)) * xc).sum(-1) / xc.pow(2).sum()
        return ns, per_seed, slope

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
                extra["drift_train_to_max"] = float(self.drift(arch, self.n_train).mean())  # beyond training: description
                if len(self.trend_ns()) >= 2:
                    ns, log_drift, slope = self.trend(arch)
                    extra.update({f"drift_{n}_to_{2 * n}": float(log_drift[:, k].exp().mean()) for k, n in enumerate(ns)})
                    extra["trend_slope"] = float(slope.mean())
                    extra["trend_slope_per_seed"] = [float(x) for x in slope]
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
                                fit_from: int = 4, seed: int = 2, seeds=(0,), cache_dir=None) -> ConvergenceResult:
    """Meta-gradient norms and drifts for context lengths ``1..n_max`` (the models were trained up to 16),
    for every training seed in ``seeds`` that is shipped or cached in ``cache_dir`` (the others are skipped).
    All architectures must share ``n_train``."""
    norms, errors, dists, owners, n_train = {}, {}, {}, {}, None
    for arch in archs:
        rows_n, rows_e, rows_d, own = [], [], [], []
        for s in seeds:
            try:
                model, _ = seed_model(arch, s, cache_dir=cache_dir, train_missing=False)
            except FileNotFoundError:
                continue
            if n_train not in (None, model.cfg.n_context_train):
                raise ValueError(f"{arch} was trained on {model.cfg.n_context_train} pairs, the others on {n_train}")
            n_train = model.cfg.n_context_train
            p = sample_prompts(n_prompts, n_max, model.cfg.d_x, generator=torch.Generator().manual_seed(seed),
                               query_flag=model.cfg.query_flag)
            for b in range(n_prompts):
                ctx, q = p.tokens[b, :-1], p.tokens[b, -1]
                traj = implicit_trajectory(model, ctx, q)
                # ‖W(i) − W(i−1)‖ of the W_in patches in the model's dtype (Trajectory.meta_gradient_norms: float64)
                rows_n.append(diff_norm(traj.u_in[:, 1:], traj.v[:, 1:], traj.u_in[:, :-1], traj.v[:, :-1]))
                u, v, c = traj.u_in.double(), traj.v.double(), traj.correction.double()
                gram = (torch.einsum("liu,lju->lij", u, u) * torch.einsum("lid,ljd->lij", v, v)
                        + torch.einsum("lid,ljd->lij", c, c)).sum(0)  # ⟨P(i), P(j)⟩, patches and corrections
                diag = torch.diagonal(gram)
                rows_d.append((diag[:, None] + diag[None, :] - 2 * gram).clamp_min(0).sqrt().float())
                rows_e.append((reproduced_predictions(model, ctx, q) - p.targets[b]) ** 2 / model.cfg.d_x)
                own.append(s)
        if not rows_n:
            raise FileNotFoundError(f"no trained model of {arch} for seeds {tuple(seeds)}")
        norms[arch], errors[arch], dists[arch], owners[arch] = (torch.stack(rows_n), torch.stack(rows_e),
                                                                torch.stack(rows_d), tuple(own))
    return ConvergenceResult(n_train, norms, errors, fit_from, dists, owners)
