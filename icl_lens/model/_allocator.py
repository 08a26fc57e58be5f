"""Freed memory stays mapped between forwards (glibc's ``M_TOP_PAD``), so a forward does not page-fault afresh.

A forward allocates its activations and frees them before the next call. glibc hands the free top of its heap back
to the kernel whenever more than its trim threshold lies there, so the next forward's activations land on fresh
pages: each page costs a minor fault and the kernel's zeroing of it, in system time. ``mallopt(M_TOP_PAD, pad)``
makes glibc keep ``pad`` bytes at the heap's top when it trims (and ask for them when it grows), so a repeated
forward reuses the pages of the last one. Measured, a forward with and without it in one process
(``benchmarks/bench_allocator.py``, ``BENCHMARKS.md``): most of SmolLM2's system time at 1,024 tokens is these
faults.

What it costs: up to ``pad`` bytes of freed memory stay resident (they count in RSS) instead of going back to the
kernel until the process ends, and the peak resident set can rise a little (the same benchmark measures both). An
allocation larger than the free room at the heap's top (Gemma 3's full-vocabulary logits of a long prompt) is still
mapped and unmapped on its own, with or without the pad.

:func:`load_model` applies it once per process (:func:`keep_freed_memory`), with the pad
``$ICL_LENS_TOP_PAD_MB`` (default :data:`DEFAULT_PAD_MB`; ``0`` leaves glibc's default). Where the environment
sets glibc's own ``MALLOC_TOP_PAD_`` or ``GLIBC_TUNABLES`` ``glibc.malloc.top_pad``, that one stays; elsewhere than
glibc (macOS, musl) nothing is done.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform

PAD_ENV = "ICL_LENS_TOP_PAD_MB"
DEFAULT_PAD_MB = 512
GLIBC_DEFAULT_PAD = 128 * 1024  # glibc's M_TOP_PAD when nothing sets it (mallopt(3))
_M_TOP_PAD = -2  # <malloc.h>


def pad_from_environment() -> int | None:
    """The pad in bytes that :func:`keep_freed_memory` sets: ``$ICL_LENS_TOP_PAD_MB`` (default
    :data:`DEFAULT_PAD_MB`), or None when it is 0 or glibc's own variables set one."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "MALLOC_TOP_PAD_" in os.environ or "glibc.malloc.top_pad" in tunables:
        return None
    raw = os.environ.get(PAD_ENV, "").strip()
    try:
        mb = int(raw) if raw else DEFAULT_PAD_MB
    except ValueError:
        raise ValueError(f"{PAD_ENV} must be a whole number of MB (0 turns the pad off), got {raw!r}") from None
    if not 0 <= mb < 2048:  # mallopt takes a C int
        raise ValueError(f"{PAD_ENV} must be between 0 and 2047 MB (0 turns the pad off), got {mb}")
    return mb * 2**20 or None


def set_top_pad(pad: int) -> bool:
    """``mallopt(M_TOP_PAD, pad)`` on glibc; False where there is no glibc or it refused."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_TOP_PAD, int(pad)) == 1


@functools.cache  # once per process (an environment that raises is read again on the next call)
def keep_freed_memory() -> int | None:
    """Set the process's top pad from the environment (:func:`pad_from_environment`), the first time only; the pad
    in bytes that this process runs with because of it, or None (off, glibc's own setting, not glibc)."""
    pad = pad_from_environment()
    return pad if pad is not None and set_top_pad(pad) else None
