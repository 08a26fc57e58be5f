"""ICL lab: shipped checkpoints (no training here), the exact identities, and the qualitative claims.

Thresholds come from docs/design.md §2 (1e-10 relative at float64, 1e-4 at float32) or
state the qualitative finding with a margin that would fail if it flipped.
"""
from __future__ import annotations

import pytest
import torch

from icl_lens import lab
from icl_lens.model import activations_captured
from icl_lens.lab._checkpoints import LAB_MODELS, CheckpointNotFoundError, checkpoint_path, load_lab_model, training_record
from icl_lens.lab.experiments._attention_regression import attention_as_regression
from icl_lens.lab.experiments._convergence import convergence_by_architecture
from icl_lens.lab.experiments._equivalence import numerical_equivalence
from icl_lens.lab.experiments._memory_cost import decode_matches_forward, memory_and_cost
from icl_lens.lab.experiments._thought_patch import static_thought_patch
from icl_lens.lab._mixers import ARCHITECTURES
from icl_lens.patches._patch_set import TokenPatches
from icl_lens.lab._model import LAB_FAMILY, LabConfig
from icl_lens.lab._patching import lab_token_patches, patched_context_free
from icl_lens.lab._tasks import prefix_batch, sample_prompts
from icl_lens.lab.train import query_loss


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


@pytest.fixture(scope="module")
def convergence():
    return convergence_by_architecture(n_prompts=4, n_max=64)


@pytest.mark.parametrize("name", list(LAB_MODELS))
def test_checkpoint_loads_and_learned_in_context(name):
    model = load_lab_model(name)
    assert model.cfg == LAB_MODELS[name] and not any(p.requires_grad for p in model.parameters())
    cfg = model.cfg
    p = sample_prompts(256, cfg.n_context_train, cfg.d_x, generator=torch.Generator().manual_seed(7), query_flag=cfg.query_flag)
    no_context = sample_prompts(256, 0, cfg.d_x, generator=torch.Generator().manual_seed(7), query_flag=cfg.query_flag)
    with torch.no_grad():
        with_ctx, without = query_loss(model, p.tokens, p.targets), query_loss(model, no_context.tokens, no_context.targets)
    assert with_ctx < 0.5 * without, f"{name}: context does not help ({with_ctx:.3f} vs {without:.3f})"
    assert training_record(name)["steps"] >= 1000
    assert checkpoint_path(name).stat().st_size < 1_000_000


def test_bad_inputs_fail_fast():
    model = load_lab_model("softmax")
    with pytest.raises(ValueError, match="tokens must be"):
        model(torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match="NaN"):
        model(torch.full((1, 2, 6), float("nan")))
    with pytest.raises(ValueError, match="unknown arch"):
        LabConfig(arch="lstm")
    with pytest.raises(ValueError, match="token size"):
        LabConfig(embed=False, d_model=32)
    with pytest.raises(ValueError, match="unknown lab model"):
        load_lab_model("transformer")
    with pytest.raises(CheckpointNotFoundError):
        load_lab_model("softmax", directory="/nonexistent")
    with pytest.raises(ValueError):
        sample_prompts(0, 4, 4)


def test_prefix_batch_places_query_after_each_prefix():
    ctx, q = torch.arange(12.0).reshape(3, 4), -torch.ones(4)
    rows = prefix_batch(ctx, q)
    for i in range(4):
        assert torch.equal(rows[i, :i], ctx[:i]) and torch.equal(rows[i, i], q)


def test_numerical_equivalence_all_architectures():
    res = numerical_equivalence(n_prompts=8)
    for arch in ARCHITECTURES:
        assert res.worst(arch, "float64") <= 1e-10, arch
        assert res.worst(arch, "float32") <= 1e-4, arch
    assert (res.to_frame().mean_patch_norm > 0).all()


def test_token_patches_are_a_batched_token_patches(tmp_path):
    model = load_lab_model("gru", torch.float64)
    p = sample_prompts(2, 5, model.cfg.d_x, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    patches = lab_token_patches(model, p.tokens)
    assert isinstance(patches, TokenPatches) and patches.batched and patches.n_positions == 6
    one = patches.prompt(1)
    assert torch.equal(one.norms(), patches.norms()[:, 1]) and not one.batched
    # the patch maps the kept input a (the MLP input of the patched context-free run) onto the contextual A:
    # (W + u vᵀ) a = W A
    site = LAB_FAMILY.mlp_input(3)
    with activations_captured(model, [site]) as cache:
        model(p.tokens)
    with activations_captured(model, [site]) as got:
        patched_context_free(model, p.tokens, patches)
    W = model.blocks[3].mlp.W_in.weight
    a, A = got[site].reshape(2, 6, -1)[1], cache[site][1]
    assert float((a - A).abs().max()) > 1e-3  # the context changes the MLP input
    lhs = a @ W.T + patches.u_in[3, 1] * (a * patches.v[3, 1]).sum(-1, keepdim=True)
    assert torch.allclose(lhs, A @ W.T, atol=1e-12)
    assert len(one.to_frame()) == model.cfg.n_layers * 6
    assert len(patches.to_frame()) == 2 * model.cfg.n_layers * 6
    with pytest.raises(ValueError, match="batch"):
        patches.save(tmp_path / "batch.safetensors")


def test_attention_meta_gradients_converge(convergence):
    """Observed (and claimed): softmax and normalised linear attention steps decay like ~1/i."""
    s = convergence.summary().set_index("arch")
    for arch in ("softmax", "linear"):
        assert s.loc[arch, "alpha_mean_curve"] > 0.5, arch
        assert s.loc[arch, "late_over_early"] < 0.3, arch
    assert convergence.n_max >= 4 * convergence.n_train


def test_gru_meta_gradients_do_not_converge(convergence):
    """Observed (and claimed): the GRU's steps stay flat beyond the training length; the delta rule decays, slower."""
    s = convergence.summary().set_index("arch")
    assert s.loc["gru", "alpha_mean_curve"] < 0.3
    assert s.loc["gru", "late_over_early"] > 0.5
    assert s.loc["gru", "alpha_mean_curve"] < s.loc["softmax", "alpha_mean_curve"] - 0.4
    assert s.loc["delta", "alpha_mean_curve"] > s.loc["gru", "alpha_mean_curve"] + 0.2


def test_static_thought_patch_generalises_as_k_grows():
    s = static_thought_patch(n_prompts=2, ks=(1, 64), n_test=128).summary().set_index("K")
    gap = s.test_mse - s.train_mse
    assert gap[64] < 0.5 * gap[1]
    assert s.test_mse[64] < s.test_mse[1]
    assert s.test_mse[64] < s.no_context_test_mse[64]
    assert s.train_fidelity[1] < 1e-6  # one query: the patch reproduces it (interpolation)


def test_memory_kv_cache_grows_fixed_state_does_not():
    res = memory_and_cost(lengths=(32, 128), window=8)
    assert (res.to_frame().us_per_token_min > 0).all()
    assert res.bytes_at("softmax", 128) == 4 * res.bytes_at("softmax", 32)
    for arch in ("linear", "delta", "gru"):
        assert res.bytes_at(arch, 128) == res.bytes_at(arch, 32) > 0
    assert res.bytes_at("softmax", 128) > max(res.bytes_at(a, 128) for a in ("linear", "delta", "gru"))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_decoding_with_state_matches_forward(arch):
    model = load_lab_model(arch, torch.float64)
    p = sample_prompts(3, 20, model.cfg.d_x, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    assert decode_matches_forward(model, p.tokens) <= 1e-10


def test_attention_as_regression_identities():
    res = attention_as_regression(n_prompts=2)
    for row in res.rows:
        assert row["max_rel_error"] <= 1e-10, row["check"]
    delta = res.to_frame().dropna(subset=["fraction_steps_decreasing_loss"])
    assert (delta.fraction_steps_decreasing_loss == 1.0).all()


def test_public_api():
    assert lab.load_lab_model is load_lab_model and "softmax" in lab.ARCHITECTURES
