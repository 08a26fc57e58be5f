"""Freed memory stays mapped between forwards (glibc's ``M_TOP_PAD`` and ``M_MMAP_THRESHOLD``), so a forward does
not page-fault afresh.

A forward allocates its activations and frees them before the next call. glibc hands the free top of its heap back
to the kernel whenever more than its trim threshold lies there, so the next forward's activations land on fresh
pages: each page costs a minor fault and the kernel's zeroing of it, in system time. ``mallopt(M_TOP_PAD, pad)``
makes glibc keep ``pad`` bytes at the heap's top when it trims (and ask for them when it grows), so a repeated
forward reuses the pages of the last one.

Setting the pad also freezes glibc's mmap threshold (which it would otherwise raise, up to 32 MiB, as large blocks
are freed) where it stands, 128 KiB on a fresh process: a block above it that the heap's free top cannot hold is
mapped on its own, faulted in, and unmapped when freed, every call. SmolLM2's attention scores at 1,024 tokens are
36 MiB; ``token_patches``, whose kept factors take room at the heap's top, faulted 0.14-0.5 million pages per call
with the pad alone. So the threshold is set to the pad as well: a block the pad could keep comes from the heap.
Measured, a forward with and without it in one process
(``benchmarks/bench_allocator.py``, ``BENCHMARKS.md``): most of SmolLM2's system time at 1,024 tokens is these
faults.

What it costs: up to ``pad`` bytes of freed memory stay resident (they count in RSS) instead of going back to the
kernel until the process ends, and the peak resident set rises: freed blocks below the heap's top stay resident
until a later call reuses them (``malloc_trim`` hands them back), most on long prompts, whose attention scores are
blocks of hundreds of MiB (Gemma 3 at 4,096 tokens, the same benchmark at ``--lengths 4096``: a plain forward in
0.8x the time, its peak about 0.7 GiB higher; ``token_patches``, which runs such a prompt in query chunks, in 0.7x
the time, its peak about 60 MiB higher). A block larger than the pad is still mapped, faulted in and unmapped on its
own, each time: Gemma 3's full-vocabulary logits of a long prompt, and a plain forward's 576 MiB attention scores on
SmolLM2 at 4,096 tokens, where most of the forward's time is then the kernel's (a larger pad serves those from the
heap too, for gigabytes more at the peak).

:func:`load_model` applies it once per process (:func:`keep_freed_memory`), with the pad
``$ICL_LENS_TOP_PAD_MB`` (default :data:`DEFAULT_PAD_MB`; ``0`` leaves glibc's default). Where the environment
sets glibc's own top pad or mmap threshold (``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_THRESHOLD_``, or ``GLIBC_TUNABLES``
``glibc.malloc.top_pad`` / ``glibc.malloc.mmap_threshold``), glibc's settings stay; elsewhere than glibc (macOS, musl)
nothing is done.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform

PAD_ENV = "ICL_LENS_TOP_PAD_MB"
DEFAULT_PAD_MB = 512
GLIBC_DEFAULT_PAD = 128 * 1024  # glibc's M_TOP_PAD, and its first M_MMAP_THRESHOLD, when nothing sets them (mallopt(3))
_M_TOP_PAD, _M_MMAP_THRESHOLD = -2, -3  # <malloc.h>
_GLIBC_OWN = {"MALLOC_TOP_PAD_": "glibc.malloc.top_pad", "MALLOC_MMAP_THRESHOLD_": "glibc.malloc.mmap_threshold"}


def pad_from_environment() -> int | None:
    """The pad in bytes that :func:`keep_freed_memory` sets: ``$ICL_LENS_TOP_PAD_MB`` (default
    :data:`DEFAULT_PAD_MB`), or None when it is 0 or glibc's own variables set a top pad or mmap threshold."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(variable in os.environ or tunable in tunables for variable, tunable in _GLIBC_OWN.items()):
        return None
    raw = os.environ.get(PAD_ENV, "").strip()
    try:
        mb = int(raw) if raw else DEFAULT_PAD_MB
    except ValueError:
        raise ValueError(f"{PAD_ENV} must be a whole number of MB (0 turns the pad off), got {raw!r}") from None
    if not 0 <= mb < 2048:  # mallopt takes a C int
        raise ValueError(f"{PAD_ENV} must be between 0 and 2047 MB (0 turns the pad off), got {mb}")
    return mb * 2**20 or None


@functools.cache
def on_glibc() -> bool:
    """Whether this process runs on glibc (Linux), whose ``mallopt`` settings this module sets."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def set_top_pad(pad: int) -> bool:
    """``mallopt(M_TOP_PAD, pad)`` and ``mallopt(M_MMAP_THRESHOLD, pad)`` on glibc (:data:`GLIBC_DEFAULT_PAD`: glibc's
    first values of both); False where there is no glibc or it refused."""
    if not on_glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(option, int(pad)) == 1 for option in (_M_TOP_PAD, _M_MMAP_THRESHOLD))


@functools.cache  # once per process (an environment that raises is read again on the next call)
def keep_freed_memory() -> int | None:
    """Set the process's top pad from the environment (:func:`pad_from_environment`), the first time only; the pad
    in bytes that this process runs with because of it, or None (off, glibc's own setting, not glibc)."""
    pad = pad_from_environment()
    return pad if pad is not None and set_top_pad(pad) else None
