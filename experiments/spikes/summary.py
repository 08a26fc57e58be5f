"""The rules of the spike evaluation, as numbers: tables against the baselines, the shipping rule, flag verdicts.

Every AUROC is for predicting an **incorrect** answer. *Within kind* counts only pairs of
answers in the same template stratum (:func:`experiments.factual_prompts.stratum`: the
question's kind, with an invented "capital of X" question in the ``capital`` stratum), so
telling kinds apart earns nothing. Intervals are 95% **cluster** bootstrap intervals:
subjects are resampled, every question about a subject entering a resample together.

**Leave-one-kind-out table (the primary protocol, :mod:`.loko`).** Every candidate of
:data:`LOKO_CANDIDATES` — the patch detectors and the baselines a user already has (answer
length; mean, minimum and first-token −log p; first-token entropy; the hidden-state probe,
also PCA-reduced to the patch detector's feature count; sampling agreement; the spike score)
— fitted on the calibration half without a kind and scored on that kind's held-out half.
AUROC: mean over kinds of the within-kind AUROC, subjects resampled within kinds. Columns:
the paired difference against the ``−log p`` baseline (the best by this table's AUROC of
:data:`LOGPROB_SINGLE`: the comparison favours the baseline), the hidden-state probe and
sampling agreement.

**Does the patch add anything?** Two nested pairs, each fitted the same way: ``patch +
log-prob`` − ``log-prob and entropy`` (the patch features added to −log p and entropy) and
``hidden + patch`` − ``hidden, answer + last prompt token``; paired differences under
leave-one-kind-out, on all held-out answers and on those whose first word does not repeat a
question word. *Adds something* when the interval lies above 0.

**The shipping rule** (:func:`ship_rule`, fixed before the run): per model, the candidate
with the highest leave-one-kind-out AUROC among **all** of :data:`LOKO_CANDIDATES`,
baselines included (ties: fewer features, then name). It is fitted on the whole calibration
half (:func:`.loko.fit_candidate`) and shipped whatever it is.

**Flag rates** (:func:`flag_rates`): the share of correct and of wrong answers flagged,
pooled and within each stratum, with cluster intervals. Within-stratum summary: the largest
correct-answer rate over strata, and the mean over strata holding both classes of
``wrong rate − correct rate`` (*within-stratum detection*; a flag that only knows the kind
scores exactly 0), subjects resampled within strata. The **kind-only flag** (each
stratum's calibration error rate, thresholded like the others) is the baseline that pooled
rates cannot tell from error detection.

**Verdicts** (fixed before the run):

* the flag *meets the within-stratum target* when in every stratum with correct held-out
  answers it flags at most 5% of them and in every stratum with wrong held-out answers the
  interval of its wrong-answer rate lies above 5%;
* (the earlier, pooled target: at most 5% of all correct answers, wrong-answer interval above 5%);
* the shipped ``p_wrong`` *ranks at least as well as −log p* on unseen kinds when the paired
  leave-one-kind-out interval of (shipped − ``−log p`` baseline) does not lie below 0;
* token patches *add something* beyond −log p / the hidden state when the nested pair's
  leave-one-kind-out interval lies above 0.

**Within-sample table** (kept from issue 24, beside the primary one): grouped K-fold by
subject over all answers, every kind seen in training; rows as before plus the new baselines
and the kind-only prior (within-kind AUROC 0.5 by construction; its pooled AUROC shows what
pooling over kinds earns).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from experiments.spikes.detector import HeldOut
from experiments.spikes.loko import TARGET_RATE, Fitted
from icl_lens.stats import (
    AurocDifference,
    AurocResult,
    MeanAuroc,
    auroc,
    bootstrap_auroc,
    bootstrap_auroc_difference,
    bootstrap_ratio,
    percentile_interval,
    resample_counts,
    row_nanmean,
    stratum_mean_auroc,
    stratum_mean_auroc_difference,
)

LENGTH = "answer length in tokens"
BAG = "bag of answer tokens"
HIDDEN_ANSWER = "hidden, answer + last prompt token"
HIDDEN_PROMPT = "hidden, prompt tail"
HIDDEN_PCA = "hidden, PCA"
HIDDEN_PATCH = "hidden + patch"
LOGPROB_FIT = "log-prob and entropy"
PATCH_LOGPROB = "patch + log-prob"
PATCH_LAST = "patch, answer + last prompt token"
SAMPLING = "sampling disagreement"
SPIKE = "spike score (mean, window 16), max over answer"
KIND_ONLY = "kind only (calibration error rate of the stratum)"
LOGPROB_SINGLE = ("−mean log p, answer", "−min log p, answer", "−log p, first answer token",
                  "entropy, first answer token")
LOGPROB_ANSWER = ("−log p, first answer token", "−mean log p, answer", LOGPROB_FIT)
LOGPROB_PROMPT = ("−log p, first answer token", "entropy, first answer token")
PATCH_CANDIDATES = ("patch, answer tokens", PATCH_LAST, "patch, prompt tail")
# every candidate of the leave-one-kind-out table and of the shipping rule (frozen before the run)
LOKO_SUPERVISED = (*PATCH_CANDIDATES, PATCH_LOGPROB, HIDDEN_PATCH, HIDDEN_ANSWER, HIDDEN_PCA, LOGPROB_FIT)
LOKO_SINGLE = (*LOGPROB_SINGLE, LENGTH, SAMPLING, SPIKE)
LOKO_CANDIDATES = LOKO_SUPERVISED + LOKO_SINGLE
NESTED = {"beyond −log p": (PATCH_LOGPROB, LOGPROB_FIT), "beyond the hidden state": (HIDDEN_PATCH, HIDDEN_ANSWER)}
ANSWER_ROWS = ("patch, answer tokens", PATCH_LAST, PATCH_LOGPROB, HIDDEN_PATCH, HIDDEN_ANSWER, HIDDEN_PCA,
               BAG, LOGPROB_FIT, "−log p, first answer token", "−mean log p, answer", "−min log p, answer",
               "entropy, first answer token", "mean entropy, answer", LENGTH, SAMPLING,
               "answer repeats a question word", SPIKE, KIND_ONLY)
PROMPT_ROWS = ("patch, prompt tail", HIDDEN_PROMPT, "−log p, first answer token", "entropy, first answer token", LENGTH)


@dataclass(frozen=True)
class Row:
    """One detector's within-kind AUROC and its paired differences against the table's baselines."""

    name: str
    family: str
    n_features: int
    auroc: AurocResult | MeanAuroc | None
    versus: dict[str, AurocDifference | None]  # baseline label → A − B (None: the row is that baseline)
    pooled: float = float("nan")  # AUROC over all pairs, kinds mixed (point estimate)

    def beats(self, label: str) -> bool | None:
        d = self.versus.get(label)
        return None if d is None else bool(d.low > 0)


@dataclass(frozen=True)
class Table:
    """One table: its baselines by label, and its rows."""

    title: str
    baselines: dict[str, str]  # label ("length", "−log p", "hidden probe", …) → detector name
    rows: dict[str, Row]


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
    """The within-sample table: grouped K-fold scores of every row, within-kind AUROC and paired differences."""
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
        rows[name] = Row(name, h.family, n_features.get(name, 1), within_auroc(h.grouped, wrong, strata, groups, n_boot),
                         versus, auroc(h.grouped, wrong) if _both(wrong) else float("nan"))
    return Table(title, dict(baselines), rows)


def tables(held: dict[str, HeldOut], n_features: dict[str, int], wrong, strata, groups, n_boot: int
           ) -> tuple[Table, Table]:
    """The within-sample answer-token and prompt-only tables (module docstring)."""
    answer = build_table(
        "answer-token features, within sample", [n for n in ANSWER_ROWS if n in held],
        {"length": LENGTH, "−log p": best_of(LOGPROB_ANSWER, held, wrong, strata), "hidden probe": HIDDEN_ANSWER,
         "bag of tokens": BAG, "sampling agreement": SAMPLING}, held, n_features, wrong, strata, groups, n_boot)
    prompt = build_table(
        "prompt-only features, within sample", PROMPT_ROWS,
        {"length": LENGTH, "−log p": best_of(LOGPROB_PROMPT, held, wrong, strata), "hidden probe": HIDDEN_PROMPT},
        held, n_features, wrong, strata, groups, n_boot)
    return answer, prompt


# ---------------------------------------------------------------- leave one kind out


def loko_auroc(scores: np.ndarray, wrong, strata, groups, held: np.ndarray, n_boot: int, seed: int = 0
               ) -> MeanAuroc | None:
    """Mean over kinds of the within-kind AUROC of the held-out rows (``held``), subjects resampled within kinds."""
    if not has_within(wrong[held], strata[held]):
        return None
    return stratum_mean_auroc(scores[held], wrong[held], strata[held], groups=groups[held], n_boot=n_boot, seed=seed)


def loko_difference(a: np.ndarray, b: np.ndarray, wrong, strata, groups, held: np.ndarray, n_boot: int,
                    seed: int = 0) -> AurocDifference | None:
    if not has_within(wrong[held], strata[held]):
        return None
    return stratum_mean_auroc_difference(a[held], b[held], wrong[held], strata[held], groups=groups[held],
                                         n_boot=n_boot, seed=seed)


def best_loko(names, aurocs: dict[str, MeanAuroc | None]) -> str:
    return max(names, key=lambda n: -1.0 if aurocs.get(n) is None else aurocs[n].auroc)


def loko_table(scores: dict[str, np.ndarray], n_features: dict[str, int], families: dict[str, str], wrong, strata,
               groups, held: np.ndarray, n_boot: int) -> Table:
    """The leave-one-kind-out table (module docstring)."""
    aurocs = {n: loko_auroc(scores[n], wrong, strata, groups, held, n_boot) for n in LOKO_CANDIDATES}
    baselines = {"−log p": best_loko(LOGPROB_SINGLE, aurocs), "hidden probe": HIDDEN_ANSWER,
                 "sampling agreement": SAMPLING}
    rows = {}
    for name in LOKO_CANDIDATES:
        versus = {label: None if base == name else
                  loko_difference(scores[name], scores[base], wrong, strata, groups, held, n_boot)
                  for label, base in baselines.items()}
        pooled = auroc(scores[name][held], wrong[held]) if _both(wrong[held]) else float("nan")
        rows[name] = Row(name, families[name], n_features[name], aurocs[name], versus, pooled)
    return Table("leave one kind out", baselines, rows)


def patch_adds(scores: dict[str, np.ndarray], wrong, strata, groups, held: np.ndarray, no_copy: np.ndarray,
               n_boot: int) -> dict[str, dict[str, AurocDifference | None]]:
    """``{"beyond −log p" | "beyond the hidden state": {"all answers" | "no copied answer": difference}}``."""
    return {label: {"all answers": loko_difference(scores[a], scores[b], wrong, strata, groups, held, n_boot),
                    "no copied answer": loko_difference(scores[a], scores[b], wrong, strata, groups, held & no_copy,
                                                        n_boot)}
            for label, (a, b) in NESTED.items()}


def ship_rule(table: Table) -> str:
    """The shipping rule (module docstring): highest leave-one-kind-out AUROC among all candidates; ties: fewer
    features, then name."""
    def key(name: str):
        row = table.rows[name]
        value = -1.0 if row.auroc is None else row.auroc.auroc
        return (-round(value, 12), row.n_features, name)
    return min(LOKO_CANDIDATES, key=key)


def ranks_as_well(table: Table, shipped: str) -> bool:
    """The shipped detector ranks at least as well as the −log p baseline on unseen kinds (interval not below 0)."""
    d = table.rows[shipped].versus.get("−log p")
    return True if d is None else bool(d.high >= 0)


def adds_something(d: AurocDifference | None) -> bool | None:
    return None if d is None else bool(d.low > 0)


# ---------------------------------------------------------------- flag rates, pooled and within stratum


@dataclass(frozen=True)
class StratumRates:
    stratum: str
    correct: int
    wrong: int
    correct_flagged: float
    correct_flagged_interval: tuple[float, float] | None
    wrong_flagged: float
    wrong_flagged_interval: tuple[float, float] | None


@dataclass(frozen=True)
class FlagRates:
    """A flag's rates on held-out answers, pooled and within each stratum, and the verdicts (module docstring)."""

    detector: str
    protocol: str  # "leave one kind out" | "within sample"
    answers: int
    wrong: int
    base_rate: float
    correct_flagged: float
    correct_flagged_interval: tuple[float, float] | None
    wrong_flagged: float
    wrong_flagged_interval: tuple[float, float] | None
    precision: float
    precision_interval: tuple[float, float] | None
    strata: tuple[StratumRates, ...]
    within_detection: float  # mean over strata with both classes of (wrong rate − correct rate)
    within_detection_interval: tuple[float, float] | None
    max_correct_flagged: float  # the largest correct-answer rate over strata with correct answers
    strata_correct_ok: int  # strata whose correct-answer rate is at most the target
    strata_with_correct: int
    strata_wrong_ok: int  # strata whose wrong-answer rate interval lies above the target
    strata_with_wrong: int
    meets_pooled: bool
    meets_within: bool


def _rate(flag: np.ndarray, sel: np.ndarray) -> float:
    return float(flag[sel].mean()) if sel.any() else float("nan")


def flag_rates(name: str, protocol: str, flagged: np.ndarray, wrong: np.ndarray, strata: np.ndarray,
               groups: np.ndarray, *, n_boot: int, rate: float = TARGET_RATE, seed: int = 0) -> FlagRates:
    """Rates of a flag on the given (held-out) answers, pooled and per stratum, with the verdicts."""
    f, w = np.asarray(flagged, bool), np.asarray(wrong, bool)

    def ratio(x, y, g):
        return bootstrap_ratio(x.astype(float), y.astype(float), groups=g, n_boot=n_boot, seed=seed)

    rows, boots = [], []
    for i, s in enumerate(sorted(np.unique(strata).tolist())):
        sel = strata == s
        fs, ws, gs = f[sel], w[sel], groups[sel]
        rows.append(StratumRates(s, int((~ws).sum()), int(ws.sum()), _rate(fs, ~ws), ratio(fs & ~ws, ~ws, gs),
                                 _rate(fs, ws), ratio(fs & ws, ws, gs)))
        if _both(ws):
            counts = resample_counts(int(sel.sum()), n_boot, seed + i, gs)
            nw, nc = counts @ ws, counts @ ~ws
            ok = (nw > 0) & (nc > 0)
            boots.append(np.where(ok, (counts @ (fs & ws)) / np.where(ok, nw, 1) - (counts @ (fs & ~ws))
                                  / np.where(ok, nc, 1), np.nan))
    carrying = [r for r in rows if r.correct and r.wrong]
    detection = float(np.mean([r.wrong_flagged - r.correct_flagged for r in carrying])) if carrying else float("nan")
    interval = None
    if boots:
        interval = percentile_interval(row_nanmean(np.stack(boots, axis=1)))
    with_correct = [r for r in rows if r.correct]
    with_wrong = [r for r in rows if r.wrong]
    correct_ok = sum(r.correct_flagged <= rate for r in with_correct)
    wrong_ok = sum(r.wrong_flagged_interval is not None and r.wrong_flagged_interval[0] > rate for r in with_wrong)
    correct_rate, wrong_rate = _rate(f, ~w), _rate(f, w)
    wrong_ci = ratio(f & w, w, groups)
    return FlagRates(
        detector=name, protocol=protocol, answers=int(f.size), wrong=int(w.sum()),
        base_rate=float(w.mean()) if w.size else float("nan"),
        correct_flagged=correct_rate, correct_flagged_interval=ratio(f & ~w, ~w, groups),
        wrong_flagged=wrong_rate, wrong_flagged_interval=wrong_ci,
        precision=float((f & w).sum() / f.sum()) if f.any() else float("nan"),
        precision_interval=ratio(f & w, f, groups) if f.any() else None,
        strata=tuple(rows), within_detection=detection, within_detection_interval=interval,
        max_correct_flagged=max((r.correct_flagged for r in with_correct), default=float("nan")),
        strata_correct_ok=int(correct_ok), strata_with_correct=len(with_correct),
        strata_wrong_ok=int(wrong_ok), strata_with_wrong=len(with_wrong),
        meets_pooled=bool(correct_rate <= rate and wrong_ci is not None and wrong_ci[0] > rate),
        meets_within=bool(correct_ok == len(with_correct) and wrong_ok == len(with_wrong)),
    )


def kind_only_flag(wrong: np.ndarray, strata: np.ndarray, calibrate: np.ndarray, rate: float = TARGET_RATE
                   ) -> np.ndarray:
    """The kind-only flag of every answer: its stratum's calibration error rate above the threshold that flags at
    most ``rate`` of the calibration half's correct answers (one-sided 95% Wilson bound)."""
    from experiments.spikes.calibration import threshold_for_rate

    prior = kind_prior(wrong, strata, calibrate)
    correct = prior[calibrate & ~wrong]
    threshold = threshold_for_rate(correct, rate) if correct.size else float("inf")
    return prior > threshold


def kind_prior(wrong: np.ndarray, strata: np.ndarray, train: np.ndarray) -> np.ndarray:
    """Each answer's stratum error rate over the ``train`` rows (the overall rate for a stratum absent there)."""
    overall = float(wrong[train].mean())
    rates = {s: float(wrong[train & (strata == s)].mean()) if (train & (strata == s)).any() else overall
             for s in np.unique(strata)}
    return np.array([rates[s] for s in strata])


# ---------------------------------------------------------------- the shipped entry


def shipped_line(name: str, adds: dict[str, dict[str, AurocDifference | None]]) -> str:
    """The one line the dashboard and ``icl-lens spikes`` print about the flag."""
    def fmt(d):
        return "n/a" if d is None else f"{d.difference:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
    return (f"flag from {name}; token patches add {fmt(adds['beyond −log p']['all answers'])} to −log p and "
            f"{fmt(adds['beyond the hidden state']['all answers'])} to the hidden-state probe (within-kind AUROC "
            "on kinds the detector never saw)")


def shipped_entry(fitted: Fitted, features: tuple[str, ...], loko: Table, within: Table | None,
                  adds: dict, loko_flag: FlagRates, within_flag: FlagRates, command: str) -> dict:
    """The detectors file's entry for one model (read by the library's spike detector)."""
    row = loko.rows[fitted.name]
    w, b = fitted.linear_on_raw() if fitted.basis is not None else (None, None)
    model = fitted.model
    inside = None if within is None else within.rows.get(fitted.name)
    base_label = "−log p"
    detector = {
        "name": fitted.name, "features": list(features), "platt": list(fitted.platt), "threshold": fitted.threshold,
        "auroc_unseen_kinds": row.auroc.auroc if row.auroc else None,
        "auroc_unseen_kinds_interval": [row.auroc.low, row.auroc.high] if row.auroc else None,
        "unseen_kinds": row.auroc.n_strata if row.auroc else 0,
        "auroc_within_kind_all_subjects": inside.auroc.auroc if inside is not None and inside.auroc else None,
        "baselines_auroc_unseen_kinds": {n: (None if loko.rows[n].auroc is None else loko.rows[n].auroc.auroc)
                                         for n in LOKO_CANDIDATES if n != fitted.name},
        "versus": {label: None if d is None else asdict(d) for label, d in row.versus.items()},
        "baseline": loko.baselines[base_label],
        "ranks_as_well_as_neglogp": ranks_as_well(loko, fitted.name),
        "patch_adds": {label: {k: None if d is None else asdict(d) for k, d in v.items()} for label, v in adds.items()},
        "line": shipped_line(fitted.name, adds),
    }
    if model is not None and w is None:
        detector.update({"weights": model.w.tolist(), "mean": model.mean.tolist(), "scale": model.scale.tolist(),
                         "bias": float(model.b), "lambda": model.lam})
    elif model is not None:  # PCA folded into one linear map on the raw features
        detector.update({"weights": w.tolist(), "mean": [0.0] * len(w), "scale": [1.0] * len(w), "bias": b,
                         "lambda": model.lam, "pca_components": int(fitted.basis[1].shape[1])})
    return {"command": command, "detector": detector, "held_out": to_json(within_flag),
            "unseen_kinds": to_json(loko_flag)}


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


__all__ = ["Row", "Table", "FlagRates", "StratumRates", "tables", "loko_table", "patch_adds", "ship_rule",
           "flag_rates", "kind_only_flag", "kind_prior", "shipped_entry", "to_json"]
