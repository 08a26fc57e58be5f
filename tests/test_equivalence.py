"""The identity that defines "exact" (docs/design.md §2), per block family and dtype.

The patched kept-only forward (BOS + query at its original position, every layer's
patch applied through hooks) must reproduce the contextual logits at every position.
"""
import pytest
import torch

from icl_lens import token_patches, verify_equivalence

# Longer than tiny-gemma3's sliding window (6), so the window mask is exercised.
PROMPT = "In-context learning: the cat sat on the mat, then the cat sat on the hat."
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-gemma3"])
def test_tiny_families_exact(load, name, dtype):
    model = load(name, dtype)
    patches = token_patches(model, PROMPT)
    report = verify_equivalence(model, PROMPT, patches)
    assert patches.n_positions == len(PROMPT.encode()) + 1  # byte tokens + BOS
    assert report.max_abs_err.shape == (patches.n_positions,)
    assert report.relative_error <= TOLERANCE[dtype], report.to_frame().sort_values("max_abs_err").tail()
    # The patches are not trivially zero: removing context changes the computation.
    assert patches.norms()[:, 2:].min() > 0


@pytest.mark.parametrize("fixture", ["gemma", "smollm"])
def test_embedded_models_exact_float32(request, fixture):
    model = request.getfixturevalue(fixture)
    prompt = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
    patches = token_patches(model, prompt)
    report = verify_equivalence(model, prompt, patches)
    assert patches.kept_bos
    assert report.relative_error <= 1e-4
    assert torch.isfinite(patches.norms()).all()


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-gemma3"])
def test_context_ablation_exact(load, name):
    """Removing only tokens 5..9: every later token keeps the rest of its context."""
    model = load(name, torch.float64)
    patches = token_patches(model, PROMPT, remove=range(5, 10))
    report = verify_equivalence(model, PROMPT, patches)
    assert report.relative_error <= 1e-9
    assert patches.kept_positions(12) == [0, 1, 2, 3, 4, 10, 11, 12]
    # Tokens before the removed span see their whole context: zero patch.
    assert patches.norms()[:, :6].abs().max() == 0


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


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-gemma3"])
def test_one_pass_equals_the_naive_method_float64(load, name):
    """One forward with renormalised cached scores == one kept-only forward per query and layer."""
    from icl_lens.model.capture import token_patches_naive

    model = load(name, torch.float64)
    prompt = PROMPT[:40]  # 41 tokens: still past tiny-gemma3's sliding window of 6
    fast = token_patches(model, prompt)
    naive = token_patches_naive(model, prompt)
    patched = fast.norms() > 0
    assert patched[:, 2:].all()
    for name_, f, n in (("u_in", fast.u_in, naive.u_in), ("u_gate", fast.u_gate, naive.u_gate),
                        ("correction", fast.correction, naive.correction), ("v", fast.v[patched], naive.v[patched])):
        if f is None:
            continue
        assert (f - n).abs().max() <= 1e-10 * f.abs().max(), name_
