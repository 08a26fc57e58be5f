"""Every supported block family (docs/design.md §2): the table, TransformerBridge's faithfulness to
Hugging Face, the per-family facts the identity depends on (sliding windows, soft-capping,
parallel blocks, the raw-residual MLP input), the multimodal text tower, and a smoke test of
every feature (sessions, generation, the dashboard's analysis).

The equivalence identity itself is parametrised over all families in test_equivalence.py,
the trajectory identity in test_trajectory.py, the thought-patch reduction and export in
test_thought.py.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPTNeoXConfig, GPTNeoXForCausalLM

from icl_lens import (
    PatchSession,
    UnsupportedArchitectureError,
    generate_with_patches,
    load_model,
    token_patches,
    verify_equivalence,
)
from icl_lens.model._block_family import FAMILIES, FAMILY_OF_ARCHITECTURE, block_family
from icl_lens.model._byte_tokenizer import save_byte_tokenizer
from icl_lens.model._tiny_models import TINY_NAMES, build_tiny_model
from icl_lens.ui._analysis import PromptAnalyzer, alignment_matrix

PROMPT = "ab=1;cd=2;ef=3;ab=1;cd="  # past every tiny model's sliding window of 6


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_every_family_has_a_tiny_model_and_one_entry_per_architecture():
    tiny_archs = {build_tiny_model(name).config.architectures[0] for name in TINY_NAMES}
    assert tiny_archs == set(FAMILY_OF_ARCHITECTURE)  # every architecture of the table is tested
    archs = [a for f in FAMILIES for a in f.architectures]
    assert len(archs) == len(set(archs))
    assert all(f.summary and f.example for f in FAMILIES)


@pytest.mark.parametrize("name", TINY_NAMES)
def test_bridge_computes_what_hugging_face_computes(load, name):
    """TransformerBridge's reimplemented blocks give a separately built HF model's logits (float32).

    Not compared in float64: HF's eager softmax and several HF RMSNorms compute in float32
    even in a float64 model (1e-7 apart), the bridge with icl_lens's float64 softmax does not.
    """
    model = load(name)
    ids = model.to_tokens(PROMPT)
    with torch.no_grad():
        assert _rel(model(ids), build_tiny_model(name)(ids).logits) <= 1e-5


def test_a_sliding_window_ignored_breaks_the_identity(load):
    """The identity can fail: Mistral without its window on every layer is not exact."""
    model = load_model("tiny-mistral", dtype=torch.float64)  # private copy
    assert verify_equivalence(model, PROMPT).relative_error <= 1e-9
    model.icl_lens_family = replace(block_family(model), sliding_every_layer=False)
    assert verify_equivalence(model, PROMPT).relative_error > 1e-3


def test_gemma2_scores_are_soft_capped_before_renormalisation(load):
    """hook_attn_scores (what the kept-key renormalisation reads) is after tanh soft-capping, like the softmax."""
    model = load("tiny-gemma2", torch.float64)
    cap = model.original_model.config.attn_logit_softcapping
    seen = []
    with torch.no_grad(), model.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_scores", lambda s, hook: seen.append(s))]):
        logits = model(model.to_tokens(PROMPT))
    visible = seen[0] > torch.finfo(torch.float64).min / 2
    assert float(seen[0][visible].abs().max()) <= cap
    assert float(logits.abs().max()) <= model.original_model.config.final_logit_softcapping  # capped logits compared


@pytest.mark.parametrize("name", ["tiny-gpt-neox", "tiny-olmo2"])
def test_unusual_mlp_inputs(load, name):
    """Parallel blocks: A = a, zero patch, the context effect is all in the correction.
    OLMo-2: the MLP input is the raw residual entering the MLP (no pre-MLP norm)."""
    model = load(name, torch.float64)
    patches = token_patches(model, PROMPT)
    family = block_family(model)
    if family.parallel:
        assert float(patches.norms().abs().max()) == 0.0
        assert float(patches.correction_norms()[:, 1:].min()) > 0
    else:
        ids = model.to_tokens(PROMPT)
        _, cache = model.run_with_cache(ids, names_filter=lambda n: n in {"blocks.0.mlp.hook_in",
                                                                             "blocks.0.hook_resid_pre",
                                                                             "blocks.0.hook_attn_out"})
        raw = cache["blocks.0.hook_resid_pre"] + cache["blocks.0.hook_attn_out"]
        assert _rel(cache["blocks.0.mlp.hook_in"], raw) <= 1e-12
        assert float(patches.norms()[:, 2:].min()) > 0


def test_gemma3_multimodal_directory_boots_its_text_tower(tmp_path, monkeypatch):
    """What a Gemma 3 4B–27B checkpoint directory loads as: Gemma3ForConditionalGeneration.

    Booting TransformerBridge on the multimodal class makes it fetch an image processor and,
    failing that, pip-install torchvision (which replaces the pinned CPU torch): guarded here
    so that a regression fails this test instead of touching the environment.
    """
    from transformer_lens.model_bridge.sources.transformers import helpers

    def no_install():
        raise AssertionError("TransformerBridge was booted on the multimodal class (it tried to install torchvision)")

    monkeypatch.setattr(helpers, "_ensure_torchvision", no_install)
    hf = build_tiny_model("tiny-gemma3-vision")
    hf.save_pretrained(tmp_path)
    save_byte_tokenizer(tmp_path)
    model = load_model(str(tmp_path))
    assert type(model.original_model).__name__ == "Gemma3ForCausalLM" and block_family(model).name == "gemma3"
    assert getattr(model, "processor", None) is None  # no image processor (nor torchvision) fetched
    full = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert type(full).__name__ == "Gemma3ForConditionalGeneration"
    ids = model.to_tokens(PROMPT)
    with torch.no_grad():
        assert _rel(model(ids), full(ids).logits) <= 1e-5  # the text tower is the whole text path
    assert verify_equivalence(model, PROMPT).relative_error <= 1e-4


def test_a_block_layout_the_table_does_not_know_fails_fast(tmp_path):
    """A sequential GPT-NeoX block (use_parallel_residual=False) is not the parallel layout of the gpt_neox entry."""
    GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                     vocab_size=300, use_parallel_residual=False)).save_pretrained(tmp_path)
    save_byte_tokenizer(tmp_path)
    with pytest.raises(UnsupportedArchitectureError, match="parallel.*Supported block families: gpt2"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("name", TINY_NAMES)
def test_session_generation_and_dashboard_analysis(load, name):
    model = load(name, torch.float64)
    full = token_patches(model, PROMPT)
    session = PatchSession(model)
    session.update(PROMPT[:9])
    patches = session.update(PROMPT)
    assert session.last_stats.reused > 0
    for field in ("u_in", "v", "correction"):
        assert _rel(getattr(patches, field), getattr(full, field)) <= 1e-12 or float(getattr(full, field).abs().max()) == 0
    gen = generate_with_patches(model, PROMPT, max_new_tokens=3, stop_at_eos=False)
    assert gen.n_new == 3 and gen.recomputed[1:] == (1, 1, 1)
    assert _rel(gen.patches.correction, token_patches(model, gen.token_ids).correction) <= 1e-12
    analyzer = PromptAnalyzer(model)
    prompt = analyzer.encode(PROMPT)
    shown, _ = analyzer.patches(prompt)
    assert torch.equal(shown.norms(), full.norms())
    traj, _ = analyzer.trajectory(prompt, prompt.ids.numel() - 1)
    assert traj.n_context == prompt.ids.numel() - 1 - int(full.kept_bos)
    pattern, _ = analyzer.attention(prompt, model.cfg.n_layers - 1)
    assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=1e-6)
    assert alignment_matrix(shown, 0).shape == (full.n_positions,) * 2


def test_readme_family_table_is_the_code_table():
    """README's table lists every family with its classes and example checkpoints, as block_family.py does."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[1].startswith("`") and "/" in cells[2]:
            rows[cells[0].strip("`")] = ([c.strip("` ") for c in cells[1].split(",")], [c.strip("` ") for c in cells[2].split(",")])
    assert rows == {f.name: (list(f.architectures), [e.strip() for e in f.example.split(",")]) for f in FAMILIES}
    assert all(f"`{name}`" in readme for name in TINY_NAMES)
