"""Lab models over several training seeds, cached on disk: ``python -m icl_lens.lab.seeds``.

A verdict about a trained model is a verdict about one training run unless it is repeated
over seeds. :func:`seed_model` returns the model ``name`` trained with seed ``s`` by its
recipe (:data:`icl_lens.lab._checkpoints.RECIPES`): seed 0 of a shipped model is the shipped
checkpoint when its record matches the recipe; every other seed is trained once and cached
under ``$ICL_LENS_CACHE/lab/<name>-s<seed>-<key>.pt`` (default ``~/.cache/icl_lens/lab``, beside the
dequantised models: never inside the installed package), where ``key`` hashes the configuration, the
recipe and the batch size, so a changed configuration never reads a stale file.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch

from icl_lens.lab._checkpoints import (
    ABLATION_MODELS, CHECKPOINT_DIR, FACTOR_MODELS, LAB_MODELS, ORIENTED_MODELS, RECIPES, load_checkpoint_file,
    checkpoint_path,
)
from icl_lens.lab._model import LabConfig, RegressionModel
from icl_lens.model._loading import cache_dir as models_cache_dir

MODELS: dict[str, LabConfig] = {**LAB_MODELS, **ABLATION_MODELS, **ORIENTED_MODELS, **FACTOR_MODELS}
BATCH = 64
SEEDS = tuple(range(10))  # the training seeds the evaluations use


def cache_key(name: str, seed: int) -> str:
    """Hash of the configuration, recipe, batch and seed of one training run."""
    if name not in MODELS:
        raise ValueError(f"unknown lab model {name!r}; choose one of {tuple(MODELS)}")
    text = json.dumps({"config": MODELS[name].to_dict(), "recipe": RECIPES[name], "batch": BATCH, "seed": int(seed)},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def seed_cache_dir() -> Path:
    """Where trained seeds are cached by default: ``lab/`` in the models' cache, ``$ICL_LENS_CACHE``."""
    return models_cache_dir() / "lab"


def cache_path(name: str, seed: int, cache_dir: Path | str | None = None) -> Path:
    return Path(cache_dir or seed_cache_dir()) / f"{name}-s{int(seed)}-{cache_key(name, seed)}.pt"


def _shipped(name: str, seed: int) -> Path | None:
    """The shipped checkpoint when it is this run (same configuration, recipe, batch and seed)."""
    if name not in LAB_MODELS:
        return None
    path = checkpoint_path(name, CHECKPOINT_DIR)
    if not path.exists():
        return None
    blob = load_checkpoint_file(str(path), path.stat().st_mtime)
    rec, recipe = blob["record"], RECIPES[name]
    same = (LabConfig(**blob["config"]) == MODELS[name] and rec.get("seed") == seed and rec.get("steps") == recipe["steps"]
            and rec.get("lr") == recipe["lr"] and rec.get("batch") == BATCH)
    return path if same else None


def _load(path: Path) -> tuple[RegressionModel, dict]:
    blob = load_checkpoint_file(str(path), path.stat().st_mtime)
    model = RegressionModel(LabConfig(**blob["config"]))
    model.load_state_dict(blob["state_dict"])
    return model.eval().requires_grad_(False), dict(blob["record"])


def is_cached(name: str, seed: int, cache_dir: Path | str | None = None) -> bool:
    return _shipped(name, seed) is not None or cache_path(name, seed, cache_dir).exists()


def seed_model(name: str, seed: int, *, cache_dir: Path | str | None = None, train_missing: bool = True,
               progress: bool = False) -> tuple[RegressionModel, dict]:
    """Model ``name`` trained with ``seed`` (float32, eval mode) and its training record.

    Reads the shipped checkpoint or the cache; trains and caches when neither has it
    (``train_missing=False`` raises :class:`FileNotFoundError` instead).
    """
    shipped = _shipped(name, seed)
    if shipped is not None:
        return _load(shipped)
    path = cache_path(name, seed, cache_dir)
    if path.exists():
        return _load(path)
    if not train_missing:
        raise FileNotFoundError(f"no cached run of {name} seed {seed} at {path}; run `python -m icl_lens.lab.seeds "
                                f"--models {name} --seeds {seed}`")
    from icl_lens.lab.train import train

    recipe = RECIPES[name]
    model, record = train(MODELS[name], steps=recipe["steps"], lr=recipe["lr"], batch=BATCH, seed=seed,
                          progress=progress, desc=f"{name} s{seed}", orient=recipe.get("orient", False))
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32).clone() for k, v in model.state_dict().items()}
    tmp = path.with_suffix(".tmp")
    torch.save({"config": model.cfg.to_dict(), "state_dict": state, "record": record}, tmp)
    tmp.replace(path)
    return model, record


def main(argv: list[str] | None = None) -> None:
    """Train every missing (model, seed) run, seed-major (a run cut short still has every model at the first seeds)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    ap.add_argument("--cache", default=None, help="cache folder (default $ICL_LENS_CACHE/lab, ~/.cache/icl_lens/lab)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar per run (e.g. when logging to a file)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for seed in args.seeds:  # seed-major: a run cut short still has every model at the first seeds
        for name in args.models:
            if is_cached(name, seed, args.cache):
                print(f"[{name} s{seed}] cached", flush=True)
                continue
            t0 = time.perf_counter()
            _, rec = seed_model(name, seed, cache_dir=args.cache, progress=not args.no_progress)
            print(f"[{name} s{seed}] trained in {time.perf_counter() - t0:.0f} s: steps {rec['steps']}, "
                  f"eval_loss_n_train {rec['eval_loss_n_train']:.4f}", flush=True)


if __name__ == "__main__":
    main()
