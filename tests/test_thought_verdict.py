"""Issue 22's faithful verdict: answers end at a word boundary, whole continuations kept, gain recovered."""
from __future__ import annotations

import pytest
import torch

from icl_lens.model.greedy import greedy_continuations
from icl_lens.thought.evaluate import answer_correct, gain_recovered, graded
from icl_lens.thought.instruction_batches import text_ids, with_bos


@pytest.mark.parametrize("continuation, answer, right", [
    (" six\n", "six", True), (" sixteen", "six", False), ("six", "six", True), (" Paris, France", "Paris", True),
    (" twenty-one", "twenty", False), (" twenty", "twenty", True), (" 12", "1", False), (" 1 +", "1", True),
    (" New Delhi.", "New Delhi", True), (" New", "New Delhi", False), ("  Rome", "Rome", True),
    (" dont", "don", False), (" don't", "don", False), (" cats_", "cats", False), (" Tokyo", " Tokyo ", True),
])
def test_an_answer_must_end_where_a_word_ends(continuation, answer, right):
    assert answer_correct(continuation, answer) is right


def test_gain_recovered_is_the_share_of_the_instructions_gain():
    acc = {"none": 0.2, "full": 0.8, "patched": 0.65, "control": 0.2, "steering": 0.1}
    assert gain_recovered(acc) == pytest.approx({"patched": 0.75, "control": 0.0, "steering": -1 / 6})
    assert gain_recovered({"none": 0.5, "full": 0.5, "patched": 0.5}) == {"patched": None}
    assert gain_recovered({"patched": 0.5}) == {}


def test_graded_keeps_every_new_token_and_scores_by_the_boundary_rule(load):
    """Answers built from the model's own greedy text: its first character (followed by more word characters, so
    wrong by the boundary rule unless a non-word character follows) and the whole first token."""
    model = load("tiny-llama")
    prompts = [with_bos(model, text_ids(model, q)) for q in ("ab:", "cd:", "efg:")]
    outs = greedy_continuations(model, prompts, 3)
    texts = [model.tokenizer.decode(o) for o in outs]
    answers = [t.lstrip(" ")[:1] or "x" for t in texts]
    right, given, whole = graded(model, prompts, answers, 3)
    assert list(whole) == texts  # every new token, decoded: anyone can re-score
    assert list(right) == [answer_correct(t, a) for t, a in zip(texts, answers)]
    for t, a, ok, g in zip(texts, answers, right, given):
        stripped = t.lstrip(" ")
        assert ok == (stripped.startswith(a) and not (stripped[1:2].isalnum() or stripped[1:2] in "_-'"))
        assert (g == a) if ok else (stripped.startswith(g) and g != a)
