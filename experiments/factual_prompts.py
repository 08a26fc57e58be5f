"""The labelled factual-question set and its answer key (``experiments/data/factual_prompts.jsonl``).

Each line: ``{"prompt": question, "answers": [aliases...], "kind": ..., "subject": ...}``,
written by ``python -m experiments.build_questions`` (which lists the kinds) from the
facts in that script. ``invented`` questions ask about entities that do not exist; their
answer list is empty, and the only correct answer is one that declines
(:func:`declines`: "no such country", "I don't know", "does not exist", …). ``subject`` names the entity asked
about (several questions can share one). Questions are asked after a fixed few-shot
preamble (:data:`FEW_SHOT`, whose four examples are not in the set) so a base model
answers in one short line.

Labelling: the completion is the generated text up to the first newline, stripped of
whitespace and leading quotes. Completion and aliases are compared case-insensitively,
with accents removed (NFKD, combining marks dropped) and one leading article ("the ",
"a ", "an ") dropped from each; the completion is correct when it starts with an alias at
a word boundary (the next character, if any, is not a letter or digit, so "He" does not
match the alias "H").
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from icl_lens.spikes import answer_line, matches_alias, normalise_answer, same_answer

__all__ = ["DATA_FILE", "FEW_SHOT", "FactualPrompt", "load_factual_prompts", "completion_answer", "normalise",
           "is_correct", "same_answer", "declines", "is_correct_answer", "stratum", "question_templates"]

DATA_FILE = Path(__file__).resolve().parent / "data" / "factual_prompts.jsonl"

FEW_SHOT = (
    "Answer each question with a short answer.\n"
    "Q: What is the capital of Italy?\nA: Rome\n"
    "Q: Who wrote \"Hamlet\"?\nA: William Shakespeare\n"
    "Q: What is the chemical symbol for iron?\nA: Fe\n"
    "Q: In what year did World War II end?\nA: 1945\n"
)


@dataclass(frozen=True)
class FactualPrompt:
    prompt: str
    answers: tuple[str, ...]
    kind: str
    subject: str = ""

    @property
    def text(self) -> str:
        """The full model input: few-shot preamble, the question, and ``A:``."""
        return f"{FEW_SHOT}Q: {self.prompt}\nA:"


def load_factual_prompts(path: Path | str = DATA_FILE) -> list[FactualPrompt]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            answers = row.get("answers", row.get("answer", []))
            answers = [answers] if isinstance(answers, str) else list(answers)
            if not row.get("prompt") or (row.get("kind") != "invented" and not answers):
                raise ValueError(f"{path}:{line_no}: every non-invented prompt needs a question and answers")
            rows.append(FactualPrompt(row["prompt"], tuple(answers), row["kind"], row.get("subject", row["prompt"])))
    return rows


# The matching rule lives in the library, which applies it to sampled answers (sampling agreement)
completion_answer = answer_line
normalise = normalise_answer
is_correct = matches_alias  # (generated_text, answers): starts-with match at a word boundary, after normalise


DECLINES = ("no such", "not a real", "does not exist", "doesn't exist", "do not exist", "don't exist",
            "does not have", "doesn't have", "there is no", "there are no", "i don't know", "i do not know",
            "i'm not sure", "i am not sure", "unknown", "not known", "fictional", "imaginary", "made up",
            "made-up", "invented", "none", "n/a", "no capital", "no currency", "no language", "not sure",
            "cannot answer", "can't answer", "no answer", "not exist")


def declines(generated_text: str) -> bool:
    """Whether the answer line declines to answer (contains one of :data:`DECLINES`, after :func:`normalise`)."""
    answer = normalise(completion_answer(generated_text)).replace("’", "'")
    return any(phrase in answer for phrase in DECLINES)


def stratum(item: FactualPrompt, templates: dict[str, str] | None = None) -> str:
    """The question's template stratum: its kind, except that an ``invented`` question joins the
    kind whose questions share its wording (``"What is the capital of {}?"``): real and invented
    "capital of X" questions are compared with each other. ``templates``: wording → kind
    (:func:`question_templates`); an invented question whose wording no real kind has stays ``invented``."""
    if item.kind != "invented" or not templates:
        return item.kind
    return templates.get(item.prompt.replace(item.subject, "{}"), "invented")


def question_templates(items: list[FactualPrompt]) -> dict[str, str]:
    """Wording with the subject replaced by ``{}`` → kind, over the real (not invented) questions.

    A question whose subject is the whole question (``general``, ``arithmetic``) has no wording
    to share: its template would be ``{}``, which says nothing about the kind, so it is left out
    (the invented whole-question questions stay in the ``invented`` stratum)."""
    out: dict[str, str] = {}
    for item in items:
        if item.kind != "invented" and item.subject and item.subject in item.prompt and item.subject != item.prompt:
            out.setdefault(item.prompt.replace(item.subject, "{}"), item.kind)
    return out


def is_correct_answer(item: FactualPrompt, generated_text: str) -> bool:
    """Correct: matches an alias (:func:`is_correct`), or, for an ``invented`` subject, declines (:func:`declines`)."""
    if item.kind == "invented":
        return declines(generated_text)
    return is_correct(generated_text, item.answers)
