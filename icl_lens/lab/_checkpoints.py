"""Shipped checkpoints of the lab models: ``icl_lens/lab/checkpoints/<name>.pt``.

Each file holds the :class:`~icl_lens.lab._model.LabConfig`, the float32 state dict and
the training record (steps, seed, final loss, seconds). Load without training with
:func:`load_lab_model`; retrain with ``python -m icl_lens.lab.train --model NAME``.

Named models (:data:`LAB_MODELS`):

- ``softmax``, ``linear``, ``delta``, ``gru``: 10 Pre-LN blocks (d_model 32), one per
  contextual layer (:mod:`icl_lens.lab._mixers`);
- ``single_block``: the first experiment of Dherin et al. 2025 (arXiv 2507.16003): one
  softmax-attention block with no skip connection, no LayerNorm, no embedding and no
  positional encoding, tokens ``[x, y]`` with ``x ∈ R²``, MLP 3 → 128 → 3, the prediction
  read from the last coordinate, trained on up to 50 pairs;
- ``one_block``, ``one_block_skip``, ``one_block_ln``, ``one_block_preln``: ONE block of the
  ``softmax`` model's width (d_model 32, embedding, query flag, up to 16 pairs) without
  skip connection or LayerNorm, with the skip connections only, with the LayerNorms
  only, and with both (a one-block Pre-LN model): the ablations of the Pre-LN block;
- ablations (:data:`ABLATION_MODELS`, not shipped: trained by :mod:`icl_lens.lab.seeds`): the
  single block with ONE factor of ``one_block`` changed: no attention-output bias, a linear
  embedding, an embedding to width 32, or ``one_block``'s task (d_x 4, query flag, 16 pairs);
- ``skip_only``: the 10-layer ``softmax`` model without its LayerNorms. (Ten blocks with
  LayerNorms but no skip connections did not train with the same recipe, so the
  LayerNorm-only ablation is the one-block model.)

Not shipped either, trained by :mod:`icl_lens.lab.seeds` with an oriented initialisation (the recipe's
``orient``: every first-layer head that prefers context inputs opposite to the query starts with its
query projection negated, :func:`icl_lens.lab.orient_attention`): ``sb_oriented``
(:data:`ORIENTED_MODELS`, the single block) and its one-factor variants (:data:`FACTOR_MODELS`: skip
connections, LayerNorms, both, no attention-output bias, 3 heads, one_block's recipe, d_x 4, 16 pairs,
an embedding to width 32), the ablation of issue 39 on a base whose seeds all start in one basin.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from icl_lens.lab._mixers import ARCHITECTURES
from icl_lens.lab._model import LabConfig, RegressionModel

CHECKPOINT_DIR = Path(__file__).parent / "checkpoints"

LAB_MODELS: dict[str, LabConfig] = {
    **{arch: LabConfig(arch=arch) for arch in ARCHITECTURES},
    "single_block": LabConfig(arch="softmax", d_x=2, d_model=3, d_mlp=128, n_layers=1, n_heads=1, n_context_train=50,
                              skip=False, layer_norm=False, embed=False, query_flag=False),
    "one_block": LabConfig(arch="softmax", n_layers=1, skip=False, layer_norm=False),
    "one_block_skip": LabConfig(arch="softmax", n_layers=1, layer_norm=False),
    "one_block_ln": LabConfig(arch="softmax", n_layers=1, skip=False),
    "one_block_preln": LabConfig(arch="softmax", n_layers=1),
    "skip_only": LabConfig(arch="softmax", layer_norm=False),
}

# Training recipe per model (python -m icl_lens.lab.train uses it unless told otherwise).
RECIPES: dict[str, dict] = {
    **{arch: {"steps": 3000, "lr": 2e-3} for arch in ARCHITECTURES},
    "delta": {"steps": 2500, "lr": 2e-3},  # the shipped checkpoint's run
    "single_block": {"steps": 4000, "lr": 1e-2},
    **{name: {"steps": 3000, "lr": 2e-3} for name in ("one_block", "one_block_skip", "one_block_ln", "one_block_preln")},
    "skip_only": {"steps": 3000, "lr": 2e-3},
}

_SINGLE = LAB_MODELS["single_block"]
# One factor at a time from ``single_block`` toward ``one_block`` (no shipped checkpoint: trained into the seed
# cache, :mod:`icl_lens.lab.seeds`, with the single block's recipe).
ABLATION_MODELS: dict[str, LabConfig] = {
    "sb_no_attn_bias": LabConfig(**{**_SINGLE.to_dict(), "attn_bias": False}),
    "sb_embed": LabConfig(**{**_SINGLE.to_dict(), "embed": True}),
    "sb_wide": LabConfig(**{**_SINGLE.to_dict(), "embed": True, "d_model": 32}),
    "sb_task": LabConfig(**{**_SINGLE.to_dict(), "d_x": 4, "d_model": 6, "query_flag": True, "n_context_train": 16}),
}
ABLATION_FACTOR = {"sb_no_attn_bias": "attention-output bias removed", "sb_embed": "linear embedding added (width 3)",
                   "sb_wide": "embedding to width 32", "sb_task": "one_block's task (d_x 4, query flag, 16 pairs)"}
RECIPES.update({name: dict(RECIPES["single_block"]) for name in ABLATION_MODELS})

# The task has two mirror solutions (attend to inputs similar or opposite to the query, ``_mirror.py``);
# which one a seed finds is set at initialisation and decides the sign of its per-step alignment. ``orient`` in a
# recipe starts every seed in the similar-input basin (the first layer's heads that prefer opposite inputs have their
# query projection negated before training), so a model's seeds are one population.
ORIENTED_MODELS: dict[str, LabConfig] = {"sb_oriented": _SINGLE}
RECIPES["sb_oriented"] = {**RECIPES["single_block"], "orient": True}

# The one-factor ablation on the oriented single block: each variant changes ONE factor of ``sb_oriented`` (no
# shipped checkpoints: trained into the seed cache, oriented, with the single block's recipe unless the factor is the
# recipe). Without an embedding the width is the token size (3), so "heads" goes 1 → 3 (one dimension per head).
_BASE = _SINGLE.to_dict()
FACTOR_MODELS: dict[str, LabConfig] = {
    "sbo_skip": LabConfig(**{**_BASE, "skip": True}),
    "sbo_ln": LabConfig(**{**_BASE, "layer_norm": True}),
    "sbo_skip_ln": LabConfig(**{**_BASE, "skip": True, "layer_norm": True}),
    "sbo_no_attn_bias": LabConfig(**{**_BASE, "attn_bias": False}),
    "sbo_3heads": LabConfig(**{**_BASE, "n_heads": 3}),
    "sbo_recipe": _SINGLE,
    "sbo_dx4": LabConfig(**{**_BASE, "d_x": 4, "d_model": 5}),
    "sbo_pairs16": LabConfig(**{**_BASE, "n_context_train": 16}),
    "sbo_wide": LabConfig(**{**_BASE, "embed": True, "d_model": 32}),
}
FACTOR = {"sbo_skip": "skip connections", "sbo_ln": "LayerNorms", "sbo_skip_ln": "skip connections and LayerNorms",
          "sbo_no_attn_bias": "no attention-output bias", "sbo_3heads": "3 heads instead of 1 (width 3)",
          "sbo_recipe": "one_block's recipe (rate 2e-3, 3000 steps)", "sbo_dx4": "d_x 4 instead of 2",
          "sbo_pairs16": "trained on up to 16 pairs instead of 50", "sbo_wide": "an embedding to width 32"}
RECIPES.update({name: dict(RECIPES["sb_oriented"]) for name in FACTOR_MODELS})
RECIPES["sbo_recipe"] = {**RECIPES["one_block"], "orient": True}


class CheckpointNotFoundError(FileNotFoundError):
    """No shipped checkpoint for this model (retrain with ``python -m icl_lens.lab.train``)."""


def checkpoint_path(name: str, directory: Path | str | None = None) -> Path:
    if name not in LAB_MODELS:
        raise ValueError(f"unknown lab model {name!r}; choose one of {tuple(LAB_MODELS)}")
    return Path(directory or CHECKPOINT_DIR) / f"{name}.pt"


def save_checkpoint(model: RegressionModel, record: dict, name: str | None = None,
                    directory: Path | str | None = None) -> Path:
    """Save ``model`` as ``<name>.pt`` (default name: its architecture)."""
    path = checkpoint_path(name or model.cfg.arch, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32).clone() for k, v in model.state_dict().items()}
    torch.save({"config": model.cfg.to_dict(), "state_dict": state, "record": record}, path)
    return path


@functools.lru_cache(maxsize=16)
def load_checkpoint_file(path: str, mtime: float) -> dict:
    """The saved blob (config, state dict, record) of a checkpoint file; cached per path and modification time."""
    from torch.torch_version import TorchVersion

    with torch.serialization.safe_globals([TorchVersion]):  # a version string in the training record
        return torch.load(path, map_location="cpu", weights_only=True)


def _blob(name: str, directory) -> dict:
    path = checkpoint_path(name, directory)
    if not path.exists():
        raise CheckpointNotFoundError(f"no checkpoint at {path}; run `python -m icl_lens.lab.train --model {name}`")
    return load_checkpoint_file(str(path), path.stat().st_mtime)


def load_lab_model(name: str, dtype: torch.dtype = torch.float32, directory: Path | str | None = None) -> RegressionModel:
    """The trained model ``name`` (see :data:`LAB_MODELS`) in ``dtype``, in eval mode."""
    blob = _blob(name, directory)
    model = RegressionModel(LabConfig(**blob["config"]))
    model.load_state_dict(blob["state_dict"])
    return model.to(dtype).eval().requires_grad_(False)


def training_record(name: str, directory: Path | str | None = None) -> dict:
    """What the shipped checkpoint's training run recorded (steps, loss, seconds, seed)."""
    return dict(_blob(name, directory)["record"])
