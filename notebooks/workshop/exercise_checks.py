"""Check cells of the workshop exercises: tell a learner whether an answer is right, and what is wrong if not.

Exercises are predict-then-check (ARENA style): the learner writes a prediction or a
computed answer into a variable, and a check cell compares it with what the library
measures (``verify_*`` identities, trajectories, evaluations) in that cell. A right answer
prints a line starting with ``✓``; a wrong or missing one raises :class:`ExerciseCheckFailed`
(an ``AssertionError``) whose message says what was expected and why, so a notebook run
top to bottom with the solutions stops where a claim no longer holds.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any


class ExerciseCheckFailed(AssertionError):
    """A learner's answer differs from what icl_lens measures; the message says how."""


def _missing(answer: Any) -> bool:
    return answer is None or answer is Ellipsis


def check_answer(answer: Any, expected: Any, what: str, *, rel_tol: float = 0.0, abs_tol: float = 0.0,
                 why: str = "") -> None:
    """``answer`` equals ``expected`` (numbers within ``rel_tol``/``abs_tol``; strings ignoring case and spaces).

    ``what`` names the quantity (``"layer with the largest mean patch norm"``); ``why`` is
    added to the message either way, so a learner who guessed right also reads the reason.
    """
    tail = f" {why}" if why else ""
    if _missing(answer):
        raise ExerciseCheckFailed(f"✗ {what}: no answer yet. Set the variable in the cell above, then rerun this cell.")
    if isinstance(expected, bool) or not isinstance(expected, Real):
        ok = _norm(answer) == _norm(expected)
    else:
        if isinstance(answer, bool) or not isinstance(answer, Real):
            raise ExerciseCheckFailed(f"✗ {what}: expected a number, got {answer!r}.")
        ok = math.isclose(float(answer), float(expected), rel_tol=rel_tol, abs_tol=abs_tol)
    if not ok:
        raise ExerciseCheckFailed(f"✗ {what}: you answered {answer!r}, icl_lens measures {expected!r}.{tail}")
    print(f"✓ {what}: {answer!r} is right.{tail}")


def check_below(value: float, bound: float, what: str, *, why: str = "") -> None:
    """``value ≤ bound`` (an identity's error under its tolerance); a non-finite value fails."""
    if not isinstance(value, Real) or not math.isfinite(float(value)) or float(value) > bound:
        raise ExerciseCheckFailed(f"✗ {what} is {value!r}, above {bound:g}.{(' ' + why) if why else ''}")
    print(f"✓ {what} = {float(value):.2e} ≤ {bound:g}.{(' ' + why) if why else ''}")


def check_choice(answer: Any, expected: str, choices: tuple[str, ...], what: str, *, why: str = "") -> None:
    """A prediction among ``choices`` (e.g. ``("shrink", "grow")``); an answer outside them is called out."""
    if expected not in choices:
        raise ValueError(f"expected {expected!r} is not one of {choices}")
    if not _missing(answer) and _norm(answer) not in {_norm(c) for c in choices}:
        raise ExerciseCheckFailed(f"✗ {what}: answer one of {choices}, got {answer!r}.")
    check_answer(answer, expected, what, why=why)


def _norm(x: Any) -> Any:
    return " ".join(x.lower().split()) if isinstance(x, str) else x
