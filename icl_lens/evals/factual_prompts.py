"""The labelled factual-question set and its answer key (``icl_lens/data/factual_prompts.jsonl``).

Each line: ``{"prompt": question, "answers": [aliases...], "kind": ...}``. Kinds:
capital, chemical_symbol, author, year, general, and ``invented`` (questions about
entities that do not exist; their answer list is empty, so every completion is
incorrect). Questions are asked after a fixed few-shot preamble (:data:`FEW_SHOT`,
whose four examples are not in the set) so a base model answers in one short line.

Labelling: the completion is the generated text up to the first newline, stripped of
whitespace and leading quotes; it is correct when, case-insensitively, it starts with
one of the aliases at a word boundary (the next character, if any, is not a letter or
digit, so "He" does not match the alias "H").
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DATA_FILE = Path(__file__).resolve().parent.parent / "data" / "factual_prompts.jsonl"

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
            rows.append(FactualPrompt(row["prompt"], tuple(answers), row["kind"]))
    return rows


def completion_answer(generated_text: str) -> str:
    """The answer line of a completion: text before the first newline, stripped of spaces and quotes."""
    return generated_text.split("\n", 1)[0].strip().strip("\"'“”‘’").strip()


def is_correct(generated_text: str, answers: tuple[str, ...] | list[str]) -> bool:
    """Case-insensitive starts-with match at a word boundary against any alias (module docstring)."""
    answer = completion_answer(generated_text).casefold()
    for alias in answers:
        a = alias.strip().casefold()
        if a and answer.startswith(a) and (len(answer) == len(a) or not answer[len(a)].isalnum()):
            return True
    return False
