"""Half precision (exact against the model's own noise floor), device errors, and accelerate device maps."""
import subprocess
import sys

import pytest
import torch

import icl_lens
from icl_lens import patch_norms, token_patches, verify_equivalence
from icl_lens.patches._token_patches import noise_floor
from icl_lens.model._loading import DeviceError, check_device, load_model

PROMPT = "In-context learning: the cat sat on the mat, then the cat sat on the hat."


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-gemma3"])
def test_half_precision_within_twice_the_noise_floor(load, name, dtype):
    half, full = load(name, dtype), load(name, torch.float32)
    patches = token_patches(half, PROMPT)
    assert patches.u_in.dtype == torch.float32 and patches.v.dtype == torch.float32  # patch arithmetic in float32
    floor = noise_floor(half, full, PROMPT)
    assert floor > 0  # the half model really is a different model from float32
    report = verify_equivalence(half, PROMPT, patches)
    assert float(report.max_abs_err.max()) <= 2 * floor
    # The identity is not trivially inside the floor: without the patches the error is far larger.
    zero = token_patches(half, PROMPT)
    for field in ("u_in", "u_gate", "correction"):
        if getattr(zero, field) is not None:
            getattr(zero, field).zero_()
    assert float(verify_equivalence(half, PROMPT, zero).max_abs_err.max()) > 4 * floor


def test_cli_half_precision_reports_the_floor():
    proc = subprocess.run([sys.executable, "-m", "icl_lens", "patches", "the cat sat on the mat", "--model",
                           "tiny-llama", "--dtype", "bfloat16", "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    data = json.loads(proc.stdout)
    assert data["noise_floor"] > 0 and data["exact"]
    assert data["tolerance"] == pytest.approx(2 * data["noise_floor"] / data["max_abs_logit"])


def test_dtype_names_and_bad_dtype():
    assert icl_lens.model._loading.resolve_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(DeviceError, match="dtype must be one of"):
        load_model("tiny-llama", dtype="int8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_cuda_is_a_one_line_error():
    with pytest.raises(DeviceError, match="CUDA is not available"):
        check_device("cuda")
    proc = subprocess.run([sys.executable, "-m", "icl_lens", "patches", "hello", "--model", "tiny-llama",
                           "--device", "cuda"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("icl-lens: error:") and "CUDA is not available" in lines[0]


def test_device_map_with_disk_offload_gives_the_same_patches(tmp_path):
    """Layers 1-2 offloaded to disk by accelerate: each layer's patch is computed as it runs, same numbers."""
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "disk", "model.layers.2": "disk", "model.norm": "cpu", "lm_head": "cpu"}
    split = load_model("tiny-llama", device_map=device_map, offload_folder=tmp_path)
    assert split.original_model.hf_device_map["model.layers.2"] == "disk"
    plain = load_model("tiny-llama")
    a, b = token_patches(split, PROMPT), token_patches(plain, PROMPT)
    for field in ("u_in", "u_gate", "v", "correction"):
        assert torch.allclose(getattr(a, field), getattr(b, field), rtol=1e-6, atol=1e-7), field
    assert verify_equivalence(split, PROMPT, a).relative_error <= 1e-4
    norms_split = patch_norms(split, [PROMPT, "hi"], progress=False)
    norms_plain = patch_norms(plain, [PROMPT, "hi"], progress=False)
    assert torch.allclose(torch.tensor(norms_split.norm.to_numpy()), torch.tensor(norms_plain.norm.to_numpy()),
                          rtol=1e-6)


def test_device_and_device_map_are_exclusive():
    with pytest.raises(DeviceError, match="either device= or device_map="):
        load_model("tiny-llama", device="cuda:0", device_map="auto")


def test_an_offloaded_unembedding_is_run_by_its_module(tmp_path):
    """The unembedding on disk (accelerate loads its weight only around the module's own call): ``unembedded``
    and each greedy step go through the module, not the weight-first product, with the plain model's logits."""
    from icl_lens.model._greedy import greedy_continuations, unembedded

    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers": "cpu", "model.norm": "cpu",
                  "lm_head": "disk"}
    split = load_model("tiny-llama", device_map=device_map, offload_folder=tmp_path)
    assert split.original_model.hf_device_map["lm_head"] == "disk"
    plain = load_model("tiny-llama")
    hidden = torch.randn(3, plain.cfg.d_model, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(unembedded(split, hidden), unembedded(plain, hidden), rtol=1e-6, atol=1e-6)
    prompts = [[1, 40, 41], [1, 50, 51], [1, 60, 61, 62]]
    assert greedy_continuations(split, prompts, 4) == greedy_continuations(plain, prompts, 4)
