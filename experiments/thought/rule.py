"""The thought report's one counting rule, and what it is applied to (issue 38).

**Target rule** (:func:`target_rule`): a (task, model, split) meets the target when the full prompt reaches
``ELIGIBLE`` (50%) on its queries, the ratio ``r = Σ patched / Σ full`` (correct answers on the same queries) is at
least ``TARGET`` (0.9) and the 95% paired percentile-bootstrap lower bound of ``r`` is at least ``RATIO_LOWER``
(0.8). Every count in the report (summary, targets table, per-split tables, the "read from the table" lines,
``experiments.report``'s one-screen summary) calls it; composition calls the same ratio (:func:`ratio_rule`) with
its own threshold: the share of the single patch's accuracy kept, point and lower bound ≥ ``COMPOSE_TARGET``.

**Sampling unit** (:func:`query_units`): the bootstrap resamples queries, except where two queries are one item:
``add``'s ``a + b`` and ``b + a`` are one unordered pair, resampled together (cluster bootstrap,
``icl_lens.stats.bootstrap_ratio(groups=…)``).

**Degenerate intervals**: when the two outcome vectors are identical (the patch right on exactly the queries the full
prompt is right on) every resample gives ``r = 1``, so ``[1.00, 1.00]`` says nothing about the sampling error; it
is reported as "identical answers", not as an interval (:meth:`Ratio.text`). Likewise any interval without spread.

**In range / out of range** (:func:`range_parts`): a fresh query is *in range* when every number it holds lies
within the range the task's generator draws its demonstrations, train and test queries from, at the same place
(:data:`NUMBER_RANGES`) (``add``: both addends 1–9;
``plus_one``: 10–98; ``number_words``: 1–99), *out of range* otherwise (``add`` with an addend of 10–19,
``plus_one`` from 99, ``number_words`` 0, the hundreds and the thousands). Tasks without numbers (words,
translations, lookups) are in range throughout: their fresh pairs are new words of the same kinds
(``experiments/build_tasks.py``). The verdict reads the in-range part; the out-of-range part is a generalisation row
of its own.

**Locality rule** (:func:`locality_rule`): an edit keeps locality when the other task(s) keep at least
``LOCALITY_KEPT`` (90%) of their answers (the lowest share where there are several), the text KL is at most
``LOCALITY_KL`` (0.1 nats) and, where a random control of the same norms was measured beside it, below the control's.
The targets table and the untouched locality set (``experiments/thought/method.py``) both call it; on the untouched
set an edit meets issue 38's locality target when the rule holds *and* its accuracy is held (:func:`target_rule` on
the task's fresh in-range queries).

**Near ties** (:func:`near_tie`): a selection stage's lowest setting and another are tied when the paired bootstrap
95% interval of their mean difference over the (model, task) units both were measured on includes 0.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from experiments.thought.settings import ELIGIBLE, LOCALITY_KEPT, LOCALITY_KL, NOT_ELIGIBLE, RATIO_LOWER, TARGET
from icl_lens.stats import bootstrap_mean, bootstrap_ratio

UNORDERED = frozenset({"add"})  # tasks whose query's numbers commute: a + b and b + a are one sampling unit
PARTS = ("in range", "out of range")
NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class Ratio:
    """``Σ num / Σ den`` over the same queries with its paired bootstrap interval and the rule's verdict.

    ``ci``: None where the row keeps no per-query outcomes (then the rule cannot be met). ``identical``: the two
    outcome vectors are the same (the interval, [1, 1], has no spread to resample). ``eligible``: the denominator's
    accuracy reaches the rule's floor. ``units``: independent sampling units among the ``n`` queries."""

    ratio: float | None
    ci: tuple[float, float] | None
    identical: bool
    eligible: bool
    met: bool
    n: int
    units: int

    @property
    def verdict(self) -> str:
        return NOT_ELIGIBLE if not self.eligible else "met" if self.met else "missed"

    @property
    def lower(self) -> float | None:
        return None if self.ci is None else self.ci[0]

    def text(self) -> str:
        """``0.92 [0.85–0.99]``; ``1.00 (identical answers on all 96)`` where the outcome vectors are the same; an
        interval without spread is named as such."""
        if self.ratio is None:
            return "–"
        if self.identical:
            return f"{self.ratio:.2f} (identical answers on all {self.n})"
        if self.ci is None:
            return f"{self.ratio:.2f} (no per-query outcomes: no interval)"
        if self.ci[0] == self.ci[1]:
            return f"{self.ratio:.2f} [{self.ci[0]:.2f}, no spread]"
        return f"{self.ratio:.2f} [{self.ci[0]:.2f}–{self.ci[1]:.2f}]"


def ratio_rule(num, den, *, point: float = TARGET, lower: float = RATIO_LOWER, units=None,
               eligible: bool = True) -> Ratio:
    """The rule on two per-query 0/1 outcome vectors of the same queries (``num`` over ``den``): met when
    ``eligible``, ``Σnum/Σden ≥ point`` and the paired bootstrap lower bound ``≥ lower``. ``units``: one sampling
    unit per query (:func:`query_units`; None: each query its own)."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if num.shape != den.shape:
        raise ValueError(f"the two outcome vectors differ in length ({num.size} and {den.size})")
    n = int(den.size)
    n_units = n if units is None else len(set(units))
    if den.sum() == 0:
        return Ratio(None, None, False, eligible, False, n, n_units)
    ratio = float(num.sum() / den.sum())
    ci = bootstrap_ratio(num, den, groups=None if units is None else list(units))
    identical = bool(np.array_equal(num, den))
    met = eligible and ratio >= point and ci is not None and ci[0] >= lower
    return Ratio(ratio, ci, identical, eligible, met, n, n_units)


def target_rule(r: dict, *, of: str = "patched", to: str = "full", units=None) -> Ratio:
    """The target rule on a result row (``outcomes``, ``correct``, ``accuracy`` per condition): condition ``of``
    against ``to`` (default patched against full) on the row's queries; eligible where ``to``'s accuracy ≥
    ``ELIGIBLE``. ``units`` default: the row's own (``r["units"]``, set by :func:`part_row`), else
    :func:`query_units` of its task and split. A row without per-query outcomes gets its point ratio and no
    interval, so it cannot meet the rule."""
    eligible = r["accuracy"][to] >= ELIGIBLE
    o = r.get("outcomes") or {}
    if of in o and to in o:
        if units is None:
            units = r.get("units", query_units(r.get("task"), r.get("split"), len(o[to])))
        return ratio_rule(o[of], o[to], units=units, eligible=eligible)
    full = r["correct"][to]
    ratio = r["correct"][of] / full if full else None
    return Ratio(ratio, None, False, eligible, False, r["n_test"], r["n_test"])


def with_patched(r: dict, other: dict) -> dict:
    """Row ``r`` with its ``patched`` condition taken from ``other`` (a tuned or earlier patch on the same queries)."""
    out = {**r, "correct": {**r["correct"], "patched": other["correct"]["patched"]},
           "accuracy": {**r["accuracy"], "patched": other["accuracy"]["patched"]}}
    if "outcomes" in r and "patched" in (other.get("outcomes") or {}):
        out["outcomes"] = {**r["outcomes"], "patched": other["outcomes"]["patched"]}
    else:
        out.pop("outcomes", None)
    return out


def locality_rule(kept: float, kl: float, control_kl: float | None = None) -> bool:
    """The one locality rule (module docstring): ``kept`` (the lowest share of another task's answers kept)
    ``≥ LOCALITY_KEPT``, ``kl ≤ LOCALITY_KL`` nats and, given a random control's KL, ``kl`` below it."""
    return kept >= LOCALITY_KEPT and kl <= LOCALITY_KL and (control_kl is None or kl < control_kl)


@lru_cache(maxsize=None)
def split_queries(task: str, split: str) -> tuple[str, ...] | None:
    """The queries of a shipped task's split, in the order the rows keep their outcomes (None: not a shipped task)."""
    from icl_lens.thought.tasks import SHIPPED_TASKS, load_task

    if task not in SHIPPED_TASKS or split not in ("test", "fresh", "train"):
        return None
    return tuple(q for q, _ in getattr(load_task(task), split))


def query_units(task: str | None, split: str | None, n: int) -> list | None:
    """One sampling unit per query of ``task``'s ``split``: ``add``'s ``a + b`` and ``b + a`` share one (the
    unordered pair of its numbers); elsewhere None (each query its own unit). None too where the split's queries are
    not the row's (``n`` differs)."""
    if task not in UNORDERED:
        return None
    queries = split_queries(task, split)
    if queries is None or len(queries) != n:
        return None
    return ["+".join(sorted(NUMBER.findall(q), key=int)) for q in queries]


# Per task with numbers in its queries, the (lowest, highest) number at each place that the task's generator in
# experiments/build_tasks.py draws the demonstrations, train and test queries from: ``_sums`` (a + b, a and b 1-9),
# ``_successors`` (n from 10 to 98), ``range(1, 100)`` for number_words. tests/test_thought_report_rule.py checks
# them against the builder and the shipped files.
NUMBER_RANGES = {"add": ((1, 9), (1, 9)), "plus_one": ((10, 98),), "number_words": ((1, 99),)}


def range_parts(task: str, split: str = "fresh") -> list[str] | None:
    """``"in range"`` or ``"out of range"`` per query of a shipped task's ``split`` (module docstring); None for a
    task that is not shipped."""
    queries = split_queries(task, split)
    if queries is None:
        return None
    ranges = NUMBER_RANGES.get(task)
    if ranges is None:
        return [PARTS[0]] * len(queries)
    out = []
    for q in queries:
        numbers = [int(x) for x in NUMBER.findall(q)]
        inside = len(numbers) == len(ranges) and all(lo <= x <= hi for x, (lo, hi) in zip(numbers, ranges))
        out.append(PARTS[0] if inside else PARTS[1])
    return out


def part_row(r: dict, keep) -> dict:
    """Row ``r`` restricted to the queries where ``keep`` (one bool per query) holds: counts, accuracies, outcomes,
    answers and sampling units of those queries; conditions without per-query outcomes are dropped."""
    keep = list(keep)
    o = r["outcomes"]
    if any(len(v) != len(keep) for v in o.values()):
        raise ValueError(f"{len(keep)} query flags for a row of {r['n_test']} queries")
    idx = [i for i, k in enumerate(keep) if k]
    n = len(idx)
    units = r.get("units", query_units(r.get("task"), r.get("split"), len(keep)))
    outcomes = {c: [v[i] for i in idx] for c, v in o.items()}
    correct = {c: int(sum(v)) for c, v in outcomes.items()}
    out = {**r, "n_test": n, "outcomes": outcomes, "correct": correct,
           "accuracy": {c: k / n if n else 0.0 for c, k in correct.items()}}
    if units is not None:
        out["units"] = [units[i] for i in idx]
    if "answers" in r:
        out["answers"] = {c: [v[i] for i in idx] for c, v in r["answers"].items()}
    return out


def fresh_parts(r: dict) -> dict[str, dict]:
    """A fresh row split by :func:`range_parts`: ``{"in range": row, "out of range": row}`` for the parts that hold
    queries; a row whose task is not shipped (or that keeps no per-query outcomes) is in range throughout."""
    parts = range_parts(r.get("task"), "fresh") if r.get("task") else None
    if parts is None or "outcomes" not in r or len(parts) != r["n_test"]:
        return {PARTS[0]: r}
    return {p: part_row(r, [x == p for x in parts]) for p in PARTS if p in parts}


def in_range(r: dict) -> dict | None:
    """The part of a row the verdict reads: a fresh row's in-range queries (None: it has none), any other row
    whole."""
    return fresh_parts(r).get(PARTS[0]) if r.get("split") == "fresh" else r


def near_tie(best: dict, other: dict) -> bool:
    """Whether two settings' scores (lower is better), ``{unit: value}`` over the (model, task) units of a selection
    stage, are a near tie: the paired bootstrap 95% interval of the mean difference over their shared units includes
    0. Fewer than two shared units: never a tie (nothing to resample)."""
    shared = sorted(set(best) & set(other))
    if len(shared) < 2:
        return False
    d = bootstrap_mean([other[u] - best[u] for u in shared])
    return d.low <= 0.0 <= d.high
