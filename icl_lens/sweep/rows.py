"""Reading a sweep's prompts file: one JSON object per line, ``{"id": ..., "prompt": ...}``.

A line that is not a JSON object, has no ``id`` or no ``prompt``, has an empty or
non-text prompt, or repeats an earlier id is a *bad row*: it is reported with its
reason (line number, id if any) and the sweep goes on with the others. Prompts that
are too long for the model are found later, when they are tokenised, and reported the
same way. Ids keep their type when every id is an integer; otherwise they are text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SweepRow:
    line: int
    id: int | str
    prompt: str


@dataclass(frozen=True)
class BadRow:
    line: int
    id: int | str | None
    reason: str

    def to_dict(self) -> dict:
        return {"line": self.line, "id": self.id, "reason": self.reason}


def read_rows(path: str | Path) -> tuple[list[SweepRow], list[BadRow]]:
    """Good rows (in file order) and bad rows with reasons. Raises only if the file cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {path} does not exist")
    raw: list[tuple[int, object, str]] = []
    bad: list[BadRow] = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                bad.append(BadRow(line_no, None, f"not valid JSON ({err.msg})"))
                continue
            if not isinstance(obj, dict):
                bad.append(BadRow(line_no, None, "not a JSON object"))
                continue
            rid = obj.get("id")
            if rid is None or isinstance(rid, (bool, float, list, dict)) or (isinstance(rid, str) and not rid.strip()):
                bad.append(BadRow(line_no, None, "missing id (each row needs an integer or text id)"))
                continue
            prompt = obj.get("prompt")
            if prompt is None:
                bad.append(BadRow(line_no, rid, "missing prompt"))
            elif not isinstance(prompt, str):
                bad.append(BadRow(line_no, rid, f"prompt is not text ({type(prompt).__name__})"))
            elif not prompt.strip():
                bad.append(BadRow(line_no, rid, "empty prompt"))
            else:
                raw.append((line_no, rid, prompt))
    all_int = all(isinstance(rid, int) for _, rid, _ in raw)
    rows, first_line = [], {}
    for line_no, rid, prompt in raw:
        key = rid if all_int else str(rid)
        if key in first_line:
            bad.append(BadRow(line_no, key, f"duplicate id (first on line {first_line[key]})"))
            continue
        first_line[key] = line_no
        rows.append(SweepRow(line_no, key, prompt))
    if not all_int:
        bad = [BadRow(b.line, None if b.id is None else str(b.id), b.reason) for b in bad]
    return rows, sorted(bad, key=lambda b: b.line)
