"""The identity that defines "exact" (docs/design.md §2), per block family and dtype.

The patched kept-only forward (BOS + query at its original position, every layer's
patch applied through hooks) must reproduce the contextual logits at every position.
"""
import pytest
import torch

import icl_lens
from icl_lens import token_patches, verify_equivalence
from icl_lens.model._block_family import block_family
from icl_lens.model._tiny_models import TINY_NAMES

# Longer than the tiny models' sliding windows (6), so the window masks are exercised.
PROMPT = "In-context learning: the cat sat on the mat, then the cat sat on the hat."
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", TINY_NAMES)
def test_tiny_families_exact(load, name, dtype):
    """One random tiny model per block family (tiny_models.py), built from its transformers config."""
    model = load(name, dtype)
    patches = token_patches(model, PROMPT)
    report = verify_equivalence(model, PROMPT, patches)
    bos = int(patches.kept_bos)  # Pythia and Qwen tokenizers prepend no BOS
    assert patches.n_positions == len(PROMPT.encode()) + bos
    assert report.max_abs_err.shape == (patches.n_positions,)
    assert report.relative_error <= TOLERANCE[dtype], report.to_frame().sort_values("max_abs_err").tail()
    # The patches are not trivially zero: removing context changes the computation (for a
    # parallel block the MLP input never changes, and the correction carries the effect).
    if block_family(model).parallel:
        assert patches.norms().abs().max() == 0 and patches.correction_norms()[:, 1 + bos:].min() > 0
    else:
        assert patches.norms()[:, 1 + bos:].min() > 0


@pytest.mark.parametrize("fixture", ["gemma", "smollm"])
def test_embedded_models_exact_float32(request, fixture):
    model = request.getfixturevalue(fixture)
    prompt = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
    patches = token_patches(model, prompt)
    report = verify_equivalence(model, prompt, patches)
    assert patches.kept_bos
    assert report.relative_error <= 1e-4
    assert torch.isfinite(patches.norms()).all()


@pytest.mark.parametrize("name", TINY_NAMES)
def test_context_ablation_exact(load, name):
    """Removing only tokens 5..9: every later token keeps the rest of its context."""
    model = load(name, torch.float64)
    prompt = PROMPT[:30]  # every query has its own kept set (one kept-only forward each): keep it short
    patches = token_patches(model, prompt, remove=range(5, 10))
    report = verify_equivalence(model, prompt, patches)
    assert report.relative_error <= 1e-9
    assert patches.kept_positions(12) == [0, 1, 2, 3, 4, 10, 11, 12]
    # Tokens before the removed span see their whole context: zero patch and correction.
    assert patches.norms()[:, :6].abs().max() == 0 and patches.correction_norms()[:, :6].abs().max() == 0
    # Tokens 10..14 lose context in some layer (later ones, in a model where every layer
    # slides over 6 tokens, no longer see 5..9 at all).
    assert patches.correction_norms()[:, 10:15].amax(0).min() > 0


def test_without_bos_exact(load):
    model = load("tiny-llama", torch.float64)
    patches = token_patches(model, PROMPT, keep_bos=False)
    assert not patches.kept_bos and patches.kept_positions(7) == [7]
    assert verify_equivalence(model, PROMPT, patches).relative_error <= 1e-9


def test_single_token_has_zero_patch_and_identity_holds(load):
    model = load("tiny-gemma3", torch.float64)
    patches = token_patches(model, [65])  # one token, no BOS: nothing to remove
    assert patches.n_positions == 1
    assert patches.norms().abs().max() == 0 and patches.correction_norms().abs().max() == 0
    assert verify_equivalence(model, [65], patches).relative_error <= 1e-12


@pytest.mark.parametrize("name", TINY_NAMES)
def test_one_pass_equals_the_naive_method_float64(load, name):
    """One forward with renormalised cached scores == one kept-only forward per query and layer."""
    from icl_lens.patches._token_patches import token_patches_naive

    model = load(name, torch.float64)
    prompt = PROMPT[:16]  # past the sliding windows of 6; the naive method costs a forward per query and layer
    fast = token_patches(model, prompt)
    naive = token_patches_naive(model, prompt)
    patched = (fast.norms() > 0) | (fast.correction_norms() > 0)  # positions that lost context
    assert patched[:, 2:].all()
    # A parallel block's patch is zero by definition (the naive method's is rounding noise):
    # it is compared on the scale of the corrections.
    floor = float(fast.correction.abs().max())
    for name_, f, n in (("u_in", fast.u_in, naive.u_in), ("u_gate", fast.u_gate, naive.u_gate),
                        ("correction", fast.correction, naive.correction), ("v", fast.v[patched], naive.v[patched])):
        if f is None:
            continue
        scale = max(float(f.abs().max()), floor) if block_family(model).parallel else float(f.abs().max())
        assert (f - n).abs().max() <= 1e-10 * scale, name_


FACTORS = ("delta", "v", "correction")


def _chunk_error(model, prompt, chunk: int | None, one=None) -> float:
    """Largest relative difference of the factors computed in chunks of ``chunk`` queries (None: the default) from
    those of one forward (``one``, computed when not given)."""
    one = token_patches(model, prompt, query_chunk=None) if one is None else one
    parts = token_patches(model, prompt) if chunk is None else token_patches(model, prompt, query_chunk=chunk)
    assert bool((parts.zero_input == one.zero_input).all())
    return max(float((getattr(parts, k) - getattr(one, k)).abs().max() / getattr(one, k).abs().max().clamp_min(1e-30))
               for k in FACTORS)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", TINY_NAMES)
def test_a_prompt_in_query_chunks_is_the_one_forward(load, name, dtype, monkeypatch):
    """A prompt longer than ``query_chunk`` runs in forwards of that many queries over the cached keys and values of
    the positions before them: the same factors as one forward, and the identity holds, its contextual side read in
    the same chunks. Chunks of 5 (inside the tiny models' sliding window of 6) and 16 (past it), over a prompt of 74
    characters."""
    from icl_lens.model._prompts import encode_prompt
    from icl_lens.patches import _token_patches

    model = load(name, dtype)
    ids = encode_prompt(model, PROMPT)
    whole = _token_patches._final_hidden(model, ids)
    for chunk in (5, 16):
        assert _chunk_error(model, PROMPT, chunk) <= {torch.float64: 1e-12, torch.float32: 1e-5}[dtype]
        monkeypatch.setattr(_token_patches, "QUERY_CHUNK", chunk)
        lengths = []  # the query positions of each forward the check's contextual side runs
        forward = model.forward
        model.forward = lambda x, *a, **k: lengths.append(x.shape[-1]) or forward(x, *a, **k)
        try:
            hidden = _token_patches._final_hidden(model, ids)
        finally:
            del model.forward
        assert max(lengths) == chunk and sum(lengths) == ids.numel(), lengths
        assert float((hidden - whole).abs().max()) <= {torch.float64: 1e-12, torch.float32: 1e-5}[dtype] * float(
            whole.abs().max())
        patches = token_patches(model, PROMPT, query_chunk=chunk)
        assert verify_equivalence(model, PROMPT, patches).relative_error <= TOLERANCE[dtype]
        norms = icl_lens.patch_norms(model, PROMPT, progress=False, query_chunk=chunk)
        assert torch.allclose(torch.tensor(norms["norm"].to_numpy()), patches.norms().double().reshape(-1),
                              rtol={torch.float64: 1e-10, torch.float32: 1e-4}[dtype], atol=0)


@pytest.mark.parametrize("fixture", ["gemma", "smollm"])
def test_embedded_models_in_query_chunks_float32(request, fixture):
    """Gemma 3 270M past its 512-token sliding window, and SmolLM2: 600 tokens in chunks of 256 give the one forward's
    factors up to float32 rounding (the identity itself is checked in chunks on every tiny family above); the default
    is a chunk of 512."""
    import inspect

    from icl_lens.patches import QUERY_CHUNK

    model = request.getfixturevalue(fixture)
    text = " ".join(f"item {i} is {i * 7 % 13};" for i in range(200))
    ids = model.to_tokens(text, truncate=False)[0][:600]
    assert ids.numel() == 600 > QUERY_CHUNK
    assert inspect.signature(token_patches).parameters["query_chunk"].default == QUERY_CHUNK
    one = token_patches(model, ids, query_chunk=None)
    assert _chunk_error(model, ids, 256, one) <= 1e-4
    assert _chunk_error(model, ids, None, one) <= 1e-4


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "512"])
def test_query_chunk_must_be_a_positive_count(load, bad):
    model = load("tiny-llama")
    with pytest.raises(ValueError, match="query_chunk must be a positive number of tokens or None"):
        token_patches(model, PROMPT, query_chunk=bad)
    with pytest.raises(ValueError, match="query_chunk"):
        icl_lens.patch_norms(model, PROMPT, progress=False, query_chunk=bad)
