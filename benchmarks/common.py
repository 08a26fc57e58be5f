"""Shared helpers for the benchmark scripts: prompts of exact length, timing, peak memory."""
from __future__ import annotations

import statistics
import threading
import time
from contextlib import contextmanager

import psutil
import torch

TEXT = (
    "In-context learning lets a language model adapt to a task from examples in its prompt. "
    "The model reads a few input and output pairs, then continues the pattern for a new input, "
    "without any change to its weights. Researchers have asked how this works, and one answer is "
    "that each token of context acts like a small update to the weights of the next layer. "
)


def prompt_ids(model, n_tokens: int) -> torch.Tensor:
    """Exactly ``n_tokens`` token ids (BOS first) of natural English text."""
    ids = model.to_tokens(TEXT * (1 + n_tokens // 40), truncate=False)[0]
    while ids.numel() < n_tokens:
        ids = torch.cat([ids, ids[1:]])
    return ids[:n_tokens]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_it(fn, *, device: str = "cpu", repeats: int = 3, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextmanager
def peak_memory(device: str = "cpu"):
    """Yields a dict whose ``"mb"`` is the peak memory above the start during the block.

    CUDA: ``torch.cuda.max_memory_allocated``. CPU: resident set size sampled every 2 ms.
    """
    result = {"mb": 0.0}
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        yield result
        result["mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        return
    proc, stop, peak = psutil.Process(), threading.Event(), [0]
    base = proc.memory_info().rss

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        stop.set()
        thread.join()
        result["mb"] = max(0, peak[0] - base) / 2**20
