"""Tasks for thought-patch evaluations (arXiv 2510.08734), one JSON object per ``.jsonl`` file.

Format: ``{"name": str, "kind": str (optional), "instruction": str, "train": [{"query",
"answer"}, ...], "test": [...], "fresh": [...] (optional)}`` (other fields, such as the
``generated_by`` command of the shipped files, are ignored). ``train`` queries calibrate the
thought patch; ``test`` queries are held out. ``fresh``: held out from every selection and
tuning stage; scored once by the frozen default (absent: ``Task.fresh == ()``). An answer
is correct when the greedy continuation of the query starts with it and the answer ends at
a word boundary (``answer_correct`` in ``icl_lens/thought/_evaluate.py``). Shipped (``SHIPPED_TASKS``, written by
``python -m experiments.build_tasks``, which documents them): arithmetic,
word transformations, translations, factual lookups and formats. ``locality.json`` holds
the fixed inputs of the locality measure (:mod:`icl_lens.thought.locality`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TASK_DIR = Path(__file__).parent
SHIPPED_TASKS = ("add", "plus_one", "antonyms", "plural", "past_tense", "en_fr", "en_es", "en_de", "capitals",
                 "languages", "uppercase", "number_words")


class TaskFormatError(ValueError):
    """A task file is malformed; the message names the file, line and field."""


@dataclass(frozen=True)
class Task:
    name: str
    instruction: str
    train: tuple[tuple[str, str], ...]
    test: tuple[tuple[str, str], ...]
    kind: str = ""
    fresh: tuple[tuple[str, str], ...] = ()


def _require(obj, key: str, kind, where: str):
    if not isinstance(obj, dict):
        raise TaskFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise TaskFormatError(f"{where}: missing field {key!r}")
    if not isinstance(obj[key], kind):
        raise TaskFormatError(f"{where}: field {key!r} must be {kind.__name__}, got {type(obj[key]).__name__}")
    return obj[key]


def _examples(task: dict, split: str, where: str) -> tuple[tuple[str, str], ...]:
    items = _require(task, split, list, where)
    out = []
    for i, item in enumerate(items):
        at = f"{where}, {split}[{i}]"
        q, a = _require(item, "query", str, at), _require(item, "answer", str, at)
        if not q.strip():
            raise TaskFormatError(f"{at}: field 'query' is empty")
        if not a.strip():
            raise TaskFormatError(f"{at}: field 'answer' is empty")
        out.append((q, a))
    if not out:
        raise TaskFormatError(f"{where}: field {split!r} has no examples")
    return tuple(out)


def load_task(path: str | Path) -> Task:
    """Read and validate one task file (the first non-blank line holds the task)."""
    path = Path(path)
    if not path.exists() and (TASK_DIR / f"{path}.jsonl").exists():
        path = TASK_DIR / f"{path}.jsonl"  # a shipped task by name
    if not path.exists():
        raise FileNotFoundError(f"task file {str(path)!r} not found; shipped tasks: {', '.join(SHIPPED_TASKS)}")
    lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    if not lines:
        raise TaskFormatError(f"{path}: the file is empty")
    if len(lines) > 1:
        raise TaskFormatError(f"{path}: one task per file expected, found {len(lines)} non-blank lines")
    n, line = lines[0]
    where = f"{path}, line {n}"
    try:
        task = json.loads(line)
    except json.JSONDecodeError as err:
        raise TaskFormatError(f"{where}: not valid JSON ({err.msg})") from None
    name = _require(task, "name", str, where)
    instruction = _require(task, "instruction", str, where)
    if not instruction.strip():
        raise TaskFormatError(f"{where}: field 'instruction' is empty")
    kind = task.get("kind", "")
    if not isinstance(kind, str):
        raise TaskFormatError(f"{where}: field 'kind' must be str, got {type(kind).__name__}")
    fresh = _examples(task, "fresh", where) if "fresh" in task else ()
    return Task(name, instruction, _examples(task, "train", where), _examples(task, "test", where), kind, fresh)


def shipped_task_paths() -> list[Path]:
    return [TASK_DIR / f"{name}.jsonl" for name in SHIPPED_TASKS]


__all__ = ["SHIPPED_TASKS", "TASK_DIR", "Task", "TaskFormatError", "load_task", "shipped_task_paths"]
