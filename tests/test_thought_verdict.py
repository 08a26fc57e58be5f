"""Issue 22's faithful verdict: answers end at a word boundary, whole continuations kept, gain recovered."""
from __future__ import annotations

import pytest
import torch

from icl_lens.model._greedy import greedy_continuations
from icl_lens.thought._evaluate import answer_correct, gain_recovered, graded
from icl_lens.thought._instruction_batches import text_ids, with_bos


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


def _key(job: str, *what) -> str:
    """Where the current default's result of ``job`` is cached."""
    from experiments.thought.cache import row_key
    from experiments.thought.settings import default_fit

    return row_key(job, default_fit(), *what)


def _current() -> dict:
    """The settings a cached row names when the current default computed it."""
    from experiments.thought.settings import default_setting
    from icl_lens.thought._defaults import DISTILL_LR

    return {**default_setting(), "distill": {"lr": DISTILL_LR}}


def _row(correct_patched: int, kl: float = 0.05, kept: float = 0.95, distilled: int = 20, seconds=(1.0, 30.0)) -> dict:
    n = 24
    correct = {"none": 0, "full": 20, "patched": correct_patched, "distilled": distilled, "steering": 3, "control": 0}
    return {"n_test": n, "correct": correct, "accuracy": {c: k / n for c, k in correct.items()},
            "outcomes": {c: [1] * k + [0] * (n - k) for c, k in correct.items()}, "continuations": {},
            "locality_kl": {"patched": kl, "distilled": 0.2, "steering": 0.3, "control": 0.5},
            "locality_kept": {"patched": kept, "distilled": 0.5, "steering": 0.5, "control": 0.5},
            "gain_recovered": {}, "seconds": {"patched": seconds[0], "distilled": seconds[1], "total": 40.0},
            **_current()}


def _got(k: int, n: int = 24) -> dict:
    """A composed task's result: ``k`` of ``n`` right (the first ``k`` queries)."""
    return {"accuracy": k / n, "correct": k, "n_test": n, "outcomes": [1] * k + [0] * (n - k)}


def test_the_four_targets_are_read_from_the_rows():
    """Ten tasks at full strength meet every target; one task's locality KL above 0.1, a distillation only 10×
    slower, an old-verdict row and a composed task at 0.75 of its single accuracy each flip one verdict; the
    joint fit, where cached, has its own row and verdict."""
    from experiments.thought.settings import choose_strength, earlier_strength_choice
    from experiments.thought.targets import targets_lines

    tasks = [f"t{i}" for i in range(10)]
    good = {_key("table", t): _row(20) for t in tasks}
    single = {**_got(20), "locality": {"kl": 0.04, "accuracy": 0.97}}
    good[_key("compose", "t0+t1")] = {**_current(), "tasks": ["t0", "t1"], "locality": {"kl": 0.05, "accuracy": 0.95},
                             "per_task": {"t0": {**_got(20), "single": single},
                                          "t1": {**_got(20), "single": single}}}
    verdicts = [line.rsplit("|", 2)[1].strip() for line in targets_lines({"m": good}, ["m"], tasks)
                if line.startswith("| ") and "| m | test |" in line]
    assert verdicts == ["met"] * 4  # no joint fit cached: one row for the edits added
    fresh = [line for line in targets_lines({"m": good}, ["m"], tasks) if "| m | fresh (scored once) |" in line]
    assert len(fresh) == 4 and all("not measured" in line for line in fresh)  # no fresh row: not measured
    both = {**good, **{_key("fresh", t): _row(10 if t == "t0" else 20) for t in tasks}}
    fresh = [line.rsplit("|", 2)[1].strip() for line in targets_lines({"m": both}, ["m"], tasks)
             if "| m | fresh (scored once) |" in line]
    assert fresh[:3] == ["missed", "met", "missed"]  # own verdicts: t0 at half of full (9 of 10; 0.42 below distilled)
    joint = {"locality": {"kl": 0.06, "accuracy": 0.9}, "per_task": {"t0": _got(20), "t1": _got(20)}}
    good[_key("compose", "t0+t1")] = {**good[_key("compose", "t0+t1")], "joint": joint}
    lines = [line for line in targets_lines({"m": good}, ["m"], tasks) if line.startswith("| ") and "| m | test |" in line]
    assert [line.rsplit("|", 2)[1].strip() for line in lines] == ["met"] * 5
    assert "(one joint fit)" in lines[4] and "t0 1.00 (identical answers on all 24)" in lines[4] and "KL 0.060 at once" in lines[4]
    bad = {**good, _key("table", "t3"): _row(20, kl=0.2), _key("table", "t4"): _row(20, seconds=(3.0, 30.0))}
    bad[_key("compose", "t0+t1")] = {**good[_key("compose", "t0+t1")], "per_task": {**good[_key("compose", "t0+t1")]["per_task"],
                                                                  "t0": {**_got(15), "single": single}}}
    old = dict(bad[_key("table", "t5")])
    del old["continuations"]  # scored before the boundary verdict: not counted
    bad[_key("table", "t5")] = old
    verdicts = [line.rsplit("|", 2)[1].strip() for line in targets_lines({"m": bad}, ["m"], tasks)
                if line.startswith("| ") and "| m | test |" in line]
    assert verdicts == ["missed", "missed", "missed", "missed", "met"]  # 9 of 9 tasks < 10 needed; KL; 10×; 0.75
    bad[_key("compose", "t0+t1")]["joint"] = {**joint, "per_task": {**joint["per_task"], "t1": _got(17)}}
    verdicts = [line.rsplit("|", 2)[1].strip() for line in targets_lines({"m": bad}, ["m"], tasks)
                if line.startswith("| ") and "| m | test |" in line]
    assert verdicts[4] == "missed"  # the joint fit's t1 at 0.85 of its single accuracy, lower bound below 0.8
    from experiments.thought.cache import row_key
    from experiments.thought.settings import default_fit

    earlier = row_key("table", default_fit().replace(preserve_strength=0.0), "t6")  # an earlier default's row
    stale = {**{k: v for k, v in good.items() if k != _key("table", "t6")}, earlier: good[_key("table", "t6")],
             _key("table", "t7"): {**good[_key("table", "t7")], "distill": {"lr": 1.0}}}  # another distillation rate
    line = next(line for line in targets_lines({"m": stale}, ["m"], tasks) if line.startswith("| accuracy")
                and "| m | test |" in line)
    assert "8 of 8 tasks" in line and line.rsplit("|", 2)[1].strip() == "missed"  # not counted as the default's
    assert choose_strength({0.0: (1.0, 0.5), 1.0: (1.05, 0.2), 10.0: (1.5, 0.01)}) == 1.0
    assert choose_strength({0.0: (1.0, 0.5), 1.0: (1.2, 0.2)}) == 0.0
    assert choose_strength({0.0: (0.02, 0.5), 1.0: (0.1, 0.2), 10.0: (0.13, 0.01)}) == 1.0  # absolute slack 0.1
    assert earlier_strength_choice({0.0: (0.02, 0.5), 1.0: (0.1, 0.2)}) == 0.0  # relative: 1.1 × 0.02


def test_every_composed_group_is_counted_with_its_own_locality():
    """Issue 38 asks for two pairs per model and four tasks at once: the two-task row counts the tasks of every
    pair (a second pair's miss flips it) and names each pair's locality at once; four tasks have rows of their own."""
    from experiments.thought.targets import targets_lines

    tasks = [f"t{i}" for i in range(10)]
    single = {**_got(20), "locality": {"kl": 0.04, "accuracy": 0.97}}

    def group(names, kl, got=20):
        return {**_current(), "tasks": list(names), "locality": {"kl": kl, "accuracy": 0.9},
                "per_task": {t: {**_got(got if t == names[-1] else 20), "single": single} for t in names}}

    cache = {**{_key("table", t): _row(20) for t in tasks}, _key("compose", "t0+t1"): group(["t0", "t1"], 0.05),
             _key("compose", "t2+t3"): group(["t2", "t3"], 0.07)}

    def rows(c, words):
        return [line for line in targets_lines({"m": c}, ["m"], tasks) if line.startswith(f"| {words} tasks at once")
                and "| m | test |" in line]

    (two,) = rows(cache, "two")
    assert two.rsplit("|", 2)[1].strip() == "met" and "4 of 4 tasks in 2 groups" in two
    assert "t0+t1: locality KL 0.050 at once" in two and "t2+t3: locality KL 0.070 at once" in two
    assert rows(cache, "four") == []
    cache[_key("compose", "t2+t3")] = group(["t2", "t3"], 0.07, got=15)  # the second pair's t3 at 0.75
    (two,) = rows(cache, "two")
    assert two.rsplit("|", 2)[1].strip() == "missed" and "3 of 4 tasks in 2 groups" in two
    cache[_key("compose", "t0+t1+t2+t3")] = group(["t0", "t1", "t2", "t3"], 0.2)
    (four,) = rows(cache, "four")
    assert four.rsplit("|", 2)[1].strip() == "met" and "4 of 4 tasks in 1 group (" in four and "KL 0.200 at once" in four


def test_the_default_preserve_strength_is_the_rules_choice_on_the_committed_selection():
    """Wherever the committed caches hold the third selection stage for every strength with the current preserve
    texts, the default strength is what the rule picks from them (the mean over the models and selection tasks
    that hold it)."""
    import json
    from pathlib import Path

    from experiments.thought.settings import PRESERVE_STRENGTHS, SELECT_TASKS, choose_strength
    from experiments.thought.targets import rule_scores, strength_scores
    from icl_lens.thought._defaults import DEFAULT_PRESERVE_STRENGTH
    from icl_lens.thought import PRESERVE_SET

    caches = {p.name: json.loads(p.read_text()) for p in sorted(Path("reports").glob("eval_thought.*.json"))}
    got = strength_scores(caches, SELECT_TASKS, PRESERVE_SET)
    if set(got) != set(PRESERVE_STRENGTHS) or len({len(x["answer"]) for x in got.values()}) != 1:
        assert DEFAULT_PRESERVE_STRENGTH == 0.0  # no complete selection: the penalty stays off
        return
    assert len(got[0.0]["answer"]) == len(SELECT_TASKS) * len(caches)  # every model, every selection task
    assert DEFAULT_PRESERVE_STRENGTH == choose_strength(rule_scores(got))


def test_the_default_distillation_rate_is_the_rules_choice_on_the_committed_selection():
    """The default peak learning rate of context distillation is what choose_lr picks from the committed
    distillation stage (every model, every DISTILL_TASKS task, every rate of the grid)."""
    import json
    from pathlib import Path

    from experiments.thought.settings import DISTILL_LRS, DISTILL_TASKS, choose_lr
    from experiments.thought.targets import distill_lr_scores
    from icl_lens.thought._defaults import DISTILL_LR

    caches = {p.name: json.loads(p.read_text()) for p in sorted(Path("reports").glob("eval_thought.*.json"))}
    got = distill_lr_scores(caches)
    assert set(got) == set(DISTILL_LRS) and all(len(x) == len(DISTILL_TASKS) * len(caches) for x in got.values())
    assert DISTILL_LR == choose_lr({lr: sum(x) / len(x) for lr, x in got.items()})
    assert choose_lr({1e-4: 0.5, 3e-4: 0.4, 1e-3: 0.4}) == 3e-4 and choose_lr({1e-4: 0.1, 3e-4: 0.4}) == 1e-4
