"""Why the per-step alignment changes sign between seeds: which mirror solution a trained model found (issue 39).

Per trained one-block softmax model (one training seed), from a fixed probe batch
(``icl_lens/lab/_mirror.py``, Dherin et al. 2025, arXiv 2507.16003, §5 for the model):

- ``preference_init`` / ``preference``: per head of the first layer, the correlation of the
  query's attention scores with ``xⱼ·x_q`` at initialisation (the untrained model of the same
  seed, oriented when its recipe orients it: where training started) and after training: > 0
  attends to inputs similar to the query, < 0 to opposite ones (the mirror solution);
- ``label_response``: ``ρ = Σⱼ ∂ŷ_q/∂yⱼ``, how the query's prediction moves when every
  context label moves together (the part of the solution the task leaves free; its sign is
  the solution's);
- ``readout_slope``: the MLP readout along the direction in which the attention output carries
  the labels (the sign of "the readout that maps the MLP to the prediction"; one block without
  skip connections only, else None);
- ``task_slope``: ``Σ ŷ_q y_q / Σ y_q²`` (> 0: the model solves the task, whichever solution);
- ``in_context_mse``: the training record's normalised query error at ``n_context_train`` pairs;
- ``sgd_uniform_share``: of the change one SGD step on ``W_in`` (context-free, one pair, small
  rate) makes to the predictions on probe queries, the share that is the same for every probe,
  ``mean_p(Δf)² / mean_p(Δf²)`` averaged over steps: near 1, an SGD step can only shift every
  prediction toward the example's label, and the implicit step's cosine with it takes the
  sign of ``ρ``.

The population of a seed (rule fixed before the run, :func:`population`): the mirror solution of
its first attention layer, *similar* / *opposite* when its most selective head's preference is
≥ ``SELECTIVE`` / ≤ −``SELECTIVE``, else *unselective* (no head selects the context by similarity).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd
import torch

from icl_lens.lab._mirror import label_response, orient_attention, probe_prompts, readout_slope, similarity_preference
from icl_lens.lab._model import RegressionModel, build_model
from icl_lens.lab._regression_dynamics import sgd_on_pairs

SMALL_LR = 1e-3
SELECTIVE = 0.5  # a head selects the context by similarity when its preference is at least this in size
POPULATIONS = ("similar", "opposite", "unselective")


def population(preferences) -> str:
    """``"similar"`` / ``"opposite"`` when the most selective head's preference (score–similarity correlation) is
    ≥ SELECTIVE / ≤ −SELECTIVE, else ``"unselective"``."""
    top = max(preferences, key=abs)
    return "similar" if top >= SELECTIVE else "opposite" if top <= -SELECTIVE else "unselective"


@dataclass(frozen=True)
class SolutionSigns:
    """One trained model's solution, from the probe batch (module docstring)."""

    name: str
    seed: int
    preference_init: tuple[float, ...]
    preference: tuple[float, ...]
    label_response: float
    readout_slope: float | None
    task_slope: float
    in_context_mse: float
    sgd_uniform_share: float
    oriented_heads: tuple[bool, ...] | None = None

    @property
    def population(self) -> str:
        return population(self.preference)

    def to_dict(self) -> dict:
        return {**asdict(self), "population": self.population}

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([self.to_dict()])


def sgd_uniform_share(model: RegressionModel, n_prompts: int = 16, n_probes: int = 64, seed: int = 7) -> float:
    """Mean over SGD steps of ``mean_p(Δf)² / mean_p(Δf²)``: the share of one small-rate SGD step's change of the
    context-free predictions (``n_probes`` probe queries) that is the same on every probe."""
    cfg = model.cfg
    p = probe_prompts(model, n_prompts, seed)
    xs, ys = p.context_pairs()
    probes = torch.randn(1, n_probes, cfg.d_x, generator=torch.Generator().manual_seed(seed + 1), dtype=model.dtype)
    pred = sgd_on_pairs(model, xs, ys, SMALL_LR, probes=probes).probe_predictions.double()
    d = pred[:, 1:] - pred[:, :-1]  # run × step × probe
    share = d.mean(-1).pow(2) / d.pow(2).mean(-1).clamp_min(1e-300)
    return float(share.mean())


def solution_signs(name: str, seed: int, model: RegressionModel, record: dict) -> SolutionSigns:
    """The solution diagnostics of ``model`` (``name`` trained with ``seed``; ``record``: its training record)."""
    if model.cfg.arch != "softmax":
        raise ValueError(f"solution_signs reads softmax attention heads; {name} is {model.cfg.arch}")
    init = build_model(model.cfg, seed=seed).to(model.dtype).eval()
    oriented = record.get("oriented_heads")
    if oriented is not None:  # training started from the oriented initialisation
        orient_attention(init)
    rho, task = label_response(model)
    one_block = model.cfg.n_layers == 1 and not model.cfg.skip
    return SolutionSigns(
        name=name, seed=int(seed),
        preference_init=tuple(float(x) for x in similarity_preference(init)),
        preference=tuple(float(x) for x in similarity_preference(model)),
        label_response=float(rho.double().mean()),
        readout_slope=float(readout_slope(model).double().mean()) if one_block else None,
        task_slope=task, in_context_mse=float(record["eval_loss_n_train"]),
        sgd_uniform_share=sgd_uniform_share(model),
        oriented_heads=tuple(bool(x) for x in oriented) if oriented is not None else None)
