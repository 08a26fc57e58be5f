"""Experiment 5 — memory and time per token as the context grows (McDermott, Heath, Parhi 2026, arXiv 2606.25342).

Token-by-token decoding: softmax attention keeps every key and value (a cache that grows
by ``2 · d_model`` numbers per layer and token), the parametric layers keep a fixed state
(linear attention ``(S, ζ)``, delta rule ``S``, GRU ``h``). We decode one long stream of
regression tokens and record, at each checkpoint length ``T``, the bytes held in the
state (measured from the tensors) and the minimum and median wall time per token over the
``window`` tokens before ``T`` (the minimum is the least disturbed by other jobs). :func:`decode_matches_forward` checks the decoding path
against the parallel forward.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd
import torch

from icl_lens.lab._checkpoints import load_lab_model
from icl_lens.lab._mixers import ARCHITECTURES
from icl_lens.lab._model import RegressionModel
from icl_lens.lab._tasks import sample_prompts


@torch.no_grad()
def decode_matches_forward(model: RegressionModel, tokens: torch.Tensor) -> float:
    """Max relative difference between token-by-token decoding and the parallel forward (one prompt batch)."""
    tokens = model.check_tokens(tokens)
    full = model(tokens)
    states = model.init_state(tokens.shape[0], tokens.shape[1])
    outs = []
    for t in range(tokens.shape[1]):
        y, states = model.step(tokens[:, t], states)
        outs.append(y)
    return float((torch.stack(outs, 1) - full).abs().max() / full.abs().max())


@dataclass(frozen=True, eq=False)
class MemoryCostResult:
    """Rows per (arch, context length): state bytes and microseconds per token."""

    rows: tuple[dict, ...]
    threads: int

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.rows))

    def bytes_at(self, arch: str, length: int) -> int:
        return next(r["state_bytes"] for r in self.rows if r["arch"] == arch and r["context_length"] == length)


@torch.no_grad()
def memory_and_cost(archs=ARCHITECTURES, *, lengths=(16, 64, 256, 1024, 4096), window: int = 32,
                    seed: int = 5) -> MemoryCostResult:
    """Decode ``max(lengths)`` tokens per architecture (batch 1, float32) and measure state and time."""
    if min(lengths) < window:
        raise ValueError(f"every length must be ≥ window={window}")
    rows = []
    n = max(lengths)
    for arch in archs:
        model = load_lab_model(arch)
        tokens = sample_prompts(1, n - 1, model.cfg.d_x, generator=torch.Generator().manual_seed(seed)).tokens
        states = model.init_state(1, n)
        times = torch.zeros(n, dtype=torch.float64)
        for t in range(n):
            start = time.perf_counter()
            _, states = model.step(tokens[:, t], states)
            times[t] = time.perf_counter() - start
            if t + 1 in lengths:
                rows.append({"arch": arch, "context_length": t + 1, "state_bytes": model.state_bytes(states),
                             "us_per_token_min": float(times[t + 1 - window: t + 1].min() * 1e6),
                             "us_per_token_median": float(times[t + 1 - window: t + 1].median() * 1e6)})
    return MemoryCostResult(tuple(rows), torch.get_num_threads())
