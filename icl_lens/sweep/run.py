"""Run a sweep: patch norms of every prompt of a JSONL file into Parquet parts, resumable, multi-process.

Layout of the output folder ``DIR``:

- ``norms/part-*.parquet``: columns ``id, layer, position, token, norm, correction_norm``
  (docs/design.md §2); ``pandas.read_parquet(DIR / "norms")`` reads them all. One part
  per batch, written to a temporary name and renamed, so a crash or Ctrl-C never leaves a
  half-written part.
- ``factors/part-*.safetensors`` (``--factors``): the patch factors of the same prompts
  (``δ``, ``v``, corrections, norms; ``u`` is formed from ``δ`` with the model's weights:
  ``load_many(path, weights=icl_lens.dense_weights(model))``), keyed by id
  (:meth:`icl_lens.TokenPatches.load_many`, or ``load(path, key=id)``), written before
  the matching norms part.
- ``manifest.json``: model, dtype, device, versions, counts, seconds, bad rows with reasons.

A rerun on the same ``DIR`` skips the ids already in ``norms/``. Several processes
(``accelerate launch --num_processes N -m icl_lens sweep ...``) split the ids left to do
with accelerate's ``PartialState().split_between_processes``; each writes its own parts,
so the union is what one process would write.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from icl_lens.sweep.rows import BadRow, SweepRow, read_rows

NORM_PARTS = "norms"
FACTOR_PARTS = "factors"
BAD_PARTS = "bad"
MANIFEST = "manifest.json"


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
        return pd.DataFrame(columns=["id", "layer", "position", "token", "norm", "correction_norm"])
    return pd.read_parquet(folder)


def done_ids(out: Path) -> set:
    """Ids whose norms part is already written."""
    folder = out / NORM_PARTS
    if not folder.is_dir():
        return set()
    ids: set = set()
    for part in sorted(folder.glob("part-*.parquet")):
        ids.update(pd.read_parquet(part, columns=["id"])["id"].unique().tolist())
    return ids


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _write_part(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("icl_lens", "torch", "transformer-lens", "transformers", "accelerate", "pyarrow"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _requested_device(device: str) -> str:
    """``auto``: CUDA if this machine has it (and ``accelerate launch --cpu`` did not ask for the CPU)."""
    from icl_lens.model.loading import check_device

    if device == "auto":
        forced_cpu = os.environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes")
        device = "cuda" if torch.cuda.is_available() and not forced_cpu else "cpu"
    check_device(device)
    return str(device)


def _chunks(rows: list[SweepRow], batch_size: int) -> list[list[SweepRow]]:
    """Batches of similar length (characters, longest first), fixed before the split between processes.

    Every process count forms the same batches, so the union of the parts is exactly
    what one process writes (rounding included).
    """
    ordered = sorted(rows, key=lambda r: (-len(r.prompt), r.line))
    return [ordered[i: i + batch_size] for i in range(0, len(ordered), batch_size)]


def _write_batch(lm, chunk: list[tuple[SweepRow, torch.Tensor]], out: Path, stem: str, factors: bool,
                 layers: list[int] | None) -> None:
    """Norms (and factors) of one batch: the factors shard first, then the norms part that marks the ids done."""
    from icl_lens.core.patch_set import TokenPatches
    from icl_lens.model.batches import batched_token_patches, iter_patch_norms
    from icl_lens.model.prompts import str_tokens

    ids = [x for _, x in chunk]
    frames = []
    if factors:
        patches = batched_token_patches(lm, ids, batch_size=len(chunk))
        TokenPatches.save_many({str(r.id): p for (r, _), p in zip(chunk, patches)},
                               out / FACTOR_PARTS / f"{stem}.safetensors")
        for (r, _), p in zip(chunk, patches):
            frame = p.to_frame()
            frames.append((frame[frame["layer"].isin(layers)] if layers is not None else frame).assign(id=r.id))
    else:
        for order, cols in iter_patch_norms(lm, None, ids=ids, batch_size=len(chunk), layers=layers):
            for i, c in zip(order, cols):
                tokens = np.asarray(str_tokens(lm, ids[i]), dtype=object)
                frames.append(pd.DataFrame({"id": chunk[i][0].id, "layer": c["layer"], "position": c["position"],
                                            "token": tokens[c["position"]], "norm": c["norm"],
                                            "correction_norm": c["correction_norm"]}))
    frame = pd.concat(frames, ignore_index=True)[["id", "layer", "position", "token", "norm", "correction_norm"]]
    _write_part(frame, out / NORM_PARTS / f"{stem}.parquet")


def run_sweep(prompts: str | Path, *, model: str, out: str | Path, batch_size: int = 16,
              dtype: str = "float32", device: str = "auto", factors: bool = False,
              layers: list[int] | None = None, progress: bool = True) -> SweepResult:
    """Patch norms of every good row of ``prompts`` into ``out`` (see the module doc); returns the manifest."""
    from accelerate import PartialState
    from tqdm.auto import tqdm

    from icl_lens.model.loading import load_model, resolve_dtype
    from icl_lens.model.prompts import PromptError, encode_prompt

    start = time.perf_counter()
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    resolve_dtype(dtype)
    rows, bad = read_rows(prompts)
    out = Path(out)
    device = _requested_device(device)
    # cpu=True lets processes started by accelerate launch / torchrun on CPUs join one gloo group.
    state = PartialState(cpu=device == "cpu")
    if device.startswith("cuda") and state.num_processes > 1 and state.device.type == "cuda":
        device = str(state.device)  # one GPU per process
    if state.is_main_process:
        for sub in (NORM_PARTS, BAD_PARTS) + ((FACTOR_PARTS,) if factors else ()):
            (out / sub).mkdir(parents=True, exist_ok=True)
        for stale in list((out / NORM_PARTS).glob(".*.tmp")) + list((out / BAD_PARTS).glob("*.json")):
            stale.unlink()  # an interrupted write, or last run's bad rows (recomputed below)
    state.wait_for_everyone()
    before = done_ids(out)
    todo = [r for r in rows if r.id not in before]
    if device == "cpu" and state.num_processes > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // state.num_processes))

    mine_bad: list[BadRow] = []
    written = 0
    with state.split_between_processes(_chunks(todo, batch_size)) as mine:
        mine = list(mine)
        if mine:
            lm = load_model(model, device=device, dtype=dtype)
            bar = tqdm(total=sum(len(c) for c in mine), desc=f"sweep {model}", unit="prompt",
                       disable=not (progress and state.is_main_process))
            tag = f"r{state.process_index:03d}"
            for rows_in in mine:
                chunk = []
                for row in rows_in:
                    try:
                        chunk.append((row, encode_prompt(lm, row.prompt)))
                    except PromptError as err:
                        mine_bad.append(BadRow(row.line, row.id, str(err)))
                if chunk:
                    _write_batch(lm, chunk, out, f"part-{tag}-{uuid.uuid4().hex[:12]}", factors, layers)
                    written += len(chunk)
                bar.update(len(rows_in))
            bar.close()
    _atomic_write_text(out / BAD_PARTS / f"r{state.process_index:03d}.json",
                       json.dumps({"bad_rows": [b.to_dict() for b in mine_bad], "written": written}))
    state.wait_for_everyone()
    manifest = {}
    if state.is_main_process:
        extra_bad, new = [], 0
        for part in sorted((out / BAD_PARTS).glob("r*.json")):
            data = json.loads(part.read_text())
            extra_bad += [BadRow(**b) for b in data["bad_rows"]]
            new += data["written"]
        all_bad = sorted(bad + extra_bad, key=lambda b: b.line)
        done = done_ids(out)
        manifest = {
            "prompts": str(Path(prompts).resolve()),
            "model": model,
            "dtype": str(resolve_dtype(dtype)).removeprefix("torch."),
            "device": device,
            "processes": state.num_processes,
            "batch_size": batch_size,
            "layers": layers,
            "factors": factors,
            "versions": _versions(),
            "counts": {"rows": len(rows) + len(bad), "good": len(rows), "bad": len(all_bad),
                       "done_before": len(before & {r.id for r in rows}), "done_now": new,
                       "done": len(done & {r.id for r in rows}), "left": len({r.id for r in rows} - done)
                       - len(extra_bad)},
            "seconds": round(time.perf_counter() - start, 3),
            "bad_rows": [b.to_dict() for b in all_bad],
        }
        _atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=2, default=str) + "\n")
    state.wait_for_everyone()
    if not manifest:
        manifest = json.loads((out / MANIFEST).read_text())
    return SweepResult(out, manifest, main_process=state.is_main_process)
