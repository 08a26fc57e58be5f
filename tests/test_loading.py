"""Loading: a saved HF directory works like the built-in names; dtypes are honoured."""
import torch

from icl_lens import load_model, token_patches, verify_equivalence
from icl_lens.model.byte_tokenizer import save_byte_tokenizer
from icl_lens.model.tiny_models import build_tiny_model


def test_local_directory_loads_and_is_exact(tmp_path):
    build_tiny_model("tiny-llama").save_pretrained(tmp_path)
    save_byte_tokenizer(tmp_path)
    model = load_model(str(tmp_path), dtype=torch.float64)
    assert model.cfg.dtype == torch.float64
    patches = token_patches(model, "from a directory")
    assert verify_equivalence(model, "from a directory", patches).relative_error <= 1e-9


def test_half_precision_patch_arithmetic_in_float32():
    model = load_model("tiny-llama", dtype=torch.bfloat16)
    patches = token_patches(model, "half precision")
    assert patches.u_in.dtype == torch.float32 and torch.isfinite(patches.norms()).all()
    # bf16 forwards are only bf16-accurate; the identity holds to bf16 precision.
    assert verify_equivalence(model, "half precision", patches).relative_error <= 5e-2
