"""The null-space edit (AlphaEdit, Fang et al. 2025, arXiv 2410.02355; icl_lens/thought/_null_space.py).

With ``null_space=0`` the matrix and down updates of a thought patch act only outside the span of the preserved keys
(and the BOS key), so the patched model reads a preserved text exactly as the unpatched one does, layer by layer: an
identity, checked in float64 and float32 on two block families. The thought vector (a bias, or Gemma's gain) has no
key side and is zeroed for the identity.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from contextlib import nullcontext

import pytest
import torch

from icl_lens import ThoughtFit, thought_patch
from icl_lens.model._greedy import last_logits
from icl_lens.thought._instruction_batches import text_ids, with_bos
from icl_lens.thought._null_space import kept_directions, null_space_projector

INSTRUCTION = "Remember: the secret word is banana, and 7 follows 3.\n"
KEPT = ("The river bends.", "Seven boxes.")  # fewer tokens than d_model: the keys leave a null space
SETTING = dict(kind="both+down", ridge=1.0, query_prefix="\n", answer_tokens=2, preserve=KEPT, preserve_strength=0.0)
TOL = {torch.float64: 1e-9, torch.float32: 1e-4}


def _mlp_outputs(model, text: str, edit=None) -> torch.Tensor:
    """Every layer's MLP output at every position of ``[BOS] + text``, stacked."""
    ids = torch.tensor([with_bos(model, text_ids(model, text))])
    names = [f"blocks.{l}.hook_mlp_out" for l in range(model.cfg.n_layers)]
    with torch.no_grad(), edit.applied() if edit is not None else nullcontext():
        logits, cache = model.run_with_cache(ids, names_filter=lambda n: n in names)
    return torch.stack([cache[n][0] for n in names]), logits[0]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_null_space_patch_leaves_the_preserved_keys_unchanged(load, name, dtype, one_thread):
    model = load(name, dtype)
    patch = thought_patch(model, INSTRUCTION, ["q", "ab", "hello"], null_space=0.0, **SETTING)
    assert patch.fit.null_space == 0.0 and float(patch.maps.norm()) > 0 and float(patch.down_v.norm()) > 0
    key_side = dataclasses.replace(patch, vectors=torch.zeros_like(patch.vectors))  # the matrix and down updates
    for text in KEPT:
        (mlp, logits), (mlp0, logits0) = _mlp_outputs(model, text, key_side), _mlp_outputs(model, text)
        assert _rel(mlp, mlp0) < TOL[dtype] and _rel(logits, logits0) < TOL[dtype]
    # The edit still does its job on a query: closer to the full prompt than the query alone.
    with patch.applied():
        patched = last_logits(model, [patch.prompt_ids("q")])[0]
    alone = last_logits(model, [patch.prompt_ids("q")])[0]
    full = last_logits(model, [with_bos(model, text_ids(model, INSTRUCTION) + text_ids(model, "q"))])[0]
    assert float((patched - full).norm()) < float((alone - full).norm())
    # Without the projection the same fit moves the preserved texts (the identity above is not trivially true).
    plain = thought_patch(model, INSTRUCTION, ["q", "ab", "hello"], **SETTING)
    plain = dataclasses.replace(plain, vectors=torch.zeros_like(plain.vectors))
    assert _rel(_mlp_outputs(model, KEPT[0], plain)[0], _mlp_outputs(model, KEPT[0])[0]) > 1e-2


def test_a_looser_rule_moves_the_preserved_keys_a_little(load, one_thread):
    """ε > 0 keeps fewer directions out: the preserved texts move, but less than without the projection."""
    model = load("tiny-gemma3", torch.float64)
    moved = {}
    for eps in (None, 0.01, 0.0):
        patch = thought_patch(model, INSTRUCTION, ["q", "ab", "hello"], null_space=eps, **SETTING)
        patch = dataclasses.replace(patch, vectors=torch.zeros_like(patch.vectors))
        moved[eps] = sum(_rel(_mlp_outputs(model, t, patch)[1], _mlp_outputs(model, t)[1]) for t in KEPT)
    assert moved[0.0] < 1e-9 < moved[0.01] < moved[None]


def test_the_rule_keeps_the_smallest_k_holding_one_minus_eps_of_the_trace():
    q, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    cov = q @ torch.diag(torch.tensor([8.0, 4.0, 2.0, 1.0, 1.0, 0.0], dtype=torch.float64)) @ q.T  # trace 16, rank 5
    assert [kept_directions(cov, e) for e in (0.0, 0.5, 0.3, 0.2, 0.1, 0.05)] == [5, 1, 2, 3, 4, 5]
    p = null_space_projector(cov, 0.3)
    assert torch.allclose(p, p.T) and torch.allclose(p @ p, p, atol=1e-12)
    assert torch.allclose(p @ q[:, :2], torch.zeros(6, 2, dtype=torch.float64), atol=1e-12)  # the top two removed
    assert torch.allclose(p @ q[:, 2:], q[:, 2:], atol=1e-12)
    bos = torch.randn(1, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    p = null_space_projector(cov, 0.5, always=bos)  # BOS removed whatever the rule
    assert float((p @ bos.T).abs().max()) < 1e-12 and int(torch.linalg.matrix_rank(p)) == 4
    assert torch.equal(null_space_projector(cov + torch.eye(6, dtype=torch.float64), 0.0), torch.zeros(6, 6,
                                                                                                      dtype=torch.float64))
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="share of the trace"):
            null_space_projector(cov, bad)


def test_null_space_is_a_fit_setting_in_its_key():
    fit = ThoughtFit()
    d = fit.to_dict()
    assert d["null_space"] is None
    del d["null_space"]  # a fit without the projection keeps the key it had before the field existed
    assert fit.key() == hashlib.sha256(json.dumps({**d, "preserve": "shipped: samples+few-shot"},
                                                  sort_keys=True).encode()).hexdigest()[:12]
    on = fit.replace(null_space=0.01)
    assert on.key() != fit.key() and ThoughtFit.from_dict(on.to_dict()) == on
    # Without the penalty the projection still reads the preserve texts, so they are part of its key.
    assert fit.replace(preserve_strength=0.0, null_space=0.0).key() != fit.replace(
        preserve_strength=0.0, null_space=0.0, preserve=("x",)).key()
    for bad in (-0.1, 1.0, float("nan"), "x"):
        with pytest.raises(ValueError, match="null_space"):
            ThoughtFit(null_space=bad)
