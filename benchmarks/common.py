"""Shared helpers for the benchmark scripts: prompts of exact length, timing, peak memory, JSON beside Markdown."""
from __future__ import annotations

import ctypes
import gc
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout root, for experiments.report
from experiments.report import write_json  # noqa: F401 (the benchmarks' JSON beside each fragment)

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


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_it(fn, *, device: str = "cpu", repeats: int = 3, warmup: int = 1, clock: str = "wall") -> float:
    """Median time of ``fn()`` in seconds: wall time, or (``clock="cpu"``) this process's CPU time over all
    its threads, which other jobs on a shared machine inflate far less than wall time (CPU devices only)."""
    return time_rounds({"fn": fn}, device=device, repeats=repeats, warmup=warmup, clock=clock)["fn"]


def time_rounds(fns: dict, *, device: str = "cpu", repeats: int = 3, warmup: int = 1,
                clock: str = "wall") -> dict[str, float]:
    """Median time of each of ``fns`` (name -> callable), called in rounds (one call of each per round, the same
    order every round) so that a load that drifts during the run falls on all of them alike."""
    if clock == "cpu" and device.startswith("cuda"):
        raise ValueError("clock='cpu' measures CPU work; time a GPU with clock='wall'")
    now = CLOCKS[clock]
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            start = now()
            fn()
            sync(device)
            times[name].append(now() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


# glibc's settings are left as load_model sets them (icl_lens.model._allocator), so the benchmarks time what users
# get; each memory reading starts from malloc_trim (peak_memory), which hands back the freed memory the pad keeps.
_LIBC = _libc()


def status_kib(field: str) -> float:
    """A field of ``/proc/self/status`` in KiB (``VmRSS``, ``VmHWM``), NaN where there is none."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    return float("nan")


def reset_peak_rss() -> bool:
    """Reset the process's peak RSS (``VmHWM``) to its current RSS (Linux ``/proc/self/clear_refs``, "5"); False
    where that is not supported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def trim_heap() -> None:
    """Hand the C heap's freed memory back to the kernel (glibc's ``malloc_trim``; nothing elsewhere)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


@contextmanager
def peak_memory(device: str = "cpu"):
    """Yields a dict whose ``"mb"`` is the peak memory of the block above its start (MiB).

    CUDA: the allocator's own counter, reset first (``torch.cuda.reset_peak_memory_stats``,
    ``max_memory_allocated`` minus the allocated memory at the start). CPU: the process's
    peak resident set (``VmHWM``), reset to the current RSS through ``/proc/self/clear_refs``
    ("5") after freed memory is handed back (``gc.collect``, ``malloc_trim``), minus the RSS
    at the start. ``tracemalloc`` is no use here: torch's CPU tensors are allocated by the C
    allocator, which ``tracemalloc`` does not see (it reports ~0 for a 200 MB tensor).
    """
    result = {"mb": float("nan")}
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        yield result
        torch.cuda.synchronize()
        result["mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        return
    trim_heap()
    if not reset_peak_rss():
        yield result
        return
    base = status_kib("VmRSS")
    yield result
    result["mb"] = max(0.0, status_kib("VmHWM") - base) / 1024


def measure(fn, *, device: str = "cpu", repeats: int = 3, warmup: int = 1, clock: str = "wall") -> tuple[float, float]:
    """Median time of ``fn()`` (:func:`time_it`) and the peak memory of one more call (MiB, :func:`peak_memory`)."""
    seconds = time_it(fn, device=device, repeats=repeats, warmup=warmup, clock=clock)
    with peak_memory(device) as mem:
        fn()
    return seconds, mem["mb"]


def flops(fn) -> float:
    """Matrix-product operations of one call of ``fn()``, counted op by op by torch's own counter
    (``torch.utils.flop_counter.FlopCounterMode``: matrix products and fused attention, 2 per multiply-add;
    element-wise operations are not counted).
    The ratio of two counts is the ratio their arithmetic alone would give; a time ratio above it is overhead."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def op_times(fn, device: str = "cpu") -> dict[str, tuple[float, int]]:
    """Self time (seconds) and call count of every torch operator in one call of ``fn()``, from torch's profiler
    (``torch.profiler``; on CUDA its device time). Two calls' tables, subtracted, show which operators one does
    more of than the other (:func:`op_difference`)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    return {e.key: (getattr(e, attr) / 1e6, e.count) for e in prof.key_averages() if getattr(e, attr) > 0}


def op_difference(a: dict, b: dict, top: int = 6) -> list[dict]:
    """The ``top`` operators whose self time differs most between :func:`op_times` tables ``a`` and ``b``."""
    keys = sorted(set(a) | set(b), key=lambda k: -abs(a.get(k, (0.0, 0))[0] - b.get(k, (0.0, 0))[0]))
    return [{"op": k, "seconds": a.get(k, (0.0, 0))[0], "calls": a.get(k, (0.0, 0))[1],
             "seconds_other": b.get(k, (0.0, 0))[0], "calls_other": b.get(k, (0.0, 0))[1]} for k in keys[:top]]
