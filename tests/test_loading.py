"""Loading: a saved HF directory works like the built-in names; dtypes are honoured; results carry the name."""
import warnings

import pytest
import torch

from icl_lens import ModelNotFoundError, load_model, token_patches, verify_equivalence
from icl_lens.model._loading import OwnModelError
from icl_lens.model._byte_tokenizer import save_byte_tokenizer
from icl_lens.model._tiny_models import TINY_NAMES, build_tiny_model


def test_local_directory_loads_and_is_exact(tmp_path):
    build_tiny_model("tiny-llama").save_pretrained(tmp_path)
    save_byte_tokenizer(tmp_path)
    model = load_model(str(tmp_path), dtype=torch.float64)
    assert model.cfg.dtype == torch.float64
    assert load_model(tmp_path).cfg.model_name == str(tmp_path)  # any os.PathLike, as a string (issue 43)
    patches = token_patches(model, "from a directory")
    assert patches.model_name == model.cfg.model_name == str(tmp_path)  # the name given, kept in the bridge's cfg
    assert verify_equivalence(model, "from a directory", patches).relative_error <= 1e-9


def test_half_precision_patch_arithmetic_in_float32():
    model = load_model("tiny-llama", dtype=torch.bfloat16)
    patches = token_patches(model, "half precision")
    assert patches.u_in.dtype == torch.float32 and torch.isfinite(patches.norms()).all()
    # bf16 forwards are only bf16-accurate; the identity holds to bf16 precision.
    assert verify_equivalence(model, "half precision", patches).relative_error <= 5e-2


def test_a_name_takes_no_tokenizer_and_must_be_text():
    with pytest.raises(OwnModelError, match="tokenizer= goes with a model object"):
        load_model("tiny-llama", object())
    for bad in ("", "  ", None):
        with pytest.raises(ModelNotFoundError, match="non-empty string"):
            load_model(bad)


def test_results_carry_the_name_an_embedded_model_was_loaded_by(smollm):
    # The bridge boots from the cached folder; the name given is kept in its cfg, not on the bridge.
    assert token_patches(smollm, "a name").model_name == "smollm2-135m"
    assert not [key for key in vars(smollm) if "icl" in key.lower()]


@pytest.mark.parametrize("name", TINY_NAMES)
def test_norms_run_once_and_give_transformer_lens_outputs_bit_for_bit(load, name, monkeypatch):
    """A bridge norm that nothing watches inside runs the Hugging Face norm once (not TransformerLens's second
    computation for ``hook_scale``/``hook_normalized``), with the same outputs bit for bit; a hook on either
    point, edits included, still runs through TransformerLens's own forward."""
    from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge

    model = load(name)
    norms = [m for m in model.modules() if isinstance(m, NormalizationBridge)]
    assert norms and all("forward" in m.__dict__ for m in norms if type(m).forward is NormalizationBridge.forward)
    calls = []
    inner = NormalizationBridge._hf_autograd_forward_with_hooks
    monkeypatch.setattr(NormalizationBridge, "_hf_autograd_forward_with_hooks",
                        lambda self, x: calls.append(1) or inner(self, x))
    ids = torch.arange(3, 19)[None]

    def forwards():
        with torch.no_grad():
            once = model(ids)
            n_once = len(calls)
            own = {m: m.__dict__.pop("forward") for m in norms if "forward" in m.__dict__}
            try:
                plain = model(ids)
            finally:
                for m, f in own.items():
                    object.__setattr__(m, "forward", f)
        return once, plain, n_once

    once, plain, n_once = forwards()
    assert torch.equal(once, plain) and n_once == 0
    native = any(m.use_native_layernorm_autograd for m in norms)
    assert len(calls) > 0 if native else len(calls) == 0  # TransformerLens computes twice where native

    norm = norms[1]
    seen = {"in": [], "out": []}
    handles = [getattr(norm, f"hook_{k}").register_forward_hook(lambda m, a, out, k=k: seen[k].append(out.clone()))
               for k in seen]
    try:  # hooks that only read, on the norm's input and output: they fire with TransformerLens's values
        calls.clear()
        once, plain, n_once = forwards()
        assert all(len(v) == 2 and torch.equal(*v) for v in seen.values()) and torch.equal(once, plain)
        assert n_once == 0
        seen["normalized"] = []  # a hook inside the norm: TransformerLens's own forward runs
        handles.append(norm.hook_normalized.register_forward_hook(
            lambda m, a, out: seen["normalized"].append(out.clone())))
        calls.clear()
        watched, plain_watched, n_once = forwards()
        assert len(seen["normalized"]) == 2 and torch.equal(*seen["normalized"]) and torch.equal(watched, plain)
        assert n_once == (1 if norm.use_native_layernorm_autograd else 0)
    finally:
        for h in handles:
            h.remove()
    with warnings.catch_warnings(), model.hooks(fwd_hooks=[(norm.hook_normalized.name, lambda x, hook: 2 * x)]):
        warnings.simplefilter("ignore")  # TransformerLens's note that an edit leaves HF's native path
        edited, plain_edited, _ = forwards()  # the edit propagates as before
    assert torch.equal(edited, plain_edited) and not torch.equal(edited, plain)
