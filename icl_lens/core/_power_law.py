"""The one power-law fit of icl_lens: ``y ≈ c · x^(−b)`` by least squares in log-log space.

``log y = log c − b log x``. Applied to meta-gradient norms against the number of
consumed context tokens (Dherin et al. 2025, arXiv 2507.16003, §3 and §5): ``b > 0``
means the steps shrink as context grows, ``b ≈ 0`` that they do not. Whether the
implicit weights converge also needs the steps to be summable (``b > 1``).

Only points with a finite, positive ``y`` enter a row's fit; rows with fewer than two
such points get NaN (``n_points`` says why). ``r_squared = 1 − SS_res/SS_tot`` in
log-log space (1 when the log values are constant and fitted exactly).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor


@dataclass(frozen=True, eq=False)
class PowerLawFit:
    """Per row: ``y ≈ prefactor · x^(−exponent)``, its log-log ``r_squared`` and the points used."""

    exponent: Float[Tensor, " row"]
    prefactor: Float[Tensor, " row"]
    r_squared: Float[Tensor, " row"]
    n_points: Int[Tensor, " row"]


def power_law_fit(y: Float[Tensor, "row n"], x: Float[Tensor, " n"] | None = None) -> PowerLawFit:
    """Fit every row of ``y`` against ``x`` (default ``x = 1..n``); float64 throughout."""
    y = y.detach().to("cpu", torch.float64)
    if y.ndim == 1:
        y = y[None]
    rows, n = y.shape
    x = torch.arange(1, n + 1, dtype=torch.float64) if x is None else x.detach().to("cpu", torch.float64)
    if x.shape != (n,):
        raise ValueError(f"x has shape {tuple(x.shape)}; y has {n} points per row")
    if (x <= 0).any():
        raise ValueError("a power-law fit needs positive x")
    log_x = x.log()
    b, c, r2 = (torch.full((rows,), math.nan, dtype=torch.float64) for _ in range(3))
    count = torch.zeros(rows, dtype=torch.long)
    for row in range(rows):
        ok = torch.isfinite(y[row]) & (y[row] > 0)
        count[row] = int(ok.sum())
        if count[row] < 2:
            continue
        lx, ly = log_x[ok], y[row][ok].log()
        xm, ym = lx.mean(), ly.mean()
        sxx = ((lx - xm) ** 2).sum()
        if sxx == 0:
            continue
        slope = ((lx - xm) * (ly - ym)).sum() / sxx
        intercept = ym - slope * xm
        ss_res = ((ly - (intercept + slope * lx)) ** 2).sum()
        ss_tot = ((ly - ym) ** 2).sum()
        b[row], c[row] = -slope, intercept.exp()
        r2[row] = 1.0 - ss_res / ss_tot if ss_tot > 0 else torch.tensor(1.0 if ss_res == 0 else 0.0)
    return PowerLawFit(exponent=b, prefactor=c, r_squared=r2, n_points=count)
