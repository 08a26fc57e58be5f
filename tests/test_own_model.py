"""Your own model: an HF model object and a bridge you built give the loader's exact patches;
processed weights are refused (or accepted with a warning); nothing is written onto the model."""
import inspect

import pytest
import torch
import transformers
from transformer_lens.model_bridge import TransformerBridge, transformer_bridge
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import icl_lens
from icl_lens import (
    NotABridgeError,
    ProcessedWeightsError,
    ProcessedWeightsWarning,
    load_model,
    patch_norms,
    token_patches,
    trajectory,
    verify_equivalence,
)
from icl_lens.model._byte_tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, save_byte_tokenizer
from icl_lens.model._loading import OwnModelError

PROMPT = "abc abd abc ab"
SEED = 7


def llama(dtype=torch.float32) -> transformers.LlamaForCausalLM:
    """A seeded tiny Llama with random norm gains (so folding a gain changes the weights)."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, hidden_size=32,
        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, initializer_range=0.2, tie_word_embeddings=False)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(SEED)
        model = transformers.LlamaForCausalLM(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(1.0, 0.3)
    finally:
        torch.random.set_rng_state(state)
    return model.eval().to(dtype)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The same model and the byte tokenizer saved as an HF directory: the loader's path."""
    folder = tmp_path_factory.mktemp("own-llama")
    llama().save_pretrained(folder)
    save_byte_tokenizer(folder)
    return folder


def same(a, b) -> bool:
    return (a.tokens == b.tokens and torch.equal(a.token_ids, b.token_ids) and torch.equal(a.u_in, b.u_in)
            and torch.equal(a.u_gate, b.u_gate) and torch.equal(a.v, b.v) and torch.equal(a.correction, b.correction))


def test_hf_object_and_own_bridge_give_the_loaders_exact_patches(saved):
    reference = token_patches(load_model(str(saved)), PROMPT)
    tokenizer = AutoTokenizer.from_pretrained(saved)
    from_object = load_model(llama(), tokenizer)
    bridge = TransformerBridge.boot_transformers(str(saved), hf_model=llama(), tokenizer=tokenizer)
    assert load_model(bridge) is bridge
    for model in (from_object, bridge):
        assert same(token_patches(model, PROMPT), reference)
    assert verify_equivalence(bridge, PROMPT).relative_error <= 1e-4


def test_hf_object_in_float64_with_a_tokenizer_built_in_memory(saved):
    reference = token_patches(load_model(str(saved), dtype=torch.float64), PROMPT)
    loaded = AutoTokenizer.from_pretrained(saved)
    in_memory = PreTrainedTokenizerFast(tokenizer_object=loaded.backend_tokenizer, bos_token="<bos>",
                                        eos_token="<eos>", pad_token="<pad>")
    assert "name_or_path" not in in_memory.init_kwargs or not in_memory.init_kwargs["name_or_path"]
    model = load_model(llama(torch.float64), in_memory)
    assert model.cfg.dtype == torch.float64
    patches = token_patches(model, PROMPT)
    assert patches.tokens == reference.tokens
    assert (patches.u_in - reference.u_in).abs().max() <= 1e-12 and torch.equal(patches.v, reference.v)
    assert verify_equivalence(model, PROMPT, patches).relative_error <= 1e-9


def test_same_hf_object_gives_the_same_bridge_and_a_wrapped_one_is_refused(saved):
    tokenizer = AutoTokenizer.from_pretrained(saved)
    hf = llama()
    bridge = load_model(hf, tokenizer)
    assert load_model(hf, tokenizer) is bridge
    other = llama()
    TransformerBridge.boot_transformers(str(saved), hf_model=other, tokenizer=tokenizer)
    with pytest.raises(OwnModelError, match="already inside a TransformerBridge"):
        load_model(other, tokenizer)


def test_a_model_object_is_never_moved_or_cast(saved):
    tokenizer = AutoTokenizer.from_pretrained(saved)
    with pytest.raises(OwnModelError, match="never casts"):
        load_model(llama(), tokenizer, dtype=torch.float64)
    with pytest.raises(OwnModelError, match="device_map"):
        load_model(llama(), tokenizer, device_map="auto")
    with pytest.raises(OwnModelError, match="no tokenizer found"):
        load_model(llama())
    with pytest.raises(OwnModelError, match="model name, a Hugging Face PreTrainedModel or a TransformerBridge"):
        load_model(3)
    bridge = TransformerBridge.boot_transformers(str(saved), hf_model=llama(), tokenizer=tokenizer)
    with pytest.raises(OwnModelError, match="carries its own tokenizer"):
        load_model(bridge, tokenizer)
    with pytest.raises(OwnModelError, match="never casts"):
        load_model(bridge, dtype="float64")
    assert load_model(bridge, dtype="float32", device="cpu") is bridge  # repeating its own placement is fine


def test_hf_model_passed_straight_to_public_functions_points_at_load_model():
    hf = llama()
    calls = [lambda: token_patches(hf, PROMPT), lambda: patch_norms(hf, [PROMPT], progress=False),
             lambda: trajectory(hf, PROMPT), lambda: verify_equivalence(hf, PROMPT),
             lambda: icl_lens.context_effect(hf, PROMPT), lambda: icl_lens.generate_with_patches(hf, PROMPT),
             lambda: icl_lens.PatchSession(hf), lambda: icl_lens.thought_patch(hf, "an instruction\n", ["q"]),
             lambda: icl_lens.evaluate_thought(hf, icl_lens.load_task("capitals")), lambda: icl_lens.dashboard(hf)]
    for call in calls:
        with pytest.raises(NotABridgeError, match=r"icl_lens.load_model\(model, tokenizer\)"):
            call()


def test_compatibility_mode_without_processing_is_accepted_and_changes_nothing(saved):
    reference = token_patches(load_model(str(saved)), PROMPT)
    bridge = TransformerBridge.boot_transformers(str(saved), hf_model=llama(),
                                                 tokenizer=AutoTokenizer.from_pretrained(saved))
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)  # hook aliases only
    assert same(token_patches(load_model(bridge), PROMPT), reference)


def processed_bridge(saved):
    bridge = TransformerBridge.boot_transformers(str(saved), hf_model=llama(),
                                                 tokenizer=AutoTokenizer.from_pretrained(saved))
    bridge.enable_compatibility_mode(disable_warnings=True)
    return bridge


def test_processed_bridge_is_refused_everywhere(saved):
    bridge = processed_bridge(saved)
    with pytest.raises(ProcessedWeightsError, match="unprocessed parametrisation"):
        load_model(bridge)
    for call in (lambda: token_patches(bridge, PROMPT), lambda: patch_norms(bridge, [PROMPT], progress=False),
                 lambda: trajectory(bridge, PROMPT), lambda: verify_equivalence(bridge, PROMPT),
                 lambda: icl_lens.thought_patch(bridge, "an instruction\n", ["q"]), lambda: icl_lens.dashboard(bridge)):
        with pytest.raises(ProcessedWeightsError):
            call()
    fresh = load_model(TransformerBridge.boot_transformers(str(saved), hf_model=llama(),
                                                           tokenizer=AutoTokenizer.from_pretrained(saved)))
    fresh.enable_compatibility_mode(disable_warnings=True)  # processed after load_model: still refused
    with pytest.raises(ProcessedWeightsError):
        token_patches(fresh, PROMPT)


def test_allow_processed_warns_and_its_norms_differ(saved):
    unprocessed = token_patches(load_model(str(saved)), PROMPT)
    bridge = processed_bridge(saved)
    with pytest.warns(ProcessedWeightsWarning, match="processed"):
        assert load_model(bridge, allow_processed=True) is bridge
    patches = token_patches(bridge, PROMPT)
    assert verify_equivalence(bridge, PROMPT, patches).relative_error <= 1e-4  # the identity still holds
    # ... but on the folded W_in: u = W δ is kept, a loses the norm's gain, so ‖ΔW‖ changes.
    assert torch.allclose(patches.u_in, unprocessed.u_in, rtol=1e-3, atol=1e-4)
    later = patches.norms()[:, 1:]
    assert not torch.allclose(later, unprocessed.norms()[:, 1:], rtol=1e-2)


def test_nothing_is_written_onto_a_bridge_the_user_built(saved):
    bridge = TransformerBridge.boot_transformers(str(saved), hf_model=llama(),
                                                 tokenizer=AutoTokenizer.from_pretrained(saved))
    before = set(vars(bridge))
    model = load_model(bridge)
    token_patches(model, PROMPT)
    token_patches(model, [PROMPT, "ab"], batch_size=2)
    patch_norms(model, [PROMPT], progress=False)
    trajectory(model, PROMPT)
    # TransformerBridge caches a flag of its own on a forward with position ids; icl_lens adds nothing.
    tl_source = inspect.getsource(transformer_bridge)
    added = [k for k in set(vars(bridge)) - before if f'"{k}"' not in tl_source]
    assert not added, added
