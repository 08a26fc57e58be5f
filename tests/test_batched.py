"""Many prompts at once: every row of a padded batch equals its single-prompt result;
norms without factors equal the factors' norms; the patch file round-trips exactly."""
import numpy as np
import pandas as pd
import pytest
import torch

import icl_lens
from icl_lens import TokenPatches, patch_norms, token_patches
from icl_lens.patches._dense_weights import StaleWeightsError
from icl_lens.patches._patch_set import PatchFileError

# Different lengths (padding), one id tensor without BOS (its row keeps no BOS), one past
# tiny-gemma3's sliding window of 6, one single token.
PROMPTS = [
    "The cat sat on the mat, then the cat sat on the hat.",
    "hi",
    torch.tensor([70, 71, 72, 73, 74, 75, 76, 77, 78]),
    "A longer prompt, long enough to run past every sliding window.",
    [66],
]
FIELDS = ("delta", "u_in", "u_gate", "v", "correction")
RTOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-gemma3"])
def test_batched_rows_equal_single_prompts(load, name, dtype):
    model = load(name, dtype)
    batched = token_patches(model, PROMPTS, batch_size=3)
    assert isinstance(batched, list) and len(batched) == len(PROMPTS)
    for prompt, got in zip(PROMPTS, batched):
        single = token_patches(model, prompt)
        assert got.tokens == single.tokens and torch.equal(got.token_ids, single.token_ids)
        assert got.kept_bos == single.kept_bos and torch.equal(got.kept, single.kept)
        assert torch.equal(got.zero_input, single.zero_input)
        for field in FIELDS:
            a, b = getattr(got, field), getattr(single, field)
            if b is None:
                assert a is None
                continue
            assert a.shape == b.shape and a.dtype == b.dtype
            assert _relative(a, b) <= RTOL[dtype], (field, prompt)
    assert batched[0].kept_bos and not batched[2].kept_bos  # per-row BOS handling
    assert batched[0].norms()[:, 2:].min() > 0


def test_batched_removal_and_equivalence(load):
    model = load("tiny-llama", torch.float64)
    prompts = PROMPTS[:2] + PROMPTS[3:4]
    batched = token_patches(model, [prompts[0], prompts[2]], remove=range(1, 3), batch_size=2)
    for prompt, got in zip([prompts[0], prompts[2]], batched):
        single = token_patches(model, prompt, remove=range(1, 3))
        assert torch.equal(got.kept, single.kept)
        assert _relative(got.u_in, single.u_in) <= 1e-10
        assert icl_lens.verify_equivalence(model, prompt, got).relative_error <= 1e-9


def test_embedded_batched_rows_equal_single_prompts(gemma):
    prompts = ["The capital of France is Paris. The capital of Italy is", "Two plus two is", "Hello"]
    batched = token_patches(gemma, prompts, batch_size=3)
    for prompt, got in zip(prompts, batched):
        single = token_patches(gemma, prompt)
        for field in FIELDS:
            assert _relative(getattr(got, field), getattr(single, field)) <= 1e-5, field


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-gemma3"])
def test_patch_norms_equal_the_factors_norms(load, name, dtype):
    model = load(name, dtype)
    frame = patch_norms(model, PROMPTS, batch_size=2, progress=False)
    assert list(frame.columns) == ["prompt", "layer", "position", "token", "norm", "correction_norm"]
    expected = pd.concat([token_patches(model, p).to_frame().assign(prompt=i) for i, p in enumerate(PROMPTS)],
                         ignore_index=True)
    assert len(frame) == len(expected)
    for col in ("prompt", "layer", "position", "token"):
        assert (frame[col].to_numpy() == expected[col].to_numpy()).all(), col
    for col in ("norm", "correction_norm"):
        err = np.abs(frame[col].to_numpy() - expected[col].to_numpy()).max() / expected[col].abs().max()
        assert err <= RTOL[dtype], col
    assert (frame.norm > 0).any()


def test_patch_norms_layer_subset(load):
    model = load("tiny-gemma3", torch.float64)
    frame = patch_norms(model, PROMPTS[:2], layers=[1, -1], progress=False)
    assert sorted(frame.layer.unique()) == [1, 3]
    full = patch_norms(model, PROMPTS[:2], progress=False)
    merged = frame.merge(full, on=["prompt", "layer", "position"], suffixes=("", "_all"))
    assert len(merged) == len(frame)
    assert np.allclose(merged.norm, merged.norm_all, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="layers must be in"):
        patch_norms(model, PROMPTS[:1], layers=[7], progress=False)


def test_bad_prompt_in_a_list_is_named(load):
    model = load("tiny-llama")
    with pytest.raises(icl_lens.PromptError, match="prompt 1"):
        token_patches(model, ["fine", "   "])
    with pytest.raises(icl_lens.PromptError, match="empty"):
        patch_norms(model, [], progress=False)


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_save_load_round_trip(load, name, tmp_path):
    model = load(name, torch.float64)
    patches = [token_patches(model, PROMPTS[0]), token_patches(model, PROMPTS[2], remove=[1, 2]),
               token_patches(model, PROMPTS[0], keep_bos=False)]
    weights = icl_lens.dense_weights(model)
    for i, p in enumerate(patches):
        path = p.save(tmp_path / f"p{i}.safetensors")
        back = TokenPatches.load(path)  # without the model: δ, v, correction, norms
        assert back.model_name == p.model_name and back.tokens == p.tokens and back.kept_bos == p.kept_bos
        assert back.gated == p.gated
        for field in ("delta", "v", "correction", "token_ids", "kept", "zero_input"):
            a, b = getattr(back, field), getattr(p, field)
            assert a.dtype == b.dtype and torch.equal(a, b), field
        assert torch.equal(back.norms(), p.norms()) and back.stored_u_in is None
        with pytest.raises(StaleWeightsError, match="loaded without the model"):
            back.u(0)
        attached = TokenPatches.load(path, weights=weights)  # u formed from δ with the model's weights
        u_with = TokenPatches.load(p.save(tmp_path / f"u{i}.safetensors", with_u=True))  # u stored
        for got in (attached, u_with, back.with_weights(weights)):
            for field in ("u_in", "u_gate"):
                a, b = getattr(got, field), getattr(p, field)
                assert (a is None and b is None) or (a.dtype == b.dtype and torch.equal(a, b)), field
    shard = TokenPatches.save_many({"a": patches[0], "b": patches[1]}, tmp_path / "shard.safetensors")
    assert torch.equal(TokenPatches.load(shard, key="b").kept, patches[1].kept)
    assert set(TokenPatches.load_many(shard)) == {"a", "b"}
    with pytest.raises(PatchFileError, match="holds 2 patch sets"):
        TokenPatches.load(shard)
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(PatchFileError):
        TokenPatches.load(tmp_path / "junk.safetensors")
