"""The answer-matching rule: when a generated answer gives a stored answer (an alias), and when two answers agree.

The *answer line* of a completion is its text before the first newline, stripped of spaces and
quotes. Two strings are compared after :func:`normalise_answer` (casefolded, accents removed,
one leading article dropped); an answer matches an alias when its answer line starts with the
alias at a word boundary (so "He" does not match "H"). The evaluation's correctness rule
(``experiments.factual_prompts``) and the sampling-agreement baseline (:func:`same_answer`)
use this one rule.
"""
from __future__ import annotations

import unicodedata

ARTICLES = ("the ", "a ", "an ")


def answer_line(generated_text: str) -> str:
    """The answer line of a completion: text before the first newline, stripped of spaces and quotes."""
    return generated_text.split("\n", 1)[0].strip().strip("\"'“”‘’").strip()


def normalise_answer(text: str) -> str:
    """Casefolded, accents removed (NFKD, combining marks dropped), one leading article dropped."""
    text = unicodedata.normalize("NFKD", text.strip().casefold())
    text = "".join(c for c in text if not unicodedata.combining(c))
    for article in ARTICLES:
        if text.startswith(article):
            return text[len(article):].lstrip()
    return text


def matches_alias(generated_text: str, aliases) -> bool:
    """The answer line starts with an alias at a word boundary, after :func:`normalise_answer` (so "He" does not
    match the alias "H")."""
    answer = normalise_answer(answer_line(generated_text))
    for alias in aliases:
        a = normalise_answer(alias)
        if a and answer.startswith(a) and (len(answer) == len(a) or not answer[len(a)].isalnum()):
            return True
    return False


def same_answer(a: str, b: str) -> bool:
    """Whether two completions give the same answer by the matching rule: one answer line starts with the other
    at a word boundary (:func:`matches_alias` with the other as the only alias). Two empty answer lines agree."""
    x, y = answer_line(a), answer_line(b)
    if not normalise_answer(x) or not normalise_answer(y):
        return not normalise_answer(x) and not normalise_answer(y)
    return matches_alias(a, (y,)) or matches_alias(b, (x,))
