"""Record the residual stream entering one layer, over every forward run inside a ``with`` block.

The residual stream entering block ``l`` at position ``t`` is ``r[l, t]`` of docs/design.md §2
(the hidden state that block ``l``'s attention and MLP read, before any norm). A linear probe
on ``r`` is the usual "hidden state" baseline for what a model knows (e.g. for telling its
correct answers from its wrong ones).

    with recording_residual(model, layer) as rec:
        gen = generate_with_patches(model, prompt)     # any number of forwards
    rows = rec.rows()                                   # [positions computed, d_model]

Each forward adds the rows of the positions it computed, in order: a cached forward
(``PatchSession.update``) adds only its new positions, so after a generation the rows
cover the last ``sum(gen.recomputed)`` positions of the sequence. The hook is removed when
the block exits, also after an error.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.model._block_family import BlockFamily
from icl_lens.model._reading import activations_captured


@dataclass
class ResidualRecorder:
    """Rows of the residual stream entering ``layer``, one chunk per forward (batch row 0)."""

    layer: int
    chunks: list[Tensor] = field(default_factory=list)

    def rows(self) -> Float[Tensor, "pos d_model"]:
        """All recorded positions, in the order the forwards computed them (float32, CPU)."""
        if not self.chunks:
            raise RuntimeError("no forward ran inside recording_residual; nothing was recorded")
        return torch.cat(self.chunks, dim=0)


@contextmanager
def recording_residual(model, layer: int) -> Iterator[ResidualRecorder]:
    """Record ``blocks.{layer}.hook_resid_pre`` of every forward run inside the block (module docstring)."""
    n_layers = int(model.cfg.n_layers)
    if isinstance(layer, bool) or not isinstance(layer, int) or not -n_layers <= layer < n_layers:
        raise IndexError(f"layer {layer!r} is outside the model's layers (0..{n_layers - 1})")
    recorder = ResidualRecorder(layer % n_layers)

    def record(x, hook):
        if x.shape[0] != 1:
            raise ValueError(f"recording_residual records one sequence at a time, got a batch of {x.shape[0]}")
        recorder.chunks.append(x[0].detach().to(device="cpu", dtype=torch.float32))

    with activations_captured(model, [(BlockFamily.resid_pre(recorder.layer), record)]):
        yield recorder
