"""Shared fixtures: real models, loaded once per test session.

Tiny random models cover each block family in float32 and float64; the embedded
Gemma 3 270M and SmolLM2-135M load offline from their PyPI packages (the first load
dequantises and caches them, later loads take seconds).
"""
from __future__ import annotations

import functools
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

TINY = ("tiny-gpt2", "tiny-llama", "tiny-gemma3")
EMBEDDED = ("gemma-3-270m", "smollm2-135m")


@functools.lru_cache(maxsize=None)
def cached_model(name: str, dtype: torch.dtype = torch.float32):
    from icl_lens import load_model

    return load_model(name, dtype=dtype)


@pytest.fixture(scope="session")
def load():
    """``load(name, dtype=torch.float32)``: a session-cached TransformerBridge."""
    return cached_model


@pytest.fixture(scope="session")
def gemma():
    return cached_model("gemma-3-270m")


@pytest.fixture(scope="session")
def smollm():
    return cached_model("smollm2-135m")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one thread avoids the spin-wait cost of two on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def dash_factory():
    """``make(model, **kwargs)``: a dashboard with no debounce, closed after the test."""
    import icl_lens

    made = []

    def make(model, **kwargs):
        kwargs.setdefault("debounce_s", 0.0)
        d = icl_lens.dashboard(model, **kwargs)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()

