"""The part files of a sweep folder: what each holds, written atomically, checked on resume.

``DIR/norms/part-STEM.parquet`` holds the norms of one batch with a fixed schema
(``id`` text, ``layer``, ``position``, ``token``, ``norm``, ``correction_norm``, and with
``--authors K`` the column ``patch_authors``: a list of ``{head, offset, share}``) and, in
its Parquet metadata under ``icl_lens.sweep``, the settings it was computed with (model,
revision, dtype, layers, factors, authors), ``{id: sha}`` of its done prompts and ``{id: {sha,
line, reason}}`` of the batch's rows that failed (out of memory, non-finite values), so
that a rerun reports them again instead of failing on them again. With ``--factors``,
``DIR/factors/part-STEM.safetensors`` is written first. Last comes
``DIR/checksums/part-STEM.json``: the BLAKE2b digest and size of the part and of its shard;
it is the record that the batch is done.

Every file is written to a hidden temporary name and renamed, so no reader ever sees half
a file. At the start of every run, under the folder's lock (so no live writer owns them),
:func:`clean_folder` removes temporaries, shards without a part and parts without a
record (written just before a kill), and verifies every recorded part and shard against
its digest: a part that does not match (a flipped bit, a truncated or missing shard, a
record that names another file), a part whose name is not one the sweep writes (a copy
made by a sync tool, ``part-… (1).parquet``), or a part repeating ids an earlier part
holds, is moved to ``DIR/quarantine/`` with its shard and record, and its prompts are done
again.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
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
CHECKSUMS = "checksums"
META_KEY = b"icl_lens.sweep"
META_VERSION = 2
STEM = re.compile(r"part-r\d{3}-[0-9a-f]{12}")  # the names the sweep gives its parts (:func:`part_stem`)
SKIP = object()  # a setting not known yet (negative layers before the model is loaded): not compared
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
    prompts: dict[str, str]  # id -> prompt sha, of the rows done
    failed: dict[str, dict]  # id -> {sha, line, reason}, of the rows that failed


def part_stem(process_index: int) -> str:
    """A new part's name (without suffix): the writing process and a random tag."""
    return f"part-r{process_index:03d}-{uuid.uuid4().hex[:12]}"


def file_digest(path: Path) -> dict:
    """``{"blake2b": hex, "bytes": size}`` of a file's bytes."""
    h = hashlib.blake2b(digest_size=32)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"blake2b": h.hexdigest(), "bytes": path.stat().st_size}


def hidden_temp(path: Path) -> Path:
    """A temporary name beside ``path`` that readers skip (leading dot) and the next run removes."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def write_part(frame: pd.DataFrame, out: Path, stem: str, settings: dict, prompts: dict[str, str],
               failed: dict[str, dict]) -> None:
    """The norms ``frame`` as the part ``stem`` (atomically), then its checksum record (with the factor shard's
    digest, when the shard was written first): the record makes the batch done."""
    meta = {"version": META_VERSION, "settings": settings, "prompts": prompts, "failed": failed}
    columns, schema = (list(COLUMNS), SCHEMA) if not settings.get("authors") else \
        (list(COLUMNS) + [AUTHORS], SCHEMA.append(AUTHORS_FIELD))
    table = pa.Table.from_pandas(frame.reindex(columns=columns), schema=schema, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: json.dumps(meta).encode()})
    path = out / NORM_PARTS / f"{stem}.parquet"
    tmp = hidden_temp(path)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    shard = out / FACTOR_PARTS / f"{stem}.safetensors"
    record = {"part": path.name, **file_digest(path),
              "factors": {"file": shard.name, **file_digest(shard)} if settings.get("factors") else None}
    (out / CHECKSUMS).mkdir(exist_ok=True)
    atomic_write_text(out / CHECKSUMS / f"{stem}.json", json.dumps(record))


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
            and isinstance(meta.get("prompts"), dict) and isinstance(meta.get("failed"), dict)):
        raise SweepSettingsError(f"{path}: unsupported sweep metadata; sweep into a new --out folder")
    return meta


def read_parts(out: Path) -> list[Part]:
    """Every norms part of the folder with its settings and prompt hashes."""
    folder = out / NORM_PARTS
    parts = []
    for path in sorted(folder.glob("part-*.parquet")) if folder.is_dir() else ():
        meta = _read_meta(path)
        parts.append(Part(path, meta["settings"], meta["prompts"], meta["failed"]))
    return parts


def _quarantine(out: Path, stem: str, paths: list[Path], why: str) -> None:
    (out / QUARANTINE).mkdir(exist_ok=True)
    for path in paths:
        if path.exists():
            os.replace(path, out / QUARANTINE / path.name)
    warnings.warn(f"icl_lens: {stem} {why}; moved to {out / QUARANTINE}, and its prompts that no other part holds "
                  f"will be done again", stacklevel=3)


def _damage(path: Path, record_path: Path, shard: Path) -> str | None:
    """Why the part at ``path`` cannot be trusted (None: its record and digests match)."""
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "has an unreadable checksum record"
    if not isinstance(record, dict) or record.get("part") != path.name:
        return f"has a checksum record of another file ({record.get('part') if isinstance(record, dict) else '?'})"
    have = file_digest(path)
    if {k: record.get(k) for k in have} != have:
        return f"does not match its checksum ({have['bytes']} bytes, recorded {record.get('bytes')}): damaged"
    want = record.get("factors")
    if want is not None:
        if not shard.exists():
            return f"has lost its factor shard {shard.name}"
        got = file_digest(shard)
        if not isinstance(want, dict) or want.get("file") != shard.name or {k: want.get(k) for k in got} != got:
            return f"has a factor shard that does not match its checksum ({got['bytes']} bytes, recorded " \
                   f"{want.get('bytes')}): damaged"
    try:
        _read_meta(path)
    except (OSError, ValueError, pa.ArrowException) as err:  # written so by a bug: never trust it
        return f"cannot be read ({err})"
    return None


def clean_folder(out: Path) -> None:
    """Remove what a killed run left, quarantine what cannot be trusted (see the module doc).

    Call only while holding the folder's lock.
    """
    norms, factors, sums = out / NORM_PARTS, out / FACTOR_PARTS, out / CHECKSUMS
    for folder in (out, norms, factors, sums):
        for tmp in folder.glob(".*.tmp") if folder.is_dir() else ():
            tmp.unlink(missing_ok=True)
    seen: dict[str, str] = {}  # id -> the part that holds it
    for path in sorted(norms.glob("part-*.parquet")) if norms.is_dir() else ():
        stem = path.name.removesuffix(".parquet")
        shard, record = factors / f"{stem}.safetensors", sums / f"{stem}.json"
        own = [path, shard, record]
        if not STEM.fullmatch(stem):
            _quarantine(out, stem, own, "is not a part this sweep wrote (a copy?)")
            continue
        if record.exists():
            why = _damage(path, record, shard)
        else:
            why = None
            try:
                _read_meta(path)  # another version's or tool's part stops the run (SweepSettingsError)
            except SweepSettingsError:
                raise
            except (OSError, ValueError, pa.ArrowException):
                why = "cannot be read and has no checksum record"
            if why is None:  # written just before a kill, before its record
                path.unlink()
                shard.unlink(missing_ok=True)
                continue
        meta = _read_meta(path) if why is None else None
        repeated = sorted(set(meta["prompts"]) & seen.keys()) if meta and why is None else []
        if repeated:
            why = f"repeats {len(repeated)} id(s) of {seen[repeated[0]]} (id {repeated[0]!r}, …): a copy"
        if why is not None:
            _quarantine(out, stem, own, why)
            continue
        seen.update(dict.fromkeys(meta["prompts"], path.name))
    for shard in factors.glob("part-*.safetensors") if factors.is_dir() else ():
        if not (norms / f"{shard.stem}.parquet").exists():
            shard.unlink()  # written just before a kill, before its norms part
    for record in sums.glob("part-*.json") if sums.is_dir() else ():
        if not (norms / f"{record.stem}.parquet").exists():
            record.unlink()


def read_records(out: Path) -> list[dict]:
    """The checksum records of the folder's parts (after :func:`clean_folder`, one per part)."""
    folder = out / CHECKSUMS
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("part-*.json"))] \
        if folder.is_dir() else []


def check_settings(parts: list[Part], settings: dict, out: Path) -> None:
    """Refuse to add to a folder whose parts were computed with other settings (one error, naming the setting)."""
    for part in parts:
        for name in SETTINGS:
            have, want = part.settings.get(name), settings.get(name)
            if want is SKIP or name == "revision" and (have is None or want is None):
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


def failed_prompts(parts: list[Part]) -> dict[str, dict]:
    """``{id: {sha, line, reason}}`` of every prompt that failed in an earlier batch (and is not done since)."""
    failed: dict[str, dict] = {}
    for part in parts:
        failed.update(part.failed)
    done = done_prompts(parts)
    return {k: v for k, v in failed.items() if k not in done}


def check_prompts(rows, done: dict[str, str], out: Path) -> None:
    """Refuse a prompt edited under an id the folder already did (its stored result is of the old text)."""
    changed = [r for r in rows if r.id in done and done[r.id] != r.sha]
    if changed:
        shown = ", ".join(f"id {r.id!r} (line {r.line})" for r in changed[:3]) + (", …" if len(changed) > 3 else "")
        raise SweepSettingsError(
            f"{len(changed)} prompt(s) differ from the ones already swept into {out} under the same id: {shown}; "
            f"restore the old text, give the new text a new id, or sweep into a new --out folder")
