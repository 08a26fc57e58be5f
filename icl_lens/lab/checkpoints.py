"""Shipped checkpoints of the lab models: ``icl_lens/lab/checkpoints/<arch>.pt``.

Each file holds the :class:`~icl_lens.lab.model.LabConfig`, the float32 state dict and
the training record (steps, seed, final loss, seconds). Load without training with
:func:`load_lab_model`; retrain with ``python -m icl_lens.lab.train --arch ARCH``.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from icl_lens.lab.mixers import ARCHITECTURES
from icl_lens.lab.model import LabConfig, RegressionModel

CHECKPOINT_DIR = Path(__file__).parent / "checkpoints"


class CheckpointNotFoundError(FileNotFoundError):
    """No shipped checkpoint for this architecture (retrain with ``python -m icl_lens.lab.train``)."""


def checkpoint_path(arch: str, directory: Path | str | None = None) -> Path:
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown arch {arch!r}; choose one of {ARCHITECTURES}")
    return Path(directory or CHECKPOINT_DIR) / f"{arch}.pt"


def save_checkpoint(model: RegressionModel, record: dict, directory: Path | str | None = None) -> Path:
    path = checkpoint_path(model.cfg.arch, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float32).clone() for k, v in model.state_dict().items()}
    torch.save({"config": model.cfg.to_dict(), "state_dict": state, "record": record}, path)
    return path


@functools.lru_cache(maxsize=16)
def _load_file(path: str) -> dict:
    from torch.torch_version import TorchVersion

    with torch.serialization.safe_globals([TorchVersion]):  # a version string in the training record
        return torch.load(path, map_location="cpu", weights_only=True)


def load_lab_model(arch: str, dtype: torch.dtype = torch.float32, directory: Path | str | None = None) -> RegressionModel:
    """The trained ``arch`` model (``softmax``, ``linear``, ``delta``, ``gru``) in ``dtype``, in eval mode."""
    path = checkpoint_path(arch, directory)
    if not path.exists():
        raise CheckpointNotFoundError(f"no checkpoint at {path}; run `python -m icl_lens.lab.train --arch {arch}`")
    blob = _load_file(str(path))
    model = RegressionModel(LabConfig(**blob["config"]))
    model.load_state_dict(blob["state_dict"])
    return model.to(dtype).eval().requires_grad_(False)


def training_record(arch: str, directory: Path | str | None = None) -> dict:
    """What the shipped checkpoint's training run recorded (steps, loss, seconds, seed)."""
    return dict(_load_file(str(checkpoint_path(arch, directory)))["record"])
