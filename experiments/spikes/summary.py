"""Within-kind AUROCs against the baselines, and the rule that picks the shipped detector, as numbers.

Every AUROC is for predicting an **incorrect** answer from held-out scores
(:mod:`.detector`). *Within kind* counts only pairs of answers in the same template stratum
(:func:`experiments.factual_prompts.stratum`: the question's kind, with an invented "capital
of X" question in the ``capital`` stratum), so telling kinds apart earns nothing and the
invented questions count. Intervals are 95% **cluster** bootstrap intervals: subjects are
resampled, every question about a subject entering a resample together
(:func:`icl_lens.stats._bootstrap.resample_counts` with ``groups``), matching the folds,
which also group by subject.

**Beats.** Detector ``A`` beats baseline ``B`` when the paired cluster-bootstrap 95% interval
of ``AUROC_A − AUROC_B`` (within kind, same resamples) lies above 0. Baselines that could
explain a detector away, per table:

* answer tokens: the answer's length in tokens; ``−log p``: the best by within-kind AUROC of
  ``−log p, first answer token``, ``−mean log p, answer`` and the ``log-prob and entropy``
  regression (the strongest, so the comparison favours the baseline); the hidden-state probe
  ``hidden, answer + last prompt token``; the ``bag of answer tokens``;
* prompt only: the same length; ``−log p``: the best of ``−log p, first answer token`` and
  ``entropy, first answer token`` (both read from the distribution after the prompt); the
  prompt-only probe ``hidden, prompt tail``; (no bag of tokens: it needs the answer).

**The rule that picks the shipped detector** (fixed before the run): subjects are split in
two halves (seeded). On the calibration half only, every patch candidate
(:data:`PATCH_CANDIDATES`; and the unsupervised spike score, whose statistic and window are
first chosen there as the pair with the highest within-kind AUROC) is scored out of fold
(grouped K-fold inside the half); the candidate with the highest within-kind AUROC wins. It
is the average of its K fold models (:func:`.detector.averaged_model`), its score is
Platt-calibrated to ``p_wrong`` on the half's out-of-fold scores, and its threshold is the one above which at most 5% of the
half's correct answers score (one-sided 95% Wilson bound, :func:`.calibration.threshold_for_rate`).
The held-out half measures the flag: the share of correct and of wrong answers flagged
(cluster intervals), precision beside the base rate. The flag meets the target when it flags
at most 5% of held-out correct answers and the interval of its wrong-answer rate lies above 5%.
The shipped file carries the winner's within-kind AUROC from the all-subject grouped K-fold
table and the strongest baseline's; ``beats_baseline`` is whether it beats every baseline of
its table.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from experiments.spikes.calibration import threshold_for_rate
from experiments.spikes.detector import HeldOut, averaged_model, held_out_scores
from icl_lens.stats import AurocDifference, AurocResult, auroc, bootstrap_auroc, bootstrap_auroc_difference
from icl_lens.stats import bootstrap_ratio
from icl_lens.stats import LAMBDAS, fit_logistic

LENGTH = "answer length in tokens"
BAG = "bag of answer tokens"
HIDDEN_ANSWER = "hidden, answer + last prompt token"
HIDDEN_PROMPT = "hidden, prompt tail"
LOGPROB_ANSWER = ("−log p, first answer token", "−mean log p, answer", "log-prob and entropy")
LOGPROB_PROMPT = ("−log p, first answer token", "entropy, first answer token")
PATCH_CANDIDATES = ("patch, answer tokens", "patch, answer + last prompt token", "patch, prompt tail")
ANSWER_ROWS = ("patch, answer tokens", "patch, answer + last prompt token", "patch + log-prob", HIDDEN_ANSWER,
               BAG, "log-prob and entropy", "−log p, first answer token", "−mean log p, answer",
               "entropy, first answer token", "mean entropy, answer", LENGTH, "answer repeats a question word",
               "spike score (mean, window 16), max over answer")
PROMPT_ROWS = ("patch, prompt tail", HIDDEN_PROMPT, "−log p, first answer token", "entropy, first answer token", LENGTH)
TARGET_RATE = 0.05


@dataclass(frozen=True)
class Row:
    """One detector's within-kind AUROC and its paired differences against the table's baselines."""

    name: str
    family: str
    n_features: int
    auroc: AurocResult | None
    versus: dict[str, AurocDifference | None]  # baseline label → A − B (None: the row is that baseline)

    def beats(self, label: str) -> bool | None:
        d = self.versus.get(label)
        return None if d is None else bool(d.low > 0)


@dataclass(frozen=True)
class Table:
    """One table (answer-token or prompt-only features): its baselines by label, and its rows."""

    title: str
    baselines: dict[str, str]  # label ("length", "−log p", "hidden probe", "bag of tokens") → detector name
    rows: dict[str, Row]


@dataclass(frozen=True)
class FlagMeasure:
    """The shipped detector's flag on the held-out half of the subjects."""

    detector: str
    readout: str
    statistic: str
    window: int
    calibration_aurocs: dict[str, float]  # candidate → within-kind AUROC on the calibration half (out of fold)
    threshold: float  # on p_wrong
    platt: tuple[float, float]
    held_out_answers: int
    held_out_wrong: int
    base_rate: float  # share of held-out answers that are wrong
    correct_flagged: float
    correct_flagged_interval: tuple[float, float] | None
    wrong_flagged: float
    wrong_flagged_interval: tuple[float, float] | None
    precision: float
    precision_interval: tuple[float, float] | None
    held_out_auroc: AurocResult | None
    meets_target: bool


def _both(y: np.ndarray) -> bool:
    return bool(0 < y.sum() < y.size)


def has_within(y: np.ndarray, strata: np.ndarray) -> bool:
    return any(_both(y[strata == s]) for s in np.unique(strata))


def within_auroc(scores, wrong, strata, groups, n_boot: int) -> AurocResult | None:
    if not has_within(wrong, strata):
        return None
    return bootstrap_auroc(scores, wrong, strata=strata, groups=groups, n_boot=n_boot)


def point_within(scores, wrong, strata) -> float:
    return auroc(scores, wrong, strata) if has_within(wrong, strata) else float("nan")


def best_of(names, held: dict[str, HeldOut], wrong, strata) -> str:
    return max(names, key=lambda n: np.nan_to_num(point_within(held[n].grouped, wrong, strata), nan=-1.0))


def build_table(title: str, names, baselines: dict[str, str], held: dict[str, HeldOut], n_features: dict[str, int],
                wrong, strata, groups, n_boot: int) -> Table:
    rows = {}
    for name in names:
        h = held[name]
        versus = {}
        for label, base in baselines.items():
            if base == name or not has_within(wrong, strata):
                versus[label] = None
            else:
                versus[label] = bootstrap_auroc_difference(h.grouped, held[base].grouped, wrong, strata=strata,
                                                           groups=groups, n_boot=n_boot)
        rows[name] = Row(name, h.family, n_features.get(name, 1),
                         within_auroc(h.grouped, wrong, strata, groups, n_boot), versus)
    return Table(title, dict(baselines), rows)


def tables(held: dict[str, HeldOut], n_features: dict[str, int], wrong, strata, groups, n_boot: int
           ) -> tuple[Table, Table]:
    """The answer-token and the prompt-only table (module docstring)."""
    answer = build_table(
        "answer-token features", ANSWER_ROWS,
        {"length": LENGTH, "−log p": best_of(LOGPROB_ANSWER, held, wrong, strata), "hidden probe": HIDDEN_ANSWER,
         "bag of tokens": BAG}, held, n_features, wrong, strata, groups, n_boot)
    prompt = build_table(
        "prompt-only features", PROMPT_ROWS,
        {"length": LENGTH, "−log p": best_of(LOGPROB_PROMPT, held, wrong, strata), "hidden probe": HIDDEN_PROMPT},
        held, n_features, wrong, strata, groups, n_boot)
    return answer, prompt


def choose_on_calibration(sets: dict[str, np.ndarray], single: dict[str, np.ndarray], spike_names: list[str],
                          wrong, strata, groups, calibrate: np.ndarray, *, folds: int, inner_folds: int, seed: int,
                          lambdas=LAMBDAS) -> tuple[str, dict[str, float], dict[str, HeldOut]]:
    """The rule's winner on the calibration half, every candidate's AUROC there, and the candidates'
    out-of-fold scores on the calibration rows with their fold models (module docstring)."""
    c = calibrate
    spike_auroc = {n: point_within(single[n][c], wrong[c], strata[c]) for n in spike_names}
    spike = max(spike_names, key=lambda n: np.nan_to_num(spike_auroc[n], nan=-1.0))
    held = held_out_scores({n: sets[n][c] for n in PATCH_CANDIDATES}, {spike: single[spike][c]}, wrong[c],
                           groups[c], k=folds, inner_k=inner_folds, lambdas=lambdas, seed=seed)
    aurocs = {n: point_within(h.grouped, wrong[c], strata[c]) for n, h in held.items()}
    winner = max(aurocs, key=lambda n: np.nan_to_num(aurocs[n], nan=-1.0))
    return winner, aurocs, held


def platt(scores: np.ndarray, wrong: np.ndarray) -> tuple[float, float]:
    """``(α, β)`` of ``p = σ(α s + β)`` fitted on scores and labels (a one-feature logistic fit, tiny λ)."""
    m = fit_logistic(np.asarray(scores, dtype=float)[:, None], wrong, lam=1e-6)
    a = float(m.w[0] / m.scale[0])
    return a, float(m.b - a * m.mean[0])


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=float)))


def measure_flag(winner: str, oof: np.ndarray, all_scores: np.ndarray, wrong, strata, groups, calibrate, *,
                 calibration_aurocs: dict[str, float], readout: str, statistic: str, window: int,
                 n_boot: int, rate: float = TARGET_RATE) -> FlagMeasure:
    """Platt and threshold on the calibration half's out-of-fold scores; the flag measured on the other half."""
    c, h = calibrate, ~calibrate
    a, b = platt(oof, wrong[c])
    p_cal = sigmoid(a * oof + b)
    threshold = threshold_for_rate(p_cal[~wrong[c]], rate)
    p = sigmoid(a * all_scores + b)
    flagged = p > threshold
    fh, wh, gh = flagged[h], wrong[h], groups[h]
    ratio = lambda x, y: bootstrap_ratio(x.astype(float), y.astype(float), groups=gh, n_boot=n_boot)  # noqa: E731
    correct_rate = float(fh[~wh].mean()) if (~wh).any() else float("nan")
    wrong_rate = float(fh[wh].mean()) if wh.any() else float("nan")
    wrong_ci = ratio(fh & wh, wh)
    precision = float((fh & wh).sum() / fh.sum()) if fh.any() else float("nan")
    meets = bool(correct_rate <= rate and wrong_ci is not None and wrong_ci[0] > rate)
    return FlagMeasure(
        detector=winner, readout=readout, statistic=statistic, window=window, calibration_aurocs=calibration_aurocs,
        threshold=float(threshold), platt=(a, b), held_out_answers=int(h.sum()), held_out_wrong=int(wh.sum()),
        base_rate=float(wh.mean()), correct_flagged=correct_rate, correct_flagged_interval=ratio(fh & ~wh, ~wh),
        wrong_flagged=wrong_rate, wrong_flagged_interval=wrong_ci, precision=precision,
        precision_interval=ratio(fh & wh, fh) if fh.any() else None,
        held_out_auroc=within_auroc(all_scores[h], wh, strata[h], gh, n_boot), meets_target=meets)


def shipped_entry(measure: FlagMeasure, table: Table, model_fit, command: str) -> dict:
    """The detectors file's entry for one model (read by :mod:`icl_lens.spikes._detector`)."""
    row = table.rows.get(measure.detector)
    base_name = max(table.baselines.values(),
                    key=lambda n: -1.0 if table.rows.get(n) is None or table.rows[n].auroc is None
                    else table.rows[n].auroc.auroc)
    base = table.rows[base_name].auroc
    beats = bool(row is not None and all(row.beats(label) for label in table.baselines))
    detector = {
        "name": measure.detector, "readout": measure.readout, "statistic": measure.statistic,
        "window": measure.window, "platt": list(measure.platt), "threshold": measure.threshold,
        "auroc_within_kind": None if row is None or row.auroc is None else row.auroc.auroc,
        "auroc_within_kind_interval": None if row is None or row.auroc is None else [row.auroc.low, row.auroc.high],
        "baseline": base_name, "baseline_auroc_within_kind": None if base is None else base.auroc,
        "baselines_auroc_within_kind": {label: (None if table.rows[n].auroc is None else table.rows[n].auroc.auroc)
                                        for label, n in table.baselines.items()},
        "beats_baseline": beats,
    }
    if model_fit is not None:
        detector.update({"weights": model_fit.w.tolist(), "mean": model_fit.mean.tolist(),
                         "scale": model_fit.scale.tolist(), "bias": float(model_fit.b), "lambda": model_fit.lam})
    return {"command": command, "detector": detector, "held_out": to_json(measure)}


def to_json(x):
    """Dataclasses, numpy scalars and NaN made JSON-ready (NaN → None)."""
    if hasattr(x, "__dataclass_fields__"):
        return to_json(asdict(x))
    if isinstance(x, dict):
        return {str(k): to_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_json(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if not np.isfinite(x) else float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


__all__ = ["Row", "Table", "FlagMeasure", "tables", "choose_on_calibration", "measure_flag", "shipped_entry",
           "averaged_model", "to_json", "platt"]
