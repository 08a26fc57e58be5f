"""load_model keeps freed memory mapped between forwards (icl_lens.model._allocator): a repeated forward reuses the
last one's pages instead of faulting fresh ones, and the setting is read, refused and left alone as documented."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from icl_lens.model._allocator import DEFAULT_PAD_MB, PAD_ENV, on_glibc, pad_from_environment

GLIBC = on_glibc()

# A fresh process (the pad is set once per process, at the first load_model): SmolLM2 at 512 tokens, the minor page
# faults of a forward repeated after two (its logits, 100 MB, fit inside the default pad).
FORWARDS = r"""
import json, resource, torch
torch.set_num_threads(1)
from icl_lens import load_model
from icl_lens.model._allocator import keep_freed_memory
model = load_model("smollm2-135m")
ids = model.to_tokens("In the beginning the garden was quiet. " * 80, truncate=False)[0][:512]
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with torch.no_grad():
        model(ids[None])
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults(), faults()
print(json.dumps({"pad": keep_freed_memory(), "faults": min(faults() for _ in range(3))}))
"""


# A fresh process: after load_model, 16 blocks of 48 MiB held at once (768 MiB, more than the pad keeps free; only
# reserved, never touched): how many glibc mapped on their own (above the heap's end, the program break).
BLOCKS = r"""
import ctypes, json, torch
from icl_lens import load_model
load_model("tiny-gpt2")
sbrk = ctypes.CDLL(None).sbrk
sbrk.restype, sbrk.argtypes = ctypes.c_void_p, [ctypes.c_long]
blocks = [torch.empty(12 * 2**20) for _ in range(16)]
brk = sbrk(0)
print(json.dumps({"mapped": sum(b.data_ptr() > brk for b in blocks)}))
"""


def _fresh_process(script: str, **env) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in (PAD_ENV, "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", script], env={**clean, **env}, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="the pad is glibc's M_TOP_PAD; elsewhere load_model sets nothing")
def test_a_repeated_forward_reuses_the_last_ones_pages():
    page = resource.getpagesize()
    on, off = _fresh_process(FORWARDS), _fresh_process(FORWARDS, **{PAD_ENV: "0"})
    assert on["pad"] == DEFAULT_PAD_MB * 2**20 and off["pad"] is None
    # Without the pad, glibc hands the freed heap top back and each forward faults its activations afresh (here,
    # 130-390 MiB per forward); with it, next to nothing alone, and a few tens of MiB beside the suite's other
    # worker: at most 16 MiB, or half of what the same forward faults without the pad (a pad that does nothing: 3/4).
    assert on["faults"] * page <= 16 * 2**20 or 2 * on["faults"] <= off["faults"], (
        f"a repeated forward faulted {on['faults'] * page / 2**20:.0f} MiB of fresh pages with the pad "
        f"({off['faults'] * page / 2**20:.0f} MiB without)")


@pytest.mark.skipif(not GLIBC, reason="the mmap threshold is glibc's; elsewhere load_model sets nothing")
def test_a_block_the_pad_could_keep_comes_from_the_heap():
    # Setting the pad froze glibc's mmap threshold at 128 KiB, so a block the heap's free top could not hold was
    # mapped on its own and faulted in afresh each call (token_patches on SmolLM2 at 1,024 tokens: 0.14-0.5 million
    # faults per call). load_model raises the threshold to the pad: none is mapped (a pad alone: 6 of the 16; no pad:
    # all 16).
    assert _fresh_process(BLOCKS)["mapped"] == 0
    assert _fresh_process(BLOCKS, **{PAD_ENV: "0"})["mapped"] == 16


def test_the_pad_setting_is_read_refused_and_left_to_glibc_as_documented(monkeypatch):
    for name in (PAD_ENV, "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    assert pad_from_environment() == DEFAULT_PAD_MB * 2**20
    monkeypatch.setenv(PAD_ENV, "64")
    assert pad_from_environment() == 64 * 2**20
    monkeypatch.setenv(PAD_ENV, "0")
    assert pad_from_environment() is None
    for bad in ("lots", "-1", "4096"):
        monkeypatch.setenv(PAD_ENV, bad)
        with pytest.raises(ValueError, match=PAD_ENV):
            pad_from_environment()
    monkeypatch.setenv(PAD_ENV, "64")
    monkeypatch.setenv("MALLOC_TOP_PAD_", str(2**20))  # glibc's own setting stays
    assert pad_from_environment() is None
    monkeypatch.delenv("MALLOC_TOP_PAD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.top_pad=1048576")
    assert pad_from_environment() is None
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1048576")
    assert pad_from_environment() is None
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(2**20))
    assert pad_from_environment() is None


def test_the_docs_state_the_defaults_the_code_sets():
    """README's allocator paragraph and docs/design.md §2 name the pad and the query chunk by number; they must be
    the values load_model and token_patches use."""
    from pathlib import Path

    from icl_lens.patches import QUERY_CHUNK

    root = Path(__file__).parents[1]
    readme = " ".join((root / "README.md").read_text().split())
    design = " ".join((root / "docs" / "design.md").read_text().split())
    assert f"asks glibc to keep {DEFAULT_PAD_MB} MiB at the heap's top" in readme
    assert f"`token_patches` runs a long prompt in chunks of {QUERY_CHUNK} queries" in readme
    assert f"One prompt longer than `query_chunk` (default {QUERY_CHUNK})" in design
