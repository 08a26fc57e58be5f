"""Factors on demand: a patch set keeps only d_model-sized data and forms u = W δ from the model's
dense weights when asked; it refuses weights that are not the ones it was made from; version-1 files
(u stored) still load."""
import pathlib

import pytest
import torch

import icl_lens
from icl_lens import StaleWeightsError, TokenPatches, token_patches
from icl_lens.core._factored import gram_cosine, patch_norm
from icl_lens.model._block_family import first_dense_weights

DATA = pathlib.Path(__file__).parent / "data"
PROMPT = "The cat sat on the mat, then the cat sat."


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_u_on_demand_is_w_delta_and_norms_come_from_r(load, name):
    model = load(name, torch.float64)
    p = token_patches(model, PROMPT)
    d_model = model.cfg.d_model
    held = [p.delta, p.v, p.correction]
    assert all(t.shape[-1] == d_model for t in held) and p.stored_u_in is None  # nothing d_mlp wide is kept
    for layer in range(p.n_layers):
        w = first_dense_weights(model, layer)
        u_in, u_gate = p.u(layer)
        assert torch.allclose(u_in, p.delta[layer] @ w["in"].T, rtol=0, atol=1e-12)
        assert (u_gate is None) == ("gate" not in w)
        index = torch.tensor([[3, 1], [0, 5]])
        assert torch.equal(p.u(layer, index)[0], u_in[index])
        # ‖[u_gate; u_in]‖ and every inner product from R δ (d_model wide), equal to the ones of u.
        assert torch.allclose(gram_cosine(p.u_coordinates(layer), p.v[layer]),
                              gram_cosine(p.stacked_u(layer), p.v[layer]), atol=1e-10)
    expected = patch_norm(p.stacked_u(), p.v)
    assert torch.allclose(p.norms(), expected, rtol=1e-10, atol=1e-12)
    assert float(expected[:, 2:].min()) > 0


def test_patches_refuse_weights_edited_in_place_or_of_another_model():
    model = icl_lens.load_model("tiny-llama", dtype=torch.float64)  # a model of this test only: it gets edited
    p = token_patches(model, PROMPT)
    p.u(0)  # fine while the weights are the ones the patches were made from
    other = icl_lens.load_model("tiny-llama", dtype=torch.float64)
    with torch.no_grad():
        for w in first_dense_weights(other, 1).values():
            w.mul_(1.01)
    with pytest.raises(StaleWeightsError, match="not the ones"):
        p.with_weights(icl_lens.dense_weights(other))
    assert p.with_weights(icl_lens.dense_weights(model)) is not None  # its own weights are accepted
    w_in = first_dense_weights(model, 0)["in"]
    with torch.no_grad():
        w_in[0, 0] += 1.0  # in place: the version counter moves
    with pytest.raises(StaleWeightsError, match="changed in place"):
        p.u(0)
    with torch.no_grad():
        w_in[0, 0] -= 1.0
    q = token_patches(model, PROMPT)  # new patches, new weights reference
    q.u(0)
    w_in.data[-1, 3] += 1.0  # through .data: no version bump, caught by the probe rows
    with pytest.raises(StaleWeightsError):
        q.u(0)


def test_file_from_one_model_refuses_another_models_weights(load, tmp_path):
    model = load("tiny-llama", torch.float64)
    path = token_patches(model, PROMPT).save(tmp_path / "p.safetensors")
    assert TokenPatches.load(path, weights=icl_lens.dense_weights(model)).u(0)[0].shape[-1] == model.cfg.d_mlp
    other = icl_lens.load_model("tiny-llama", dtype=torch.float64)
    with torch.no_grad():
        first_dense_weights(other, 2)["gate"].add_(1e-3)
    with pytest.raises(StaleWeightsError, match="not the ones"):
        TokenPatches.load(path, weights=icl_lens.dense_weights(other))


def test_version_1_file_still_loads_equal(load):
    """tests/data/patches_v1_tiny_llama.safetensors: written by the version-1 code (u stored), 'abc abc', float32."""
    old = TokenPatches.load(DATA / "patches_v1_tiny_llama.safetensors")
    new = token_patches(load("tiny-llama"), "abc abc")
    assert old.tokens == new.tokens and torch.equal(old.token_ids, new.token_ids) and old.stores_u
    # float32, written on another machine: sums of up to d_mlp products round differently from one CPU's kernels
    # to another's (measured up to 6e-7 of a field's largest value), so the tolerance scales with that value.
    for field in ("u_in", "u_gate", "v", "correction"):
        a, b = getattr(old, field), getattr(new, field)
        assert torch.allclose(a, b, rtol=1e-5, atol=2e-6 * float(a.abs().max())), field
    assert torch.allclose(old.norms(), new.norms(), rtol=1e-5, atol=1e-6)
    assert torch.equal(old.zero_input, new.zero_input) and torch.equal(old.kept, new.kept)


def test_dense_weights_follow_a_swapped_weight_tensor():
    """``functional_call`` (explicit SGD) swaps a module's weight for another tensor for a while; weights
    cached meanwhile must not outlive the swap (they were the model's only then)."""
    from icl_lens.model._block_family import first_dense_modules, original
    from icl_lens.patches._capture import dense_weights

    model = icl_lens.load_model("tiny-llama", dtype=torch.float64)
    module = original(first_dense_modules(model, 0)["in"])
    real = module.weight
    module.weight = torch.nn.Parameter(real.detach() * 2)  # the swap
    assert dense_weights(model).layer(0)["in"].data_ptr() == module.weight.data_ptr()
    module.weight = real  # restored, as functional_call does
    assert dense_weights(model).layer(0)["in"].data_ptr() == real.data_ptr()
