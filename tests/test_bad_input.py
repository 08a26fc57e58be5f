"""Bad input gets a clear, specific error fast (and never NaN)."""
import time
import warnings

import pytest
import torch
from transformers import MixtralConfig

from icl_lens import (
    ModelNotFoundError,
    NonFiniteActivationError,
    PromptError,
    UnsupportedArchitectureError,
    ZeroNormWarning,
    load_model,
    token_patches,
)


@pytest.mark.parametrize("prompt", ["", "   \n\t"])
def test_empty_prompt(load, prompt):
    with pytest.raises(PromptError, match="empty"):
        token_patches(load("tiny-llama"), prompt)


def test_too_long_prompt_names_the_limit(load):
    model = load("tiny-llama")
    with pytest.raises(PromptError, match=r"at most 256"):
        token_patches(model, "x" * 300)


def test_unknown_model_offline_fails_fast_listing_embedded_names(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match="gemma-3-270m.*smollm2-135m"):
        load_model("no-such-org/no-such-model")
    assert time.perf_counter() - start < 5


def test_unsupported_architecture_lists_families(tmp_path):
    MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, num_local_experts=2, architectures=["MixtralForCausalLM"]).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedArchitectureError, match="gpt2.*llama.*gemma3"):
        load_model(str(tmp_path))


def test_zero_norm_activation_warns_and_stays_finite():
    model = load_model("tiny-llama")  # private copy: we damage it
    model.blocks[1].ln2.original_component.weight.data.zero_()
    with pytest.warns(ZeroNormWarning, match="layer 1 position"):
        patches = token_patches(model, "zero norm here")
    assert torch.isfinite(patches.norms()).all()
    assert patches.zero_input[1, 2:].all() and not patches.zero_input[0].any()
    assert patches.norms()[1].abs().max() == 0


def test_non_finite_activation_names_layer_and_position():
    model = load_model("tiny-gpt2")
    model.blocks[2].ln2.original_component.weight.data[3] = float("inf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NonFiniteActivationError, match="layer 2, position 0"):
            token_patches(model, "boom")


def test_bad_token_ids(load):
    model = load("tiny-gpt2")
    with pytest.raises(PromptError, match="lie in"):
        token_patches(model, [1, 2, 99999])
    with pytest.raises(PromptError, match="no tokens"):
        token_patches(model, [])


@pytest.mark.parametrize("layer, row", [(2, 0), (1, 5)])
def test_a_nan_in_an_mlp_weight_is_named_as_non_finite_weights(layer, row):
    """Issue 43: a NaN in a probed row of W_in was reported as "weights changed in place … recompute" (which fails
    forever), one in another row as a non-finite activation of the next layer."""
    from icl_lens import NonFiniteWeightsError
    from icl_lens.model import first_dense_weights

    model = load_model("tiny-llama")  # private copy: we damage it
    with torch.no_grad():
        first_dense_weights(model, layer)["in"][row, 3] = float("nan")
    with pytest.raises(NonFiniteWeightsError, match=rf"non-finite values \(NaN or inf\): layer {layer} W_in \(1 value\)"):
        token_patches(model, "The cat sat.")


def test_weights_turned_non_finite_after_the_patches_are_named_so():
    from icl_lens import NonFiniteWeightsError
    from icl_lens.model import first_dense_weights

    model = load_model("tiny-llama")
    patches = token_patches(model, "The cat sat.")
    with torch.no_grad():
        first_dense_weights(model, 0)["gate"][0, 0] = float("inf")
    with pytest.raises(NonFiniteWeightsError, match=r"layer 0 W_gate \(1 value\).*reload the model"):
        patches.u(0)


def _byte_tokenizer(folder):
    from icl_lens.model import save_byte_tokenizer

    return save_byte_tokenizer(folder)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_at_load(tmp_path):
    """Issue 43: it was accepted, and the first prompt with a high byte failed with "index out of range in self"."""
    from icl_lens import TokenizerMismatchError
    from icl_lens.model._tiny_models import build_tiny_model

    hf = build_tiny_model("tiny-gpt2")
    hf.resize_token_embeddings(200)
    message = r"has 259 token ids but the model's embedding has 200 rows: token ids 200\.\.258 have no embedding"
    with pytest.raises(TokenizerMismatchError, match=message):
        load_model(hf, _byte_tokenizer(tmp_path / "tok"))
    hf.save_pretrained(tmp_path / "saved")
    _byte_tokenizer(tmp_path / "saved")
    with pytest.raises(TokenizerMismatchError, match=message):
        load_model(tmp_path / "saved")
