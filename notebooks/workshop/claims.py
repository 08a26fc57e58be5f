"""Paper claims beside what icl_lens measures: the workshop notebooks' "Paper says / we measure" tables.

Each notebook ends its story with a small table: one row per claim of a paper it touches
(Dherin et al. 2025, arXiv 2507.16003; Mazzawi, Dherin et al. 2025, arXiv 2510.08734;
McDermott, Heath, Parhi 2026, arXiv 2606.25342), the number icl_lens measures, the
baseline or control it must beat, whether the claim is reproduced, and why not where it
is not. The numbers are computed in the notebook or read from the evaluation reports
(``reports/eval_*.json``, written by ``python -m experiments.<name>``) by the readers
below (from ``reports/`` of this checkout). A report or key that is missing (a copy of the
notebooks without the reports; an evaluation not run yet) reads as :data:`NOT_MEASURED`, never as a number.

Verdicts (:func:`verdict_above`): a measured interval whose lower end lies above the
control's upper end (and above ``floor``) reproduces an effect; an interval that overlaps
the control does not.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from icl_lens.stats import wilson_interval

NOT_MEASURED = "not measured in this checkout"
REPORTS = Path(__file__).resolve().parents[2] / "reports"
VERDICTS = ("yes", "no", "partly", "not measured")


@dataclass(frozen=True)
class Claim:
    """One row of a "Paper says / we measure" table."""

    claim: str
    paper: str
    measured: str
    baseline: str
    reproduced: str
    why: str = ""

    def __post_init__(self):
        if self.reproduced not in VERDICTS:
            raise ValueError(f"reproduced must be one of {VERDICTS}, got {self.reproduced!r}")


def claim(claim: str, paper: str, measured: Any, baseline: Any, reproduced: bool | str | None, why: str = "") -> Claim:
    """A table row. ``measured`` None (a missing report or key) makes the row read "not measured".

    ``reproduced``: True → "yes", False → "no", or one of :data:`VERDICTS`.
    """
    if measured is None:
        return Claim(claim, paper, NOT_MEASURED, _text(baseline), "not measured", why)
    if reproduced is not None and not isinstance(reproduced, str):
        reproduced = bool(reproduced)  # numpy and torch booleans too
    verdict = "yes" if reproduced is True else "no" if reproduced is False else reproduced
    if verdict is None:
        raise ValueError("reproduced is None for a measured claim: say yes, no or partly")
    return Claim(claim, paper, _text(measured), _text(baseline), verdict, why)


def claims_table(claims: Iterable[Claim]) -> pd.DataFrame:
    """The "Paper says / we measure" table, one row per claim."""
    rows = [asdict(c) for c in claims]
    if not rows:
        raise ValueError("a claims table needs at least one claim")
    return pd.DataFrame(rows)


def claims_view(claims: Iterable[Claim]):
    """The table for a notebook: whole sentences (no ``…`` truncation), left-aligned, wrapped, no index column."""
    return (claims_table(claims).style.hide(axis="index")
            .set_properties(**{"text-align": "left", "white-space": "normal", "vertical-align": "top"})
            .set_table_styles([{"selector": "th", "props": [("text-align", "left")]}]))


def _text(x: Any) -> str:
    if x is None:
        return NOT_MEASURED
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


# --- intervals written for a table --------------------------------------------------------------------

def rate(correct: int, n: int, level: float = 0.95) -> str:
    """``"0.75 [0.55, 0.88] (18/24)"``: an accuracy with its Wilson interval (:mod:`icl_lens.stats._intervals`)."""
    low, high = wilson_interval(correct, n, level)
    return f"{correct / n:.2f} [{low:.2f}, {high:.2f}] ({correct}/{n})"


def accuracy_ci(correct: int, n: int, level: float = 0.95) -> tuple[float, float, float]:
    """``(accuracy, low, high)``: an accuracy with its Wilson interval, as the exercise checks compare them."""
    return (correct / n, *wilson_interval(correct, n, level))


def mean_ci(row: Mapping[str, float] | None, digits: int = 3) -> str | None:
    """``"+0.388 [+0.334, +0.440]"`` from a mapping with ``mean``, ``low``, ``high`` (None stays None)."""
    if row is None:
        return None
    return f"{row['mean']:+.{digits}f} [{row['low']:+.{digits}f}, {row['high']:+.{digits}f}]"


def verdict_above(measured: Mapping[str, float] | None, control: Mapping[str, float] | None, floor: float = 0.0
                  ) -> bool | None:
    """True when ``measured``'s interval lies above the control's interval and above ``floor``; None if missing."""
    if measured is None or control is None:
        return None
    return bool(measured["low"] > control["high"] and measured["low"] > floor)


# --- report readers ------------------------------------------------------------------------------------

def read_report(name: str, root: str | Path | None = None) -> dict | None:
    """``reports/eval_<name>.json`` as a dict, or None when this checkout has no such report."""
    return _read_json(f"eval_{name}.json", root)


def _read_json(name: str, root: str | Path | None = None) -> dict | None:
    """``reports/<name>`` as a dict, or None when this checkout has no such file (or it is not JSON)."""
    try:
        return json.loads((Path(root or REPORTS) / name).read_text())
    except (OSError, ValueError):
        return None


def answer_sheet(notebook: str, model: str, root: str | Path | None = None) -> dict | None:
    """The stored reference answers of one notebook's exercises on ``model`` (``reports/workshop_answers.json``,
    written by ``python notebooks/workshop/answer_sheet.py``), or None when the sheet lacks them."""
    return lookup(_read_json("workshop_answers.json", root), notebook, model)


def notebook_run(stem: str, root: str | Path | None = None) -> dict | None:
    """One notebook's measured run (``seconds``, ``peak_gb``, ``date``, …) from ``reports/workshop_notebooks.json``,
    written by the notebook tests with ``ICL_LENS_NOTEBOOK_RUNS=reports/workshop_notebooks.json``; None if absent."""
    return lookup(_read_json("workshop_notebooks.json", root), "runs", stem)


def lookup(data: Any, *keys: str | int) -> Any:
    """``data[k1][k2]…``, or None as soon as a key is missing."""
    for key in keys:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def alignment_row(model: str, comparison: str, order: str, kind: str, *, root: str | Path | None = None
                  ) -> dict | None:
    """One summary row (``mean``, ``low``, ``high``, ``prompts``) of ``eval_finetune_alignment.json``.

    ``model``: a lab model (``"softmax"``, ``"single_block"``, …) or a language model
    (``"gemma-3-270m"``); ``comparison``: ``sgd``, ``control``, ``query_input``, …;
    ``order``: ``prefix`` or ``absorb``; ``kind``: ``cumulative`` or ``step``.
    """
    report = read_report("finetune_alignment", root)
    rows = lookup(report, "lab", model, "alignment", "summary") or lookup(report, "lm", model, "alignment", "summary")
    for row in rows or ():
        if (row.get("comparison"), row.get("order"), row.get("kind")) == (comparison, order, kind):
            return row
    return None


def spike_auroc(model: str, detector: str, split: str = "within kind, grouped", *, root: str | Path | None = None
                ) -> dict | None:
    """``{auroc, low, high, …}`` of one detector in ``eval_spikes.json`` (None if the report lacks it)."""
    row = lookup(read_report("spikes", root), "models", model, "aurocs", detector, "aurocs", split)
    return row if isinstance(row, dict) and "auroc" in row else None


def spike_unseen_auroc(model: str, detector: str, *, root: str | Path | None = None) -> dict | None:
    """``{auroc, low, high, per_stratum}`` of one candidate on kinds it never saw (the leave-one-kind-out table of
    ``eval_spikes.json``; None if the report lacks it)."""
    row = lookup(read_report("spikes", root), "models", model, "loko_table", "rows", detector, "auroc")
    return row if isinstance(row, dict) and "auroc" in row else None


def spike_scored(model: str, *, root: str | Path | None = None) -> str | None:
    """``"1106 questions of 22 kinds"``: what the spike evaluation scored for one model (None if absent)."""
    entry = lookup(read_report("spikes", root), "models", model)
    if not isinstance(entry, dict) or not {"questions", "kinds"} <= set(entry):
        return None
    return f"{entry['questions']} questions of {entry['kinds']} kinds"


def auroc_ci(row: Mapping[str, float] | None) -> str | None:
    """``"0.769 [0.712, 0.819]"`` from an AUROC row (None stays None)."""
    return None if row is None else f"{row['auroc']:.3f} [{row['low']:.3f}, {row['high']:.3f}]"


def count_where(values: Sequence[float], predicate) -> str:
    """``"17 of 18"``: how many ``values`` satisfy ``predicate``."""
    values = list(values)
    return f"{sum(bool(predicate(v)) for v in values)} of {len(values)}"


def thought_rows(split: str = "table", models: Sequence[str] = ("gemma-3-270m", "smollm2-135m"), *,
                 root: str | Path | None = None) -> list[dict]:
    """The per-task rows of ``eval_thought.<model>.json`` scored on ``split`` (``"table"``: the test queries,
    ``"fresh"``: the fresh set scored once) and fitted with the documented default ``ThoughtFit()``, in report
    order, each with its ``model`` and ``task``; an empty list when no report has them."""
    from icl_lens.thought import ThoughtFit

    def is_default(fit) -> bool:  # through the settings class: a field added since keeps its default
        try:
            return isinstance(fit, dict) and ThoughtFit.from_dict(fit) == ThoughtFit()
        except (TypeError, ValueError):
            return False

    rows = []
    for model in models:
        for key, row in (read_report(f"thought.{model}", root) or {}).items():
            if key.startswith(f"{split}/") and isinstance(row, dict) and is_default(row.get("fit")):
                rows.append({**row, "model": model, "task": key.rsplit("/", 1)[1]})
    return rows


def thought_locality(models: Sequence[str] = ("gemma-3-270m", "smollm2-135m"), *, root: str | Path | None = None
                     ) -> dict[tuple[str, str], float] | None:
    """``{(model, task): share}``: on how many of another task's queries the thought-patched model keeps the
    unpatched model's answer (``locality_kept["patched"]``, before issue 22 ``locality_accuracy``, of each
    :func:`thought_rows` row on the test queries). None when no report has it."""
    shares = {}
    for row in thought_rows("table", models, root=root):
        share = lookup(row, "locality_kept", "patched")
        share = lookup(row, "locality_accuracy", "patched") if share is None else share
        if isinstance(share, (int, float)):
            shares[(row["model"], row["task"])] = float(share)
    return shares or None


def spike_shipped(model: str, *, root: str | Path | None = None) -> dict | None:
    """The shipped detector's entry of ``eval_spikes.json``: ``detector`` (name, AUROC on unseen kinds, the −log p
    baseline's, what patches add, its line), ``held_out`` (its flag's rates on the held-out subjects, every kind
    seen) and ``unseen_kinds`` (the same on kinds left out, pooled and within stratum), with intervals."""
    entry = lookup(read_report("spikes", root), "models", model, "shipped")
    return entry if isinstance(entry, dict) and {"detector", "held_out"} <= set(entry) else None


def percent_ci(row: Mapping[str, Any], key: str) -> str:
    """``"1.6% [0.0%, 4.2%]"`` from ``row[key]`` and ``row[key + "_interval"]``."""
    low, high = row[f"{key}_interval"]
    return f"{row[key]:.1%} [{low:.1%}, {high:.1%}]"


def spike_without_copied_answers(model: str, *, root: str | Path | None = None) -> dict | None:
    """What patch features add to −log p and entropy on unseen kinds, on answers that do not repeat a question word:
    the paired AUROC difference (``{difference, low, high}``; None if absent)."""
    row = lookup(read_report("spikes", root), "models", model, "without_copied_answers", "patch_vs_baseline")
    return row if isinstance(row, dict) and "difference" in row else None


def summary_verdicts(*, root: str | Path | None = None) -> list[dict] | None:
    """The rows of ``eval_summary.json`` (claim, paper, verdict, number, section), or None."""
    rows = lookup(read_report("summary", root), "rows")
    return rows if isinstance(rows, list) else None


SUMMARY_VERDICTS = {"reproduced": "yes", "partly": "partly", "not": "no", "not tested here": "not measured"}


def summary_claims(*topics: str, root: str | Path | None = None) -> list[Claim]:
    """EVAL.md's summary rows of the given topics (``"lab"``, ``"alignment"``, ``"thought"``, ``"spikes"``) as
    claims-table rows, verdicts as the evaluation commands computed them (``eval_summary.json``); one
    "not measured" row when the summary is missing."""
    rows = summary_verdicts(root=root)
    if rows is None:
        return [claim("EVAL.md's summary", "–", None, "run python -m experiments.assemble_reports", None)]
    return [Claim(r["claim"], r["paper"], _text(r["number"]), "see EVAL.md, section linked in its summary",
                  SUMMARY_VERDICTS[r["verdict"]]) for r in rows if r.get("topic") in topics]
