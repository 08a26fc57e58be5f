"""Shared fixtures: real models, loaded once per test session.

Tiny random models cover each block family in float32 and float64; the embedded
Gemma 3 270M and SmolLM2-135M load offline from their PyPI packages (the first load
dequantises and caches them, later loads take seconds).
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
# Thought fits keep the preserve texts' covariances on disk (icl_lens.thought._preserved_keys): the suite keeps its
# own, new each run and shared by its fits, notebook kernels and CLI samples, never the user's.
if "ICL_LENS_PRESERVE_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["ICL_LENS_PRESERVE_CACHE"] = tempfile.mkdtemp(prefix="icl_lens_preserve_")
    atexit.register(shutil.rmtree, os.environ["ICL_LENS_PRESERVE_CACHE"], True)
# the cores shared by the suite's processes (pytest-xdist workers, `make test`), and by the kernels and CLI runs
# each starts (OMP_NUM_THREADS): one process per core does not oversubscribe them
_THREADS = max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
torch.set_num_threads(_THREADS)

TINY = ("tiny-gpt2", "tiny-llama", "tiny-gemma3")
EMBEDDED = ("gemma-3-270m", "smollm2-135m")


_MODELS: dict[tuple, object] = {}  # (name, dtype) -> the session's model
_GRAD_FLAGS: dict[tuple, dict[str, bool]] = {}  # each one's parameters' requires_grad as loaded


def cached_model(name: str, dtype: torch.dtype = torch.float32):
    key = (name, dtype)
    if key not in _MODELS:
        from icl_lens import load_model

        _MODELS[key] = model = load_model(name, dtype=dtype)
        _GRAD_FLAGS[key] = {n: p.requires_grad for n, p in model.named_parameters()}
    return _MODELS[key]


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


@pytest.fixture(autouse=True)
def _shared_models_left_as_found(request):
    """Every session-cached model is shared by the tests after this one: a library call must leave its parameters
    leaves with the gradient flag they were loaded with (a non-leaf or a flipped flag breaks the user's next
    training step, ``backward`` or fit)."""
    yield
    for key, model in _MODELS.items():
        bad = [n for n, p in model.named_parameters() if not p.is_leaf or p.requires_grad != _GRAD_FLAGS[key][n]]
        assert not bad, f"{request.node.nodeid} left {key[0]}'s parameters changed (non-leaf or gradient flag): {bad[:3]}"
