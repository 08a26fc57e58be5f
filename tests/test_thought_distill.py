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


KEPT = ["The river bends.", "Seven boxes.", "A cat sat."]


def test_the_preserve_term_keeps_the_preserve_texts(load, one_thread):
    """Issue 38, equal terms: with the patch's preserve texts as a KL term the distilled edit moves them less than
    without it (same steps, rate and seed), and it still brings the query alone towards the instruction."""
    from icl_lens.thought._divergence import text_kl
    from icl_lens.thought._instruction_batches import text_ids, with_bos

    model = load("tiny-llama")
    kept = [with_bos(model, text_ids(model, t)) for t in KEPT]
    score = dict(query_prefix="\n", answer_tokens=3)
    before = answer_kl(model, INSTRUCTION, QUERIES, None, **score)
    moved = {}
    for weight in (0.0, 10.0):
        patch = distill_patch(model, INSTRUCTION, QUERIES, steps=30, lr=3e-3, answer_tokens=3, progress=False,
                              preserve=KEPT, preserve_weight=weight)
        moved[weight] = text_kl(model, kept, patch)
        assert answer_kl(model, INSTRUCTION, QUERIES, patch, **score) < 0.7 * before
        assert patch.settings["preserve_weight"] == weight and "chosen_step" not in patch.settings
    assert moved[10.0] < 0.5 * moved[0.0]


def test_early_stopping_returns_the_best_checkpoint_by_the_held_out_objective(load, one_thread):
    """Checkpoints every ``eval_every`` steps score answer KL on the validation queries + w · text KL on the held-out
    texts; the run stops after ``patience`` checkpoints without a better one, and the edit returned is the best
    checkpoint's: its objective, recomputed, is the best one recorded (a too-large rate makes the later ones worse)."""
    from icl_lens.thought._divergence import text_kl
    from icl_lens.thought._instruction_batches import text_ids, with_bos

    model = load("tiny-llama")
    held = [with_bos(model, text_ids(model, t)) for t in ("Blue skies today.", "Two dogs ran.")]
    val, weight = ["m", "cd"], 1.0
    patch = distill_patch(model, INSTRUCTION, QUERIES, steps=60, lr=0.3, answer_tokens=3, progress=False,
                          preserve=KEPT, preserve_weight=weight, validation=val, held_out=held, eval_every=3,
                          patience=2)
    s = patch.settings
    objectives = [c["objective"] for c in s["checkpoints"]]
    best = min(objectives)
    assert s["steps_run"] < 60 and s["chosen_step"] < s["steps_run"]
    assert s["checkpoints"][objectives.index(best)]["step"] == s["chosen_step"]
    again = answer_kl(model, INSTRUCTION, val, patch, query_prefix="\n", answer_tokens=3) + weight * text_kl(
        model, held, patch)
    assert again == pytest.approx(best, rel=1e-5)
    for kwargs, match in (({"preserve_weight": -1.0}, "preserve_weight"), ({"eval_every": 0}, "eval_every"),
                          ({"validation": []}, "validation"),
                          ({"preserve_weight": 1.0, "validation": ["m"], "preserve": KEPT}, "held_out")):
        with pytest.raises(ValueError, match=match):
            distill_patch(model, INSTRUCTION, QUERIES, steps=2, progress=False, **kwargs)


def test_a_kept_reference_scores_each_edit_as_a_fresh_call_does(load, one_thread):
    """Distillation's checkpoints score against references computed once (``KLReference``): for two different edits
    and no edit, the kept reference gives what ``answer_kl`` and ``text_kl`` give when called afresh, and
    ``text_kl`` is the position-weighted mean KL computed here from the model's own forwards (float64)."""
    from icl_lens.thought._divergence import answer_reference, text_kl, text_reference
    from icl_lens.thought._instruction_batches import text_ids, with_bos

    model = load("tiny-llama", torch.float64)
    texts = [with_bos(model, text_ids(model, t)) for t in KEPT]
    score = dict(query_prefix="\n", answer_tokens=3)
    edits = [None] + [distill_patch(model, INSTRUCTION, QUERIES, steps=s, lr=3e-3, answer_tokens=3, progress=False)
                      for s in (2, 6)]
    answers, kept = answer_reference(model, INSTRUCTION, QUERIES, **score), text_reference(model, texts)
    for edit in edits:
        assert answers.kl(edit) == answer_kl(model, INSTRUCTION, QUERIES, edit, **score)
        assert kept.kl(edit) == pytest.approx(text_kl(model, texts, edit), rel=1e-12, abs=1e-15)
    by_hand, n = 0.0, 0
    for ids in texts:
        x = torch.tensor([ids])
        with torch.no_grad():
            p = model(x)[0].log_softmax(-1)
            with edits[2].applied(model):
                q = model(x)[0].log_softmax(-1)
        by_hand += float((p.exp() * (p - q)).sum())
        n += len(ids)
    assert text_kl(model, texts, edits[2]) == pytest.approx(by_hand / n, rel=1e-10)
    assert kept.kl(edits[2]) > 0 and kept.kl(None) == 0
