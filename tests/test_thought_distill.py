"""Context distillation (issue 22): the same parameters, rows and edit mechanism as the thought patch."""
from __future__ import annotations

import pytest
import torch

from icl_lens.thought._defaults import DISTILL_WARMUP
from icl_lens.thought._distill import distill_patch, learning_rate
from icl_lens.thought._divergence import answer_kl

INSTRUCTION = "Remember: the secret word is banana, and 7 follows 3.\n"
QUERIES = ["q", "ab", "xyz", "k"]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_distillation_brings_the_query_alone_towards_the_instruction(load, name):
    """KL(full ‖ edited) at every calibration position falls well below the unpatched model's, the model's weights
    are neither trained nor left trainable, and the edit runs through ThoughtPatch.applied (no hooks left)."""
    model = load(name)
    flags = [p.requires_grad for p in model.parameters()]
    weights = [p.detach().clone() for p in model.parameters()]
    patch = distill_patch(model, INSTRUCTION, QUERIES, steps=40, lr=3e-3, answer_tokens=3, progress=False)
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(torch.equal(w, p) for w, p in zip(weights, model.parameters()))
    score = dict(query_prefix="\n", answer_tokens=3)
    before = answer_kl(model, INSTRUCTION, QUERIES, None, **score)
    after = answer_kl(model, INSTRUCTION, QUERIES, patch, **score)
    assert after < 0.5 * before
    assert patch.method == "distill" and patch.settings["last_loss"] < patch.settings["first_loss"]
    assert float(patch.maps.abs().max()) > 0 and float(patch.down_v.abs().max()) > 0
    assert answer_kl(model, INSTRUCTION, QUERIES, None, **score) == before  # hooks removed


def test_distillation_trains_only_the_kinds_parts(load):
    model = load("tiny-llama")
    patch = distill_patch(model, INSTRUCTION, QUERIES[:2], kind="vector", steps=3, progress=False, answer_tokens=0)
    assert float(patch.maps.abs().max()) == 0 and patch.down_u.shape[1] == 0
    assert float(patch.vectors.abs().max()) > 0
    with pytest.raises(ValueError, match="steps"):
        distill_patch(model, INSTRUCTION, QUERIES, steps=0)
    with pytest.raises(ValueError, match="lr"):
        distill_patch(model, INSTRUCTION, QUERIES, lr=float("nan"))


def test_learning_rate_warms_up_then_decays_to_zero():
    steps, lr = 100, 1e-3
    rates = [learning_rate(s, steps, lr) for s in range(steps)]
    warm = int(DISTILL_WARMUP * steps)
    assert rates[warm - 1] == pytest.approx(lr) and rates[0] == pytest.approx(lr / warm)
    assert all(a <= b for a, b in zip(rates[:warm], rates[1:warm]))
    assert all(a >= b for a, b in zip(rates[warm:], rates[warm + 1:]))
    assert rates[-1] < 0.01 * lr
