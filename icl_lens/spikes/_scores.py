"""Spike scores: robust outlier scores of the diagonal token-patch norms.

The diagonal token patch of position ``t`` is the rank-1 weight update that makes the
context-free input of ``t`` reproduce its contextual output (docs/design.md §2; Dherin et al.
2025, arXiv 2507.16003). Its Frobenius norm ``n[l, t] = ‖ΔW[l, t]‖_F`` measures how much
the context changes layer ``l``'s MLP input at ``t``. A *spike* is a token whose patch
norm is unusually large compared with the tokens just before it. Per position ``t``:

    W_t          = the last ``window`` informative positions before t (trailing window)
    med_t        = median_{j ∈ W_t} x_j
    MAD_t        = median_{j ∈ W_t} |x_j − med_t|
    s_t          = 1.4826 · MAD_t                       (σ of a normal, robustly)
    z_t          = (x_t − med_t) / s_t                  (robust z-score)

``x`` is either one layer's norm series (giving ``layer_scores[l]``) or a layer
aggregate. Aggregations (``statistic=``), over the selected ``layers``:

    "mean"   score_t = mean_l z[l, t]         (per-layer robust z, averaged)
    "median" score_t = median_l z[l, t]
    "max"    score_t = max_l z[l, t]
    "norm"   score_t = robust z of N_t = sqrt(Σ_l n[l, t]²), the Frobenius norm of the
             whole (selected-layer) patch; dominated by the layers with the largest norms.

A position is *flagged* when it has enough context and ``score_t > threshold``
(one-sided: only unusually large updates are spikes).

Conventions (all documented invariants, checked by the tests):

* Informative positions: a position where no context is removed (the first token, and
  the token after a kept BOS) has a zero patch by definition. It is left out of every
  window, never flagged, and gets no score.
* Enough context: ``enough_context[t]`` is True when ``t`` is informative and its window
  holds at least ``min_context`` (default ``window``) informative predecessors. Where it
  is False, ``scores[t]`` and ``layer_scores[:, t]`` are NaN and ``flags[t]`` is False. A
  prompt shorter than the window therefore reports "not enough context" everywhere
  instead of flagging everything.
* MAD = 0 (more than half the window equal): ``s_t`` falls back to ``1.2533 · mean
  |x_j − med_t|`` (Iglewicz & Hoaglin's convention), and ``s_t`` is never below
  ``1e-6 · |med_t|`` (deviations under a millionth of the level are noise). If ``s_t`` is
  still 0 (a window of exact zeros), ``z_t`` is 0 when ``x_t`` equals the median and
  ``±SCORE_CAP`` otherwise. Every score is clipped to ``±SCORE_CAP``, so no score is
  ever infinite and NaN means exactly "not enough context".
* Medians of an even number of values are the mean of the two middle values.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from icl_lens.core._kept_attention import removes_nothing
from icl_lens.patches._patch_set import TokenPatches
from icl_lens.spikes._settings import SpikeSettings

MAD_TO_SIGMA = 1.4826  # 1 / Φ⁻¹(3/4): MAD of a normal times this is its σ
MEAN_AD_TO_SIGMA = 1.2533  # sqrt(π/2): mean absolute deviation of a normal times this is its σ
RELATIVE_SCALE_FLOOR = 1e-6
SCORE_CAP = 1e6


@dataclass(frozen=True, eq=False)
class SpikeFlags:
    """Per-token spike scores and flags of one sequence (see the module docstring)."""

    tokens: tuple[str, ...]
    scores: Float[Tensor, " pos"]
    flags: Bool[Tensor, " pos"]
    layer_scores: Float[Tensor, "layer pos"]
    enough_context: Bool[Tensor, " pos"]
    window: int
    threshold: float
    min_context: int
    statistic: str
    layers: tuple[int, ...]
    norms: Float[Tensor, "layer pos"]
    informative: Bool[Tensor, " pos"]

    @property
    def settings(self) -> SpikeSettings:
        """The settings these flags were computed with (the threshold and layers as used; ``min_context`` None
        where it was the window)."""
        return SpikeSettings(window=self.window, threshold=self.threshold, layers=self.layers, statistic=self.statistic,
                             min_context=None if self.min_context == self.window else self.min_context)

    @property
    def n_positions(self) -> int:
        return int(self.scores.shape[0])

    @property
    def flagged_positions(self) -> list[int]:
        return torch.nonzero(self.flags).flatten().tolist()

    def to_frame(self) -> pd.DataFrame:
        """One row per position: position, token, score (NaN without enough context), flagged, enough_context."""
        scores = self.scores.detach().cpu().double().tolist()
        flags = self.flags.cpu().tolist()
        enough = self.enough_context.cpu().tolist()
        rows = [
            {"position": t, "token": self.tokens[t], "score": scores[t], "flagged": bool(flags[t]),
             "enough_context": bool(enough[t])}
            for t in range(self.n_positions)
        ]
        return pd.DataFrame(rows, columns=["position", "token", "score", "flagged", "enough_context"])


def _median(x: Tensor, count: Tensor) -> Tensor:
    """Median over the last dim of ``x`` whose first ``count`` entries (after sorting, NaN last) are valid."""
    s = torch.sort(x, dim=-1).values  # NaN sorts last
    lo = ((count - 1).clamp(min=0) // 2)[..., None]
    hi = (count // 2).clamp(max=x.shape[-1] - 1)[..., None]
    return 0.5 * (s.gather(-1, lo) + s.gather(-1, hi)).squeeze(-1)


def trailing_robust_z(
    series: Float[Tensor, "*batch pos"],
    informative: Bool[Tensor, " pos"],
    *,
    window: int,
    min_context: int,
) -> tuple[Float[Tensor, "*batch pos"], Bool[Tensor, " pos"]]:
    """Robust z-score of each informative position against its trailing window.

    Returns ``(z, enough_context)``; ``z`` is float64, NaN where ``enough_context`` is False.
    """
    x = series.detach().to(torch.float64)
    batch, n = x.shape[:-1], x.shape[-1]
    idx = torch.nonzero(informative.to(x.device)).flatten()
    m = int(idx.numel())
    z = torch.full_like(x, float("nan"))
    enough = torch.zeros(n, dtype=torch.bool, device=x.device)
    if m == 0:
        return z, enough
    v = x[..., idx]  # *batch m: the informative positions, compressed
    pad = torch.full((*batch, window), float("nan"), dtype=x.dtype, device=x.device)
    win = torch.cat([pad, v], dim=-1).unfold(-1, window, 1)[..., :m, :]  # *batch m window: v[j-window : j]
    count = torch.clamp(torch.arange(m, device=x.device), max=window)  # informative predecessors in window
    ok = count >= min_context
    med = _median(win, count.expand(*batch, m))
    dev = (win - med[..., None]).abs()
    mad = _median(dev, count.expand(*batch, m))
    scale = MAD_TO_SIGMA * mad
    mean_ad = torch.nan_to_num(dev, nan=0.0).sum(-1) / count.clamp(min=1)
    scale = torch.where(scale > 0, scale, MEAN_AD_TO_SIGMA * mean_ad)
    scale = torch.maximum(scale, RELATIVE_SCALE_FLOOR * med.abs())
    diff = v - med
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    zc = torch.where(scale > 0, diff / safe, torch.sign(diff) * SCORE_CAP).clamp(-SCORE_CAP, SCORE_CAP)
    zc = torch.where(ok, zc, torch.full_like(zc, float("nan")))
    z[..., idx] = zc
    enough[idx] = ok
    return z, enough


def _layer_indices(layers: Sequence[int] | range | slice | None, n_layers: int) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(n_layers))
    if isinstance(layers, slice):
        out = tuple(range(n_layers)[layers])
    elif isinstance(layers, int):
        raise TypeError("layers must be a sequence of layer indices (e.g. [3] or range(9, 18)), not an int")
    else:
        out = []
        for layer in layers:
            if not -n_layers <= int(layer) < n_layers:
                raise IndexError(f"layer {layer} is outside the model's layers (0..{n_layers - 1})")
            out.append(int(layer) % n_layers)
        out = tuple(out)
    if not out:
        raise ValueError("layers selects no layer; pass None for all layers")
    return out


def spike_scores_from_norms(
    norms: Float[Tensor, "layer pos"],
    settings: SpikeSettings | None = None,
    *,
    tokens: Sequence[str] | None = None,
    informative: Bool[Tensor, " pos"] | None = None,
    **changes,
) -> SpikeFlags:
    """Spike scores from a ``[layer, pos]`` tensor of patch norms (module docstring for the math).

    ``settings``: :class:`~icl_lens.spikes.SpikeSettings` (default ``SpikeSettings()``); ``changes``: any of its
    fields as keyword arguments (``window``, ``threshold``, ``layers``, ``statistic``, ``min_context``).
    The threshold must be a number here (no model to look a calibrated one up for). ``informative``: positions
    whose patch is meaningful (default: all). ``tokens``: labels for ``to_frame`` (default: the position numbers).
    """
    settings = SpikeSettings.of(settings, **changes)
    if settings.threshold is None:
        raise ValueError("threshold=None takes a model's calibrated threshold; spike_scores_from_norms has no model "
                         "(pass a number, e.g. icl_lens.spike_threshold(model_name).value)")
    window, threshold, statistic, min_context = (settings.window, settings.threshold, settings.statistic,
                                                 settings.context)
    if norms.ndim != 2 or norms.shape[1] == 0:
        raise ValueError(f"norms must be a non-empty [layer, pos] tensor, got shape {tuple(norms.shape)}")
    n_layers, n = norms.shape
    if not torch.isfinite(norms).all():
        raise ValueError("norms contain NaN or infinite values; spike scores need finite patch norms")
    informative = torch.ones(n, dtype=torch.bool) if informative is None else informative.to(torch.bool).cpu()
    if informative.shape != (n,):
        raise ValueError(f"informative must have shape ({n},), got {tuple(informative.shape)}")
    tokens = tuple(str(t) for t in range(n)) if tokens is None else tuple(tokens)
    if len(tokens) != n:
        raise ValueError(f"{len(tokens)} tokens for {n} positions")
    chosen = _layer_indices(settings.layers, n_layers)
    x = norms.detach().cpu().to(torch.float64)
    layer_z, enough = trailing_robust_z(x, informative, window=window, min_context=min_context)
    sel = layer_z[list(chosen)]
    if statistic == "mean":
        scores = sel.mean(0)
    elif statistic == "median":
        scores = _median(sel.T, torch.full((n,), len(chosen)))
    elif statistic == "max":
        scores = sel.max(0).values
    else:  # "norm"
        total = torch.linalg.vector_norm(x[list(chosen)], dim=0)
        scores, _ = trailing_robust_z(total, informative, window=window, min_context=min_context)
    scores = torch.where(enough, scores, torch.full_like(scores, float("nan")))
    flags = enough & (torch.nan_to_num(scores, nan=float("-inf")) > threshold)
    return SpikeFlags(
        tokens=tokens, scores=scores, flags=flags, layer_scores=layer_z, enough_context=enough,
        window=window, threshold=float(threshold), min_context=min_context, statistic=statistic,
        layers=chosen, norms=x, informative=informative,
    )


def informative_positions(patches: TokenPatches) -> Bool[Tensor, " pos"]:
    """Positions whose kept set removes some context (the others have a zero patch by definition)."""
    return ~removes_nothing(patches.kept.cpu())


def spike_scores(patches: TokenPatches, settings: SpikeSettings | None = None, **changes) -> SpikeFlags:
    """Spike scores and flags of every position of ``patches`` (see the module docstring).

    ``settings``: :class:`~icl_lens.spikes.SpikeSettings` (default ``SpikeSettings()``); ``changes``: any of its
    fields as keyword arguments: ``window`` (trailing positions each token is compared with), ``threshold``
    (robust z above which a token is flagged; default 3.5; ``None``: the calibrated threshold of
    ``patches.model_name``), ``layers`` (layers entering the aggregate, default all), ``statistic`` (one of
    ``"mean"``, ``"median"``, ``"max"``, ``"norm"``), ``min_context`` (informative predecessors needed before a
    position can be flagged, default ``window``).
    """
    settings = SpikeSettings.of(settings, **changes)
    if settings.threshold is None:
        from icl_lens.spikes._thresholds import spike_threshold

        settings = settings.replace(threshold=spike_threshold(patches.model_name, settings).value)
    return spike_scores_from_norms(patches.norms(), settings, tokens=patches.tokens,
                                   informative=informative_positions(patches))
