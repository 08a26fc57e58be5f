"""AUROCs, paired differences and the verdict of one model's run, as numbers (no text).

Every AUROC is for predicting an **incorrect** answer from held-out scores
(:mod:`.detector`), with a percentile-bootstrap 95% interval over questions. "Within kind"
counts only pairs of answers of the same kind (``strata=kind``), so telling kinds apart
earns nothing; kinds whose answers are all wrong (``invented``) or all right drop out of it.

The verdict's stated rule. The *patch detector* is the logistic regression on
``patch, answer + last prompt token`` (fixed in advance, not the best of several). The
*log-probability baseline* is whichever of ``−log p, first answer token``, ``−mean log p,
answer`` and the ``log-prob and entropy`` regression has the highest within-kind AUROC
under the grouped K-fold (the strongest of them, so the comparison favours the baseline).
The patch detector **beats** it when the paired bootstrap 95% interval of the within-kind
AUROC difference (grouped K-fold) lies above 0; patch features **add** to log-probabilities
when the same holds for ``patch + log-prob`` against the ``log-prob and entropy`` regression.

A second look (added after the first full run): the same held-out scores, evaluated only
on answers whose first word does not repeat a word of the question
(:func:`.features.copies_question`), since copied answers are nearly all wrong and easy
to spot from the text alone.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from experiments.spikes.detector import HeldOut
from icl_lens.stats.auroc import AurocDifference, AurocResult, auroc, bootstrap_auroc, bootstrap_auroc_difference

PATCH = "patch, answer + last prompt token"
HIDDEN = "hidden, answer + last prompt token"
LOGPROB_CANDIDATES = ("−log p, first answer token", "−mean log p, answer", "log-prob and entropy")
COLUMNS = ("all, grouped", "within kind, grouped", "within kind, kind held out", "all, kind held out")


@dataclass(frozen=True)
class DetectorAurocs:
    name: str
    family: str
    n_features: int
    aurocs: dict[str, AurocResult | None]  # by COLUMNS


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    within_grouped: AurocDifference | None
    within_held_out: AurocDifference | None
    all_grouped: AurocDifference | None


@dataclass(frozen=True)
class Subset:
    """Within-kind AUROCs of some detectors on a subset of the answers, and the patch − baseline difference."""

    description: str
    n: int
    incorrect: int
    aurocs: dict[str, dict[str, AurocResult | None]]  # detector → {within grouped, within held out}
    patch_vs_baseline: AurocDifference | None


@dataclass(frozen=True)
class Verdict:
    baseline: str
    patch_beats_baseline: bool
    patch_adds_to_logprob: bool
    hidden_beats_baseline: bool


def _both(y: np.ndarray) -> bool:
    return bool(0 < y.sum() < y.size)


def _has_within(y: np.ndarray, strata: np.ndarray) -> bool:
    return any(_both(y[strata == s]) for s in np.unique(strata))


def column_aurocs(h: HeldOut, wrong: np.ndarray, kinds: np.ndarray, n_boot: int) -> dict[str, AurocResult | None]:
    within = _has_within(wrong, kinds)
    return {
        COLUMNS[0]: bootstrap_auroc(h.grouped, wrong, n_boot=n_boot) if _both(wrong) else None,
        COLUMNS[1]: bootstrap_auroc(h.grouped, wrong, strata=kinds, n_boot=n_boot) if within else None,
        COLUMNS[2]: bootstrap_auroc(h.kind_held_out, wrong, strata=kinds, n_boot=n_boot) if within else None,
        COLUMNS[3]: bootstrap_auroc(h.kind_held_out, wrong, n_boot=n_boot) if _both(wrong) else None,
    }


def compare(a: HeldOut, b: HeldOut, wrong: np.ndarray, kinds: np.ndarray, n_boot: int) -> Comparison:
    within = _has_within(wrong, kinds)
    diff = lambda x, y, strata: bootstrap_auroc_difference(x, y, wrong, strata=strata, n_boot=n_boot)  # noqa: E731
    return Comparison(
        a.name, b.name,
        within_grouped=diff(a.grouped, b.grouped, kinds) if within else None,
        within_held_out=diff(a.kind_held_out, b.kind_held_out, kinds) if within else None,
        all_grouped=diff(a.grouped, b.grouped, None) if _both(wrong) else None,
    )


def per_kind(held: dict[str, HeldOut], names: list[str], wrong: np.ndarray, kinds: np.ndarray) -> list[dict]:
    """AUROC (grouped K-fold) of ``names`` inside each kind with both classes; counts for every kind."""
    rows = []
    for kind in sorted(np.unique(kinds)):
        sel = kinds == kind
        row = {"kind": kind, "n": int(sel.sum()), "incorrect": int(wrong[sel].sum())}
        for name in names:
            row[name] = auroc(held[name].grouped[sel], wrong[sel]) if _both(wrong[sel]) else None
        rows.append(row)
    return rows


def verdict(table: dict[str, DetectorAurocs], comparisons: dict[str, Comparison]) -> Verdict:
    def within(name):
        r = table[name].aurocs[COLUMNS[1]]
        return -1.0 if r is None else r.auroc

    baseline = max(LOGPROB_CANDIDATES, key=within)
    above = lambda c: c is not None and c.within_grouped is not None and c.within_grouped.low > 0  # noqa: E731
    return Verdict(baseline, above(comparisons["patch vs baseline"]), above(comparisons["patch + log-prob vs log-prob"]),
                   above(comparisons["hidden vs baseline"]))


def subset(held: dict[str, HeldOut], names: list[str], baseline: str, wrong: np.ndarray, kinds: np.ndarray,
           keep: np.ndarray, description: str, n_boot: int) -> Subset:
    w, k = wrong[keep], kinds[keep]
    within = _has_within(w, k)
    aurocs = {name: {c: (bootstrap_auroc(getattr(held[name], attr)[keep], w, strata=k, n_boot=n_boot)
                         if within else None)
                     for c, attr in ((COLUMNS[1], "grouped"), (COLUMNS[2], "kind_held_out"))}
              for name in names}
    diff = (bootstrap_auroc_difference(held[PATCH].grouped[keep], held[baseline].grouped[keep], w, strata=k,
                                       n_boot=n_boot) if within else None)
    return Subset(description, int(keep.sum()), int(w.sum()), aurocs, diff)


def summarise(held_out: list[HeldOut], n_features: dict[str, int], wrong: np.ndarray, kinds: np.ndarray,
              n_boot: int) -> tuple[dict[str, DetectorAurocs], dict[str, Comparison], Verdict]:
    held = {h.name: h for h in held_out}
    table = {h.name: DetectorAurocs(h.name, h.family, n_features.get(h.name, 1),
                                    column_aurocs(h, wrong, kinds, n_boot)) for h in held_out}
    within = lambda name: (table[name].aurocs[COLUMNS[1]].auroc if table[name].aurocs[COLUMNS[1]] else -1.0)  # noqa: E731
    baseline = max(LOGPROB_CANDIDATES, key=within)
    comparisons = {
        "patch vs baseline": compare(held[PATCH], held[baseline], wrong, kinds, n_boot),
        "patch + log-prob vs log-prob": compare(held["patch + log-prob"], held["log-prob and entropy"], wrong, kinds,
                                                n_boot),
        "hidden vs baseline": compare(held[HIDDEN], held[baseline], wrong, kinds, n_boot),
        "patch vs hidden": compare(held[PATCH], held[HIDDEN], wrong, kinds, n_boot),
    }
    return table, comparisons, verdict(table, comparisons)


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
