"""The thought report's one counting rule (issue 38): every count calls ``experiments.thought.rule.target_rule``;
fresh queries split by what they test; add's unordered pairs one sampling unit; near ties named."""
from __future__ import annotations

import json
import re

import pytest

from experiments.thought.rule import (
    NUMBER_RANGES,
    PARTS,
    fresh_parts,
    near_tie,
    query_units,
    range_parts,
    ratio_rule,
    target_rule,
)
from icl_lens.thought.tasks import SHIPPED_TASKS, load_task


def _key(job: str, *what) -> str:
    from experiments.thought.cache import row_key
    from experiments.thought.settings import default_fit

    return row_key(job, default_fit(), *what)


def _row(n: int, full: int, patched: int, **extra) -> dict:
    """A row of ``n`` queries: the full prompt right on the first ``full``, the patch on the first ``patched``."""
    from experiments.thought.settings import default_setting
    from icl_lens.thought._defaults import DISTILL_LR

    correct = {"none": 0, "full": full, "patched": patched, "steering": 0, "control": 0}
    return {**default_setting(), "distill": {"lr": DISTILL_LR}, "n_train": 32, "n_test": n, "steering_layer": 1,
            "seconds": {"patched": 1.0, "total": 2.0}, "continuations": {}, "correct": correct,
            "accuracy": {c: k / n for c, k in correct.items()},
            "outcomes": {c: [1] * k + [0] * (n - k) for c, k in correct.items()},
            "locality_kl": {"patched": 0.01, "steering": 0.3, "control": 0.5},
            "locality_kept": {"patched": 1.0, "steering": 0.5, "control": 0.5}, **extra}


def test_the_rule_needs_the_point_and_the_lower_bound():
    """18 of the full prompt's 20 on 24 queries: the point estimate 0.90 passes, the lower bound (≈ 0.75) does not;
    72 of 80 on 96 queries passes both; full below 50% is n/a whatever the ratio."""
    small, large = target_rule(_row(24, 20, 18)), target_rule(_row(96, 80, 72))
    assert small.ratio == pytest.approx(0.9) and small.lower < 0.8 and not small.met and small.verdict == "missed"
    assert large.ratio == pytest.approx(0.9) and large.lower >= 0.8 and large.met and large.verdict == "met"
    assert target_rule(_row(24, 11, 11)).verdict.startswith("n/a")
    no_outcomes = {k: v for k, v in _row(96, 80, 80).items() if k != "outcomes"}
    assert not target_rule(no_outcomes).met and "no interval" in target_rule(no_outcomes).text()


def test_identical_answers_are_named_not_shown_as_an_interval():
    same = target_rule(_row(17, 17, 17))
    assert same.identical and same.ci == (1.0, 1.0) and same.text() == "1.00 (identical answers on all 17)"
    assert "identical" not in target_rule(_row(96, 80, 76)).text()
    assert re.fullmatch(r"0\.95 \[0\.\d\d–\d\.\d\d\]", target_rule(_row(96, 80, 76)).text())


def test_fresh_add_resamples_unordered_pairs_and_ranges_match_the_builder():
    """a + b and b + a are one unit; the number ranges are the builder's generators' and hold every demonstration,
    train and test query; the fresh queries beyond them are out of range, the task's leftovers in range."""
    from experiments.build_tasks import _successors, _sums

    fresh = [q for q, _ in load_task("add").fresh]
    units = query_units("add", "fresh", len(fresh))
    assert len(set(units)) < len(units)  # fresh add repeats pairs as a + b / b + a
    for q, u in zip(fresh, units):
        a, b = (int(x) for x in re.findall(r"\d+", q))
        assert u == f"{min(a, b)}+{max(a, b)}"
    assert query_units("plural", "fresh", 96) is None and query_units("add", "fresh", 3) is None
    numbers = lambda pairs: [[int(x) for x in re.findall(r"\d+", q)] for q, _ in pairs]  # noqa: E731
    assert NUMBER_RANGES["add"] == tuple((min(c), max(c)) for c in zip(*numbers(_sums())))
    assert NUMBER_RANGES["plus_one"] == tuple((min(c), max(c)) for c in zip(*numbers(_successors())))
    for name in SHIPPED_TASKS:
        task = load_task(name)
        queries = [q for q, _ in task.train + task.test]
        if name not in NUMBER_RANGES:
            assert not any(re.search(r"\d", q) for q in queries + [q for q, _ in task.fresh]), name
            assert set(range_parts(name)) == {PARTS[0]}
            continue
        assert set(range_parts(name, "test")) == set(range_parts(name, "train")) == {PARTS[0]}, name
        parts = range_parts(name)
        out = [q for (q, _), p in zip(task.fresh, parts) if p == PARTS[1]]
        assert out and all(any(not lo <= x <= hi for x, (lo, hi) in zip(nums, NUMBER_RANGES[name]))
                           or len(nums) != len(NUMBER_RANGES[name]) for nums in numbers([(q, "") for q in out]))
    assert range_parts("add").count(PARTS[0]) == 9 and range_parts("plus_one").count(PARTS[0]) == 17
    assert range_parts("number_words").count(PARTS[0]) == 27  # the leftovers below 100; 0 and the rest beyond


def test_a_fresh_row_is_read_in_range_apart_from_out_of_range():
    task = load_task("plus_one")
    parts = range_parts("plus_one")
    n = len(task.fresh)
    good = [1 if p == PARTS[0] else 0 for p in parts]  # right on every in-range query, on none beyond
    r = {**_row(n, n, 0, task="plus_one", split="fresh"),
         "outcomes": {"none": [0] * n, "full": [1] * n, "patched": good, "steering": [0] * n, "control": [0] * n}}
    r["correct"] = {c: sum(v) for c, v in r["outcomes"].items()}
    r["accuracy"] = {c: k / n for c, k in r["correct"].items()}
    split = fresh_parts(r)
    assert split[PARTS[0]]["n_test"] == 17 and target_rule(split[PARTS[0]]).met
    assert split[PARTS[1]]["n_test"] == n - 17 and target_rule(split[PARTS[1]]).ratio == 0.0
    from experiments.thought.targets import fresh_lines, targets_lines

    caches = {"m": {_key("fresh", "plus_one"): r, _key("table", "plus_one"): {**r, "split": "test"}}}
    rows = [line for line in fresh_lines(caches, ["m"], ["plus_one"]) if line.startswith("| m |")]
    assert len(rows) == 2 and "| in range | 17 |" in rows[0] and "| 1.00 (identical answers on all 17) | met |" in rows[0]
    assert f"| out of range | {n - 17} |" in rows[1] and "| missed (not a target) |" in rows[1]
    lines = [line for line in targets_lines(caches, ["m"], ["plus_one"]) if "| m | fresh" in line]
    assert "accuracy (in range)" in lines[0] and "| 1 of 1 tasks" in lines[0]
    assert "accuracy (out of range: generalisation, not a target)" in lines[1] and "| 0 of 1 tasks" in lines[1]


def test_every_count_of_the_report_calls_the_one_rule(tmp_path):
    """The planted fault: one table row meets the point rule (0.90) and misses the lower bound (≈ 0.75), on the test
    and the fresh queries, and one composed task keeps 0.90 of its single accuracy at a lower bound below 0.8. Every
    place that counts or states a verdict says missed: the targets table, the fresh table, the test table, its
    "read from the table" line, the composed table and the one-screen summary."""
    from experiments.report import claims_summary
    from experiments.thought.run import write_report
    from experiments.thought.settings import default_setting
    from experiments.thought.targets import compose_lines, fresh_lines, targets_lines

    row = _row(24, 20, 18, task="t", split="test")
    fresh = {**row, "split": "fresh"}
    got = lambda k: {"accuracy": k / 24, "correct": k, "n_test": 24, "outcomes": [1] * k + [0] * (24 - k)}  # noqa: E731
    single = {**got(20), "locality": {"kl": 0.01, "accuracy": 1.0}}
    compose = {**default_setting(), "tasks": ["t", "t"], "locality": {"kl": 0.01, "accuracy": 1.0},
               "per_task": {"t": {**got(18), "single": single}}}
    cache = {_key("table", "t"): row, _key("fresh", "t"): fresh, _key("compose", "t+t"): compose}
    caches = {"m": cache}
    lines = targets_lines(caches, ["m"], ["t"])
    accuracy = [line for line in lines if line.startswith("| accuracy")]
    assert len(accuracy) == 2 and all("| 0 of 1 tasks" in line and "missed: t" in line for line in accuracy)
    assert "| 0 of 1 tasks in 1 group (t 0.90 [" in next(line for line in lines if line.startswith("| two tasks") and "| m | test |" in line)
    assert "| missed |" in next(line for line in fresh_lines(caches, ["m"], ["t"]) if line.startswith("| m |"))
    assert "0.90 [" in "".join(compose_lines(caches, ["m"], "test")) and " missed " in "".join(compose_lines(caches, ["m"], "test"))
    (tmp_path / "eval_thought.m.json").write_text(json.dumps(cache))
    text = write_report(tmp_path / "eval_thought.md", ["m"], ["t"], "x")
    test_row = next(line for line in text.splitlines() if line.startswith("| m | t | 0%"))
    assert "| missed |" in test_row and "- m: target met on 0 of 1 tasks where full ≥ 50%; missed: t." in text
    claim = next(r for r in claims_summary(tmp_path) if r["claim"].startswith("A thought patch fitted"))
    assert claim["verdict"] == "not" and "m: 0 of 1 measured on the fresh queries in range" in claim["number"]


def test_near_ties_are_read_from_the_paired_differences():
    best = {("m", t): 0.10 + 0.01 * i for i, t in enumerate("abcd")}
    close = {u: v + (0.002 if i % 2 else -0.001) for i, (u, v) in enumerate(best.items())}
    far = {u: v + 0.05 for u, v in best.items()}
    assert near_tie(best, close) and not near_tie(best, far)
    assert not near_tie({("m", "a"): 0.1}, {("m", "a"): 0.1})  # one unit: nothing to resample
    with pytest.raises(ValueError, match="differ in length"):
        ratio_rule([1, 0], [1])


def test_selection_tables_name_near_ties():
    """The first selection stage's table: a setting within the paired noise of the lowest is marked a near tie and
    named in the sentence under the table; one clearly above it is not."""
    from experiments.thought.sections import selection_lines
    from experiments.thought.settings import SELECT_TASKS

    def rows(ridge, kls):
        return {f"select/{ridge}/{t}": {"kind": "both+down", "ridge": ridge, "query_prefix": "\n", "task": t,
                                        "validation_kl": kl, "n_fit": 24, "n_validate": 8}
                for t, kl in zip(SELECT_TASKS, kls)}

    best = [0.10, 0.20, 0.05, 0.15]
    caches = {"m": {**rows(8.0, best), **rows(2.0, [0.101, 0.199, 0.052, 0.149]),
                    **rows(0.5, [x + 0.05 for x in best])}}
    lines = selection_lines(caches, {}, SELECT_TASKS)
    marks = {line.split("|")[1].strip(): line.rsplit("|", 2)[1].strip() for line in lines if line.startswith("| both")}
    assert marks == {"both+down, ridge 8, prefix '\\n'": "lowest", "both+down, ridge 2, prefix '\\n'": "near tie",
                     "both+down, ridge 0.5, prefix '\\n'": ""}
    assert "Near tie" in lines[-1] and "ridge 2" in lines[-1] and "ridge 0.5" not in lines[-1]


def test_one_locality_rule_and_the_untouched_target_needs_accuracy_held():
    """The table's locality and the untouched set's call the same rule; on the untouched set the target also needs
    the task's fresh in-range row to meet the target rule (a locality-clean patch that lost its answers fails)."""
    from collections import defaultdict

    from experiments.thought.cache import row_key
    from experiments.thought.method import CONTROL_SEEDS, untouched_lines
    from experiments.thought.rule import locality_rule
    from experiments.thought.settings import default_fit
    from experiments.thought.targets import locality_met, split_key

    assert locality_rule(0.95, 0.05) and not locality_rule(0.85, 0.05) and not locality_rule(0.95, 0.2)
    assert not locality_rule(0.95, 0.05, control_kl=0.04) and locality_rule(0.95, 0.05, control_kl=0.06)
    assert locality_met(_row(96, 80, 76)) and not locality_met(_row(96, 80, 76, locality_kl={
        "patched": 0.01, "control": 0.005}))

    loc = {"kl_all": 0.02, "kl": defaultdict(lambda: 0.02), "kept": {"a": 1.0, "b": 0.95}}  # every format's KL
    untouched = {"controls": {str(s): loc for s in CONTROL_SEEDS}, "anchor": loc, "patched": loc}
    key = row_key("untouched", default_fit(), "capitals")
    for fresh, count in ((_row(96, 80, 76, task="capitals", split="fresh"), "met on 1 of 1"),
                         (_row(96, 80, 40, task="capitals", split="fresh"), "met on 0 of 1"),
                         (None, "met on 0 of 1")):
        cache = {key: untouched, **({split_key("fresh", "capitals"): fresh} if fresh else {})}
        text = "\n".join(untouched_lines({"m": cache}, ["m"], ["capitals"]))
        assert f"**patched: target met on {count[7:]}" in text, (count, text)
