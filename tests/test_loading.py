"""Loading: a saved HF directory works like the built-in names; dtypes are honoured; results carry the name."""
import pytest
import torch

from icl_lens import ModelNotFoundError, load_model, token_patches, verify_equivalence
from icl_lens.model._loading import OwnModelError
from icl_lens.model._byte_tokenizer import save_byte_tokenizer
from icl_lens.model._tiny_models import build_tiny_model


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
