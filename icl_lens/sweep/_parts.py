"""The part files of a sweep folder: what each holds, written atomically, checked on resume.

``DIR/norms/part-STEM.parquet`` holds the norms of one batch with a fixed schema
(``id`` text, ``layer``, ``position``, ``token``, ``norm``, ``correction_norm``, and with
``--authors K`` the column ``patch_authors``: a list of ``{head, offset, share}``) and, in
its Parquet metadata under ``icl_lens.sweep``, the settings it was computed with (model,
revision, dtype, layers, factors, authors) and ``{id: sha}`` of its prompts. A part is the record
that its ids are done: with ``--factors``, ``DIR/factors/part-STEM.safetensors`` is
written first, and a shard without its norms part is an orphan (a crash between the two)
removed by the next run. Every file is written to a hidden temporary name and renamed,
so no reader ever sees half a part; temporaries left by a killed run are removed by the
next run (under the folder's lock, so no live writer owns them). A visible part that
cannot be read (damaged outside the sweep) is moved to ``DIR/quarantine/`` with its
shard, and its prompts are done again.
"""
from __future__ import annotations

import json
import os
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from icl_lens.patches._patch_set import NORM_COLUMNS

NORM_PARTS = "norms"
FACTOR_PARTS = "factors"
QUARANTINE = "quarantine"
META_KEY = b"icl_lens.sweep"
META_VERSION = 1
SETTINGS = ("model", "revision", "dtype", "layers", "factors", "authors")
COLUMNS = ("id", *NORM_COLUMNS)  # the norms table of icl_lens.patch_norms, keyed by the row's id
SCHEMA = pa.schema([("id", pa.string()), ("layer", pa.int64()), ("position", pa.int64()), ("token", pa.string()),
                    ("norm", pa.float64()), ("correction_norm", pa.float64())])
# --authors K: each row's top-K patch shares (icl_lens.patches.patch_authors), largest first
AUTHORS = "patch_authors"
AUTHORS_FIELD = pa.field(AUTHORS, pa.list_(pa.struct([("head", pa.int64()), ("offset", pa.int64()),
                                                      ("share", pa.float64())])))


class SweepSettingsError(ValueError):
    """The output folder cannot take this sweep: not a writable folder, or it holds results computed with
    other settings, or of other prompts under the same ids."""


@dataclass(frozen=True)
class Part:
    path: Path
    settings: dict
    prompts: dict[str, str]  # id -> prompt sha


def hidden_temp(path: Path) -> Path:
    """A temporary name beside ``path`` that readers skip (leading dot) and the next run removes."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def write_part(frame: pd.DataFrame, path: Path, settings: dict, prompts: dict[str, str]) -> None:
    """The norms ``frame`` as a part at ``path``: a temporary file, then an atomic rename."""
    meta = {"version": META_VERSION, "settings": settings, "prompts": prompts}
    with_authors = AUTHORS in frame.columns
    columns, schema = (list(COLUMNS) + [AUTHORS], SCHEMA.append(AUTHORS_FIELD)) if with_authors else (list(COLUMNS), SCHEMA)
    table = pa.Table.from_pandas(frame[columns], schema=schema, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: json.dumps(meta).encode()})
    tmp = hidden_temp(path)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = hidden_temp(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _read_meta(path: Path) -> dict:
    raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
    if raw is None:
        raise SweepSettingsError(f"{path} has no icl_lens sweep metadata (written by an older icl_lens or another "
                                 f"tool); sweep into a new --out folder")
    meta = json.loads(raw)
    if not (isinstance(meta, dict) and meta.get("version") == META_VERSION and isinstance(meta.get("settings"), dict)
            and isinstance(meta.get("prompts"), dict)):
        raise SweepSettingsError(f"{path}: unsupported sweep metadata; sweep into a new --out folder")
    return meta


def read_parts(out: Path) -> list[Part]:
    """Every norms part of the folder with its settings and prompt hashes."""
    folder = out / NORM_PARTS
    parts = []
    for path in sorted(folder.glob("part-*.parquet")) if folder.is_dir() else ():
        meta = _read_meta(path)
        parts.append(Part(path, meta["settings"], meta["prompts"]))
    return parts


def clean_folder(out: Path) -> None:
    """Remove what a killed run left (temporaries, orphan factor shards); quarantine unreadable parts.

    Call only while holding the folder's lock.
    """
    norms, factors = out / NORM_PARTS, out / FACTOR_PARTS
    for folder in (out, norms, factors):
        for tmp in folder.glob(".*.tmp") if folder.is_dir() else ():
            tmp.unlink(missing_ok=True)
    for path in sorted(norms.glob("part-*.parquet")) if norms.is_dir() else ():
        try:
            pq.read_schema(path)
        except (OSError, pa.ArrowException) as err:
            (out / QUARANTINE).mkdir(exist_ok=True)
            os.replace(path, out / QUARANTINE / path.name)
            shard = factors / f"{path.stem}.safetensors"
            if shard.exists():
                os.replace(shard, out / QUARANTINE / shard.name)
            warnings.warn(f"icl_lens: {path} cannot be read ({err}); moved to {out / QUARANTINE}, its prompts will be "
                          f"done again", stacklevel=2)
    for shard in factors.glob("part-*.safetensors") if factors.is_dir() else ():
        if not (norms / f"{shard.stem}.parquet").exists():
            shard.unlink()  # written just before a crash, before its norms part


def check_settings(parts: list[Part], settings: dict, out: Path) -> None:
    """Refuse to add to a folder whose parts were computed with other settings (one error, naming the setting)."""
    for part in parts:
        for name in SETTINGS:
            have, want = part.settings.get(name), settings.get(name)
            if name == "revision" and (have is None or want is None):
                continue  # unknown on one side: nothing to compare
            if have != want:
                raise SweepSettingsError(
                    f"{out} holds results computed with {name} {have!r}, not {want!r}; rerun with the folder's "
                    f"settings to resume, or sweep into a new --out folder")


def done_prompts(parts: list[Part]) -> dict[str, str]:
    """``{id: sha}`` of every prompt already done in the folder."""
    done: dict[str, str] = {}
    for part in parts:
        done.update(part.prompts)
    return done


def check_prompts(rows, done: dict[str, str], out: Path) -> None:
    """Refuse a prompt edited under an id the folder already did (its stored result is of the old text)."""
    changed = [r for r in rows if r.id in done and done[r.id] != r.sha]
    if changed:
        shown = ", ".join(f"id {r.id!r} (line {r.line})" for r in changed[:3]) + (", …" if len(changed) > 3 else "")
        raise SweepSettingsError(
            f"{len(changed)} prompt(s) differ from the ones already swept into {out} under the same id: {shown}; "
            f"restore the old text, give the new text a new id, or sweep into a new --out folder")
