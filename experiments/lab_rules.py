"""The verdict rules of the lab evaluations, fixed before the runs (issue 39); pure Python on per-seed numbers.

Both the evaluation commands (``experiments.finetune_alignment``, ``experiments.lab``) and the
one-screen summary (``experiments.report``) compute their verdicts and sentences with these
functions, from the same per-seed numbers (the JSON stores them), so the findings and the
summary cannot disagree.

**Unit: the training seed.** A seed contributes one number per cell: its mean over prompts
(and layers). Intervals are Student-t over seeds (:func:`icl_lens.stats.t_interval`, 95%);
differences between two models are Welch intervals (:func:`icl_lens.stats.welch_interval`).
With one seed there is no interval and no verdict.

**Alignment cell** (a model, an order ``absorb``/``prefix``/``end`` and a kind
``step``/``cumulative``), :func:`cell_verdict`: with ``s`` the per-seed cosines and ``d`` the
per-seed differences to the control (the next prompt's SGD run, the same seed):

- *holds*: ``s`` and ``d`` intervals above 0 and mean ``s ≥ ALIGNED``;
- *weak*: the same with ``WEAK ≤ mean < ALIGNED``; *negligible*: the same with mean ``< WEAK``;
- *reversed*: ``s`` and ``d`` intervals below 0 (anti-aligned on every resampling of seeds);
- *no*: otherwise. A cell is *aligned* when it holds or is weak.

**Multiplicity** (:func:`claim_wording`): over the ``m`` cells of a claim, the cells aligned at
95% each are listed, and those still aligned at the Bonferroni level ``1 − 0.05/m`` (95%
family-wise); a claim that rests on at most a quarter of its cells says so.

**Wording** of the paper's alignment claim: *reproduced* when every cell is aligned at the
family-wise level, *not reproduced* when no cell is aligned at 95%, else *reproduced only in*
the aligned cells, named by model and order.

**One factor at a time** (:func:`factor_verdict`): a variant *lowers* (*raises*) a cell when the
Welch interval of its seeds' mean minus the base's lies below (above) 0, else *no change
detected*.

**Convergence as a trend** (:func:`trend_verdict`): per seed, the slope of ``log drift(n → 2n)``
against ``log n`` inside the trained length (``icl_lens.lab.experiments.convergence``); *converges*
(at the rate of a running average, slope −½) when the slopes' interval lies at or below
``TREND_SLOPE`` = −0.4, *does not converge* when it lies above, else *undecided*. The paper's claim
(attention settles, a recurrent layer does not; :func:`settling_claim`) is *reproduced* when softmax
converges and the GRU does not, *partly* when softmax's slopes lie below the GRU's (Welch interval
below 0) without that, *not* otherwise.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from icl_lens.stats import t_interval, welch_interval

LEVEL = 0.95
FAMILY_ERROR = 0.05
ALIGNED = 0.5  # a mean cosine from which updates count as aligned ("highly aligned" in the paper's words)
WEAK = 0.1  # below this, a cosine above its control still counts as negligible
FEW = 0.25  # a claim resting on at most this share of its cells gets the multiplicity note
TREND_SLOPE = -0.4  # log-drift slope at or below which the implicit weights converge like an average (−½)
CELLS = (("absorb", "step"), ("prefix", "step"), ("absorb", "cumulative"), ("prefix", "cumulative"),
         ("end", "cumulative"))
ALIGNED_VERDICTS = ("holds", "weak")


def _ci_dict(ci) -> dict:
    return {"mean": ci.mean, "low": ci.low, "high": ci.high, "n": ci.n}


def seed_interval(values: Sequence[float], level: float = LEVEL) -> dict | None:
    """``{mean, low, high, n}`` of a t-interval over seeds, or None with fewer than 2 seeds."""
    return _ci_dict(t_interval(values, level)) if len(values) >= 2 else None


def cell_verdict(sgd: Sequence[float], control: Sequence[float], level: float = LEVEL) -> str:
    """The verdict of one alignment cell from its per-seed means (module docstring); ``"one seed"`` below 2 seeds."""
    if len(sgd) != len(control):
        raise ValueError(f"one control value per seed: {len(sgd)} cosines, {len(control)} controls")
    if len(sgd) < 2:
        return "one seed"
    s = t_interval(sgd, level)
    d = t_interval([a - b for a, b in zip(sgd, control)], level)
    if s.low > 0 and d.low > 0:
        return "holds" if s.mean >= ALIGNED else "weak" if s.mean >= WEAK else "negligible"
    if s.high < 0 and d.high < 0:
        return "reversed"
    return "no"


def cell_summary(sgd: Sequence[float], control: Sequence[float], level: float = LEVEL) -> dict:
    """Everything a table row shows about a cell: per-seed values and signs, mean, interval, the control's
    mean and the difference's interval, and the verdict."""
    diff = [a - b for a, b in zip(sgd, control)]
    return {"per_seed": [float(v) for v in sgd], "signs": "".join("+" if v > 0 else "−" for v in sgd),
            "mean": sum(sgd) / len(sgd), "interval": seed_interval(sgd, level),
            "control_mean": sum(control) / len(control), "difference": seed_interval(diff, level),
            "verdict": cell_verdict(sgd, control, level), "seeds": len(sgd)}


def family_level(m: int, family_error: float = FAMILY_ERROR) -> float:
    """The per-cell confidence level that keeps the family-wise level over ``m`` cells (Bonferroni)."""
    if m < 1:
        raise ValueError(f"need at least one cell, got {m}")
    return 1 - family_error / m


def _group(labels: Sequence[tuple[str, str, str]]) -> str:
    by: dict[str, list[str]] = {}
    for model, order, kind in labels:
        by.setdefault(model, []).append(f"{order} {kind}")
    return "; ".join(f"{model} ({', '.join(cells)})" for model, cells in by.items())


def claim_wording(cells: Mapping[tuple[str, str, str], tuple[Sequence[float], Sequence[float]]]) -> dict:
    """The alignment claim over ``cells`` (``(model, order, kind) → (per-seed cosines, per-seed controls)``):
    ``{"verdict": "reproduced" | "reproduced only in" | "not reproduced" | "undecided", "sentence", "aligned",
    "aligned_family", "m", "family_level"}`` (module docstring)."""
    if not cells:
        raise ValueError("claim_wording needs at least one cell")
    m = len(cells)
    level = family_level(m)
    if any(len(s) < 2 for s, _ in cells.values()):
        return {"verdict": "undecided", "sentence": "undecided: fewer than 2 training seeds for some cell",
                "aligned": [], "aligned_family": [], "m": m, "family_level": level}
    aligned = [k for k, (s, c) in cells.items() if cell_verdict(s, c) in ALIGNED_VERDICTS]
    family = [k for k, (s, c) in cells.items() if cell_verdict(s, c, level) in ALIGNED_VERDICTS]
    if len(family) == m:
        verdict, sentence = "reproduced", f"reproduced in all {m} cells (family-wise 95%)"
    elif not aligned:
        verdict, sentence = "not reproduced", f"not reproduced: none of the {m} cells is aligned"
    else:
        verdict = "reproduced only in"
        sentence = (f"reproduced only in {_group(aligned)}: {len(aligned)} of {m} cells aligned at 95% each; at the "
                    f"Bonferroni level {level:.4f} (95% family-wise over {m} cells) "
                    + (f"{len(family)} remain: {_group(family)}" if family else "none remains"))
        if len(aligned) <= FEW * m:
            sentence += f" (multiplicity: the verdict rests on {len(aligned)} of {m} cells)"
    return {"verdict": verdict, "sentence": sentence, "aligned": [list(k) for k in aligned],
            "aligned_family": [list(k) for k in family], "m": m, "family_level": level}


def claim_cells(lab_json: Mapping[str, dict], models: Sequence[str]) -> dict:
    """``(model, order, kind) → (per-seed cosines, per-seed controls)`` of the cells of ``models`` in the ``lab``
    entries of ``eval_finetune_alignment.json`` (``cells`` → ``"<order> <kind>"`` → ``per_seed``,
    ``control_per_seed``): the input of :func:`claim_wording`, read the same way by the report and the summary."""
    out = {}
    for name in models:
        cells = (lab_json.get(name) or {}).get("cells") or {}
        for order, kind in CELLS:
            c = cells.get(f"{order} {kind}")
            if c is not None:
                out[(name, order, kind)] = (c["per_seed"], c["control_per_seed"])
    return out


def factor_verdict(variant: Sequence[float], base: Sequence[float], level: float = LEVEL) -> dict:
    """Whether one factor changes a cell: Welch interval of ``mean(variant) − mean(base)`` over seeds."""
    if len(variant) < 2 or len(base) < 2:
        return {"difference": None, "verdict": "one seed"}
    ci = welch_interval(variant, base, level)
    verdict = "lowers" if ci.high < 0 else "raises" if ci.low > 0 else "no change detected"
    return {"difference": _ci_dict(ci), "verdict": verdict}


def trend_verdict(slopes: Sequence[float], level: float = LEVEL) -> dict:
    """``{"interval", "verdict"}`` of the per-seed log-drift slopes: converges / does not converge / undecided."""
    if len(slopes) < 2:
        return {"interval": None, "verdict": "one seed"}
    ci = t_interval(slopes, level)
    verdict = ("converges" if ci.high <= TREND_SLOPE else "does not converge" if ci.low > TREND_SLOPE
               else "undecided")
    return {"interval": _ci_dict(ci), "verdict": verdict}


def settling_claim(slopes: Mapping[str, Sequence[float]], level: float = LEVEL) -> dict:
    """Dherin et al.'s convergence claim from the per-seed slopes of ``softmax`` and ``gru``:
    ``{"verdict": "reproduced" | "partly" | "not" | "not tested", "softmax", "gru", "difference"}``."""
    if "softmax" not in slopes or "gru" not in slopes:
        return {"verdict": "not tested"}
    att, rnn = trend_verdict(slopes["softmax"], level), trend_verdict(slopes["gru"], level)
    diff = (welch_interval(slopes["softmax"], slopes["gru"], level)
            if min(len(slopes["softmax"]), len(slopes["gru"])) >= 2 else None)
    if att["verdict"] == "converges" and rnn["verdict"] == "does not converge":
        verdict = "reproduced"
    elif diff is not None and diff.high < 0:
        verdict = "partly"
    else:
        verdict = "not"
    return {"verdict": verdict, "softmax": att, "gru": rnn, "difference": None if diff is None else _ci_dict(diff)}
