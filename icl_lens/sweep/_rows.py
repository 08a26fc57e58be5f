"""Reading a sweep's prompts file: one JSON object per line, ``{"id": ..., "prompt": ...}``.

Every line is judged on its own. A line that is not valid UTF-8, not a JSON object, has
no ``id`` or no ``prompt``, has an empty or non-text prompt, holds text that cannot be
written as UTF-8 (a lone surrogate such as ``"\\ud800"``), has an id longer than
``MAX_ID_CHARS`` characters, or repeats an earlier id is a *bad row*: it is reported with
its line number and reason, and the sweep goes on with the others. Prompts too long for
the model are found later (:mod:`icl_lens.sweep._encode`) and reported the same way.

Ids are always text: an integer id ``7`` is stored as ``"7"`` (so ``7`` and ``"7"`` are
the same id), whatever the other lines hold and however large the integer. Each good row
carries ``sha``, the first 16 hex digits of the SHA-256 of its prompt's UTF-8 text, which
a resumed sweep compares with the prompt it already did under that id.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_ID_CHARS = 256


@dataclass(frozen=True)
class SweepRow:
    line: int
    id: str
    prompt: str
    sha: str


@dataclass(frozen=True)
class BadRow:
    line: int
    id: str | None
    reason: str

    def to_dict(self) -> dict:
        return {"line": self.line, "id": self.id, "reason": self.reason}


def prompt_sha(data: bytes) -> str:
    """First 16 hex digits of the SHA-256 of a prompt's UTF-8 bytes."""
    return hashlib.sha256(data).hexdigest()[:16]


def _lone_surrogate(text: str) -> str:
    err = None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        err = e
    return f"U+{ord(text[err.start]):04X} at character {err.start}" if err else ""


def _row_id(rid) -> tuple[str | None, str]:
    """The id as text, or ``None`` and the reason it cannot be one."""
    if isinstance(rid, bool) or not isinstance(rid, (int, str)):
        kind = "missing" if rid is None else f"a {type(rid).__name__}"
        return None, f"id is {kind} (each row needs an integer or text id)"
    text = str(rid) if isinstance(rid, int) else rid
    if not text.strip():
        return None, "id is empty text (each row needs an integer or text id)"
    if len(text) > MAX_ID_CHARS:
        return None, f"id has {len(text)} characters; ids have at most {MAX_ID_CHARS}"
    bad = _lone_surrogate(text)
    if bad:
        return None, f"id is not valid Unicode (lone surrogate {bad})"
    return text, ""


def _parse_line(line_no: int, raw: bytes) -> SweepRow | BadRow:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return BadRow(line_no, None, f"not valid UTF-8 (byte 0x{raw[err.start]:02x} at byte {err.start} of the line)")
    if line_no == 1:
        text = text.removeprefix("\ufeff")  # a byte-order mark
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as err:  # ValueError: JSON errors and over-long integers
        return BadRow(line_no, None, f"not valid JSON ({getattr(err, 'msg', None) or str(err).split(';')[0][:120]})")
    if not isinstance(obj, dict):
        return BadRow(line_no, None, "not a JSON object")
    rid, why = _row_id(obj.get("id"))
    if rid is None:
        return BadRow(line_no, None, why)
    prompt = obj.get("prompt")
    if prompt is None:
        return BadRow(line_no, rid, "missing prompt")
    if not isinstance(prompt, str):
        return BadRow(line_no, rid, f"prompt is not text ({type(prompt).__name__})")
    if not prompt.strip():
        return BadRow(line_no, rid, "empty prompt")
    try:
        data = prompt.encode("utf-8")
    except UnicodeEncodeError:
        return BadRow(line_no, rid, f"prompt is not valid Unicode (lone surrogate {_lone_surrogate(prompt)})")
    return SweepRow(line_no, rid, prompt, prompt_sha(data))


def check_prompts_file(path: str | Path, *, processes: int = 1) -> None:
    """One clear error for a prompts path that cannot be read as JSONL: missing, a folder, unreadable, or a
    pipe (``/dev/stdin``, ``<(...)``) that several processes would each have to read whole."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"prompts file {path} does not exist") from None
    except OSError as err:
        raise OSError(f"prompts file {path} cannot be read ({err.strerror or err})") from None
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"prompts file {path} is a folder; give the JSONL file inside it")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        raise ValueError(f"prompts file {path} is not a file or a pipe")
    if not stat.S_ISREG(mode) and processes > 1:
        raise ValueError(f"prompts file {path} is a pipe, which only one process can read; save it to a file for "
                         f"{processes} processes")
    if not os.access(path, os.R_OK):
        raise PermissionError(f"prompts file {path} cannot be read (permission denied)")


def read_rows(path: str | Path) -> tuple[list[SweepRow], list[BadRow]]:
    """Good rows (in file order) and bad rows with reasons, from a file or a pipe (``/dev/stdin``, read once).
    Raises only if the path cannot be read (:func:`check_prompts_file`)."""
    path = Path(path)
    check_prompts_file(path)
    rows: list[SweepRow] = []
    bad: list[BadRow] = []
    first_line: dict[str, int] = {}
    with path.open("rb") as f:  # bytes: one undecodable line is one bad row, not a refused file
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            row = _parse_line(line_no, raw)
            if isinstance(row, SweepRow) and row.id in first_line:
                row = BadRow(line_no, row.id, f"duplicate id (first on line {first_line[row.id]})")
            if isinstance(row, BadRow):
                bad.append(row)
            else:
                first_line[row.id] = line_no
                rows.append(row)
    return rows, bad
