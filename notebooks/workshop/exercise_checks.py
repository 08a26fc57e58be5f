"""Check cells of the workshop exercises: tell a learner whether an answer is right, and what is wrong if not.

Exercises are predict-then-check (ARENA style): the learner writes a prediction or a
computed answer into a variable, and a check cell compares it with what the library
measures (``verify_*`` identities, trajectories, evaluations) in that cell.

Every check prints one line and returns its status (:data:`RIGHT`, :data:`WRONG`,
:data:`NO_ANSWER`):

- an answer still ``None`` (or ``...``) prints ``… no answer yet`` and never raises, so a
  notebook run top to bottom without edits reaches its end with every check saying so;
- a right answer prints a line starting with ``✓``;
- a wrong answer prints a line starting with ``✗`` that says what icl_lens measures and why.

Where a number is expected, a number in any form a notebook hands over is read as one: a Python
``int``/``float``, a one-element tensor or array, a numpy scalar, or a numeric string (``"0.5"``);
a prediction among numeric choices (``"0"`` or ``"1"``) also accepts the number ``0``.

Predictions about a *difference* are graded on signal (:func:`check_compare`): two measured
intervals that overlap make ``"not distinguishable"`` the right answer, never a direction
read off two point estimates.

The hidden solution cells run only when :func:`solutions_on` (environment variable
``ICL_LENS_SOLUTIONS=1``, set by ``tests/test_notebooks.py``). Then the checks are strict: a
wrong or missing answer raises :class:`ExerciseCheckFailed`, so a notebook run with its
solutions stops where a claim no longer holds.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any

SOLUTIONS_ENV = "ICL_LENS_SOLUTIONS"
RIGHT, WRONG, NO_ANSWER = "right", "wrong", "no answer yet"
NOT_DISTINGUISHABLE = "not distinguishable"


class ExerciseCheckFailed(AssertionError):
    """A learner's answer differs from what icl_lens measures (raised only when solutions are on)."""


def solutions_on() -> bool:
    """Whether the hidden solution cells fill in the answers (``ICL_LENS_SOLUTIONS=1``; the notebook tests)."""
    return os.environ.get(SOLUTIONS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def missing(*answers: Any) -> bool:
    """Whether any of ``answers`` is still unanswered (``None`` or ``...``)."""
    return any(a is None or a is Ellipsis for a in answers)


def no_answer(what: str) -> str:
    """Say that ``what`` has no answer yet (strict when solutions are on) and return :data:`NO_ANSWER`."""
    message = f"… {what}: no answer yet. Set the variable in the exercise cell, run it, then rerun this cell."
    if solutions_on():
        raise ExerciseCheckFailed(message)
    print(message)
    return NO_ANSWER


def _verdict(ok: bool, right: str, wrong: str) -> str:
    if ok:
        print(right)
        return RIGHT
    if solutions_on():
        raise ExerciseCheckFailed(wrong)
    print(wrong)
    return WRONG


def check_answer(answer: Any, expected: Any, what: str, *, rel_tol: float = 0.0, abs_tol: float = 0.0,
                 why: str = "") -> str:
    """``answer`` equals ``expected`` (numbers within ``rel_tol``/``abs_tol``; strings ignoring case and spaces).

    ``what`` names the quantity (``"layer with the largest mean patch norm"``); ``why`` is
    added to the message either way, so a learner who guessed right also reads the reason.
    """
    tail = f" {why}" if why else ""
    if missing(answer):
        return no_answer(what)
    if isinstance(expected, bool) or not isinstance(expected, Real):
        ok = _norm(answer) == _norm(expected)
    else:
        number = as_number(answer)
        if number is None:
            return _verdict(False, "", f"✗ {what}: expected a number, got {answer!r}.")
        answer = answer if isinstance(answer, Real) else number  # a tensor or a string is shown as its number
        ok = math.isclose(number, float(expected), rel_tol=rel_tol, abs_tol=abs_tol)
    return _verdict(ok, f"✓ {what}: {answer!r} is right.{tail}",
                    f"✗ {what}: you answered {answer!r}, icl_lens measures {expected!r}.{tail}")


def as_number(x: Any) -> float | None:
    """``x`` as a float when it holds one number, else ``None``.

    Accepted: an ``int``/``float`` (not a ``bool``), anything with one element and ``.item()``
    (a one-element torch tensor or numpy array, a numpy scalar), and a numeric string
    (``" 0.5 "``, ``"1e-3"``). A ``bool``, a longer tensor, a list or a word is not a number.
    """
    if isinstance(x, str):
        try:
            return float(x.strip())
        except ValueError:
            return None
    if hasattr(x, "item") and not isinstance(x, Real):
        size = getattr(x, "numel", None)
        size = size() if callable(size) else getattr(x, "size", 1)
        if size != 1:
            return None
        try:
            x = x.item()
        except (TypeError, ValueError, RuntimeError):
            return None
    if isinstance(x, bool) or not isinstance(x, Real):
        return None
    return float(x)


def check_below(value: Any, bound: float, what: str, *, why: str = "") -> str:
    """``value ≤ bound`` (an identity's error under its tolerance); a non-finite value fails, ``None`` has no answer."""
    tail = f" {why}" if why else ""
    if missing(value):
        return no_answer(what)
    number = as_number(value)
    ok = number is not None and math.isfinite(number) and number <= bound
    shown = f"{number:.2e}" if number is not None else repr(value)
    return _verdict(ok, f"✓ {what} = {shown} ≤ {bound:g}.{tail}", f"✗ {what} is {shown}, above {bound:g}.{tail}")


def check_choice(answer: Any, expected: str, choices: tuple[str, ...], what: str, *, why: str = "") -> str:
    """A prediction among ``choices`` (e.g. ``("shrink", "grow")``); an answer outside them is called out."""
    if expected not in choices:
        raise ValueError(f"expected {expected!r} is not one of {choices}")
    if missing(answer):
        return no_answer(what)
    if not isinstance(answer, str) and as_number(answer) is not None:  # `prediction = 0` for the choice "0"
        answer = next((c for c in choices if as_number(c) == as_number(answer)), answer)
    if _norm(answer) not in {_norm(c) for c in choices}:
        return _verdict(False, "", f"✗ {what}: answer one of {choices}, got {answer!r}.")
    return check_answer(answer, expected, what, why=why)


def _interval(x: Any) -> tuple[float, float, float]:
    """``(estimate, low, high)`` from a mapping (``mean``/``auroc``/``rate`` + ``low``/``high``), an object with
    ``mean``/``low``/``high`` (``icl_lens.stats._bootstrap.MeanCI``) or a ``(estimate, low, high)`` triple."""
    if isinstance(x, Mapping):
        estimate = next(x[k] for k in ("mean", "estimate", "auroc", "rate") if k in x)
        return float(estimate), float(x["low"]), float(x["high"])
    if all(hasattr(x, k) for k in ("mean", "low", "high")):
        return float(x.mean), float(x.low), float(x.high)
    estimate, low, high = x
    return float(estimate), float(low), float(high)


def compare_intervals(a: Any, b: Any, labels: tuple[str, str] = ("higher", "lower")) -> str:
    """``labels[0]`` if ``a``'s interval lies above ``b``'s, ``labels[1]`` if below, else ``"not distinguishable"``."""
    _, a_low, a_high = _interval(a)
    _, b_low, b_high = _interval(b)
    if a_low > b_high:
        return labels[0]
    if a_high < b_low:
        return labels[1]
    return NOT_DISTINGUISHABLE


def check_compare(answer: Any, a: Any, b: Any, what: str, *, labels: tuple[str, str] = ("higher", "lower"),
                  names: tuple[str, str] = ("A", "B"), why: str = "") -> str:
    """A prediction about ``a`` against ``b``, graded on signal: one of ``labels`` or ``"not distinguishable"``.

    ``a`` and ``b`` are measured intervals (see :func:`compare_intervals`). Where they
    overlap, ``"not distinguishable"`` is the right answer and a direction is wrong, however
    the point estimates fall: the measurement cannot tell the two apart.
    """
    expected = compare_intervals(a, b, labels)
    shown = "; ".join(f"{n} {e:.3g} [{lo:.3g}, {hi:.3g}]" for n, (e, lo, hi) in zip(names, (_interval(a), _interval(b))))
    reason = f"{shown}." + (" The intervals overlap." if expected == NOT_DISTINGUISHABLE else "")
    return check_choice(answer, expected, (*labels, NOT_DISTINGUISHABLE), what,
                        why=f"{reason} {why}".strip())


def as_record(x: Any) -> Any:
    """``x`` as JSON data: a dataclass (a ``MeanCI``) as its fields, a tensor or numpy scalar as its number,
    mappings and sequences item by item; what the answer sheet stores and :func:`check_sheet` compares."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return as_record(dataclasses.asdict(x))
    if isinstance(x, Mapping):
        return {str(k): as_record(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [as_record(v) for v in x]
    if isinstance(x, (str, bool, int)) or x is None:
        return x
    if isinstance(x, Integral):  # a numpy integer (a count summed over numpy booleans)
        return int(x)
    number = as_number(x)
    return x if number is None else number


def _differences(measured: Any, stored: Any, rel_tol: float, abs_tol: float, where: str = "") -> list[str]:
    if isinstance(measured, Mapping) and isinstance(stored, Mapping):
        return [d for k in measured for d in _differences(measured[k], stored.get(k), rel_tol, abs_tol, f"{where}.{k}")]
    if isinstance(measured, list) and isinstance(stored, list) and len(measured) == len(stored):
        return [d for i, (m, s) in enumerate(zip(measured, stored))
                for d in _differences(m, s, rel_tol, abs_tol, f"{where}[{i}]")]
    both_numbers = all(isinstance(v, Real) and not isinstance(v, bool) for v in (measured, stored))
    if both_numbers and not (isinstance(measured, int) and isinstance(stored, int)):
        same = math.isclose(measured, stored, rel_tol=rel_tol, abs_tol=abs_tol)
    else:
        same = measured == stored
    return [] if same else [f"{where.lstrip('.')}: sheet {stored!r}, measured {measured!r}"]


def check_sheet(measured: Mapping[str, Any], sheet: Mapping[str, Any] | None, what: str, *, rel_tol: float = 1e-3,
                abs_tol: float = 1e-5) -> str | None:
    """The answer sheet (``reports/workshop_answers.json``, from which docs/workshop.md's expected answers are
    rendered) holds what this check cell measured: each entry of ``measured`` (numbers within ``rel_tol``, or
    ``abs_tol`` for errors at float32 noise level; counts and words exactly).

    Silent where they agree and where there is no sheet (another model); a ``✗`` where they differ (raised when
    solutions are on, so the notebook tests fail when the sheet drifts from the notebook)."""
    if sheet is None:
        return None
    bad = _differences(as_record(measured), sheet, rel_tol, abs_tol)
    if not bad:
        print(f"(the guide's expected answer for {what} is this run's: reports/workshop_answers.json)")
        return RIGHT
    return _verdict(False, "", f"✗ {what}: this run differs from the answer sheet (reports/workshop_answers.json; "
                               f"rerun python notebooks/workshop/answer_sheet.py): {'; '.join(bad)}")


def _norm(x: Any) -> Any:
    return " ".join(x.lower().split()) if isinstance(x, str) else x
