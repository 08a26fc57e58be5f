"""Issue 38's method rows in the thought evaluation: the null-space stage and its rule, the untouched locality rows
(controls over five seeds, the anchor) and distillation on equal terms, computed by the jobs the command runs and
rendered by the report's sections (tiny-llama, a short task: its context is 256 byte tokens)."""
from __future__ import annotations

import pytest

from experiments.thought.cache import row_key
from experiments.thought.method import (CONTROL_SEEDS, DEFAULT_LABEL, DISTILL_MET, DISTILL_MIN_TASKS,
                                        DISTILL_PRESERVE_WEIGHTS, NULL_SPACE_GRID, accuracy_verdict,
                                        choose_null_space, equal_distill_lines, equal_distill_plan, null_space_lines,
                                        untouched_lines)
from experiments.thought.settings import choose_strength, default_fit
from icl_lens.thought import PRESERVE_SET, Task

PAIRS = (("Spain:", "Madrid"), ("Peru:", "Lima"), ("Chad:", "N'Djamena"), ("Cuba:", "Havana"), ("Iran:", "Tehran"),
         ("Mali:", "Bamako"), ("Oman:", "Muscat"))
SHORT = Task("short", "Capitals:\nFrance: Paris\n", train=PAIRS[:5], test=PAIRS[5:], fresh=PAIRS[5:6])


def test_the_null_space_rule():
    scores = {DEFAULT_LABEL: (0.20, 0.08), "a": (0.25, 0.05), "b": (0.40, 0.01), "c": (0.30, 0.08)}
    assert choose_null_space(scores) == "a"  # b's answer KL is past the default's + 0.1
    assert choose_null_space({DEFAULT_LABEL: (0.2, 0.05), "a": (0.2, 0.05)}) == DEFAULT_LABEL  # a tie keeps it
    with pytest.raises(ValueError, match="default"):
        choose_null_space({"a": (0.1, 0.1)})


def test_method_jobs_store_and_report_their_rows(tmp_path, one_thread):
    from experiments.thought.jobs import ModelJobs

    jobs = ModelJobs("tiny-llama", tmp_path / "eval_thought.md", "test", n_train=5, select_fit=3, select_validate=2,
                     distill_steps=4, null_space_grid=NULL_SPACE_GRID[:2])
    jobs.null_space(SHORT, 0)  # the default (the strength stage's row)
    jobs.null_space(SHORT, 1)
    lines = "\n".join(null_space_lines({"tiny-llama": jobs.results}, ["short"]))
    assert "**Null-space edit**" in lines and "| tiny-llama | **by the rule** |" in lines
    ns = jobs.results[row_key("null_space", default_fit().replace(**NULL_SPACE_GRID[1]), PRESERVE_SET, "short")]
    assert ns["null_space"] == NULL_SPACE_GRID[1]["null_space"] and ns["fit"]["null_space"] == ns["null_space"]

    jobs.untouched(SHORT)
    row = jobs.results[row_key("untouched", default_fit(), "short")]
    assert list(row["controls"]) == [str(s) for s in CONTROL_SEEDS]
    assert len({c["kl_all"] for c in row["controls"].values()}) == len(CONTROL_SEEDS)  # five different draws
    assert row["patched"]["kl_all"] > 0 and row["anchor"]["kl_all"] > 0
    jobs.equal_distill(SHORT)
    d = jobs.results[row_key("equal_distill", default_fit(), PRESERVE_SET, "short")]
    stage = {float(w): (v["validation_kl"], v["text_kl"]) for w, v in d["stage"].items()}
    assert set(stage) == set(DISTILL_PRESERVE_WEIGHTS) and d["weight"] == choose_strength(stage)
    assert d["steps"] == d["stage"][f"{d['weight']:g}"]["chosen_step"] and d["settings"]["steps"] == d["steps"]
    assert d["per_task"]["n_test"] == 2 and d["per_task_fresh"]["n_test"] == 1 and "kl_all" in d["untouched"]
    text = "\n".join(untouched_lines({"tiny-llama": jobs.results}, ["tiny-llama"], ["short"]))
    assert "**Locality nobody tuned on**" in text and "| tiny-llama | short | patched |" in text
    assert "| tiny-llama | short | distilled (equal terms) |" in text and "target met on" in text
    selection = "\n".join(equal_distill_lines({"tiny-llama": jobs.results}, ["tiny-llama"], ["short"]))
    for w in DISTILL_PRESERVE_WEIGHTS:
        r = d["stage"][f"{w:g}"]
        assert (f"| tiny-llama | short | {w:g} | {r['validation_kl']:.4f} | {r['text_kl']:.4f} | "
                f"{r['chosen_step']} / {r['steps_run']} |") in selection


@pytest.mark.parametrize("model", ["gemma-3-270m", "smollm2-135m"])
def test_the_distillation_plan_follows_the_issues_rule(model):
    """On the shipped rows: every task the default patch misses (fresh, in range), in task order, then tasks it
    meets, at least DISTILL_MET and as many as make DISTILL_MIN_TASKS; no task it cannot be judged on."""
    import json
    from pathlib import Path

    from icl_lens.thought import SHIPPED_TASKS

    caches = {model: json.loads(Path(f"reports/eval_thought.{model}.json").read_text())}
    tasks = list(SHIPPED_TASKS)
    verdicts = {t: accuracy_verdict(caches, model, t) for t in tasks}
    missed = [t for t in tasks if verdicts[t] == "missed"]
    met = [t for t in tasks if verdicts[t] == "met"]
    plan = equal_distill_plan(caches, model, tasks)
    assert missed and plan[:len(missed)] == missed
    assert plan[len(missed):] == met[:len(plan) - len(missed)]
    assert len(plan) == len(missed) + min(len(met), max(DISTILL_MET, DISTILL_MIN_TASKS - len(missed)))


def test_equal_distillation_runs_where_it_is_told():
    """``--method`` without tasks: the untouched set on every task, distillation on the plan's tasks only."""
    from experiments.thought.jobs import job_list

    jobs = job_list(["a", "b", "c"], [], table=False, method_tasks=["a", "b", "c"], equal_distill_tasks=["c", "a"])
    assert [t for j, t, _ in jobs if j == "untouched"] == ["a", "b", "c"]
    assert [t for j, t, _ in jobs if j == "equal_distill"] == ["c", "a"]
    assert [t for j, t, _ in job_list(["a"], [], table=False, method_tasks=["a"]) if j == "equal_distill"] == ["a"]


def test_the_distillation_table_shows_apart_what_its_sentence_counts_apart():
    """The verdict sentence counts the untouched-set KL by its values; the table prints them to 4 decimals, so two
    KLs the sentence tells apart (0.0872 and 0.0865, both 0.087 at 3 decimals) are not shown as a tie."""
    fit = default_fit()
    stage = {"validation_kl": 0.2, "text_kl": 0.06, "chosen_step": 10, "steps_run": 40, "seconds": 9.0}
    cache = {
        row_key("table", fit, "short"): {"accuracy": {"patched": 0.78}, "seconds": {"patched": 61.0}},
        row_key("untouched", fit, "short"): {"patched": {"kl_all": 0.08720, "kept": {"a": 0.75}}},
        row_key("equal_distill_weight", fit, PRESERVE_SET, "10", "short"): stage,
        row_key("equal_distill", fit, PRESERVE_SET, "short"): {
            "weight": 10.0, "steps": 10, "per_task": {"accuracy": 0.88}, "per_task_fresh": {"accuracy": 0.60},
            "untouched": {"kl_all": 0.08654, "kept": {"a": 0.75}},
            "seconds": {"distilled": 210.0, "selection": 4530.0}},
    }
    text = "\n".join(equal_distill_lines({"m": cache}, ["m"], ["short"]))
    assert "| m | short | 10, 10 | 78% / 88% | – / 60% | 0.0872 / 0.0865 | 75% / 75% | 61 / 210 (4530) |" in text
    assert ("at least as accurate on the test queries on 0 of 1 (model, task) pairs, has the lower or equal "
            "untouched-set KL on 0 of 1, and fits in no more time on 1 of 1") in text


def _distill_pair(fit, task: str, *, patched_acc: float, distilled_acc: float, patched_kl: float, distilled_kl: float,
                  patched_s: float, distilled_s: float) -> dict:
    """The three cached rows one (model, task) pair of distillation on equal terms is read from."""
    return {
        row_key("table", fit, task): {"accuracy": {"patched": patched_acc}, "seconds": {"patched": patched_s}},
        row_key("untouched", fit, task): {"patched": {"kl_all": patched_kl, "kept": {"a": 0.75}}},
        row_key("equal_distill_weight", fit, PRESERVE_SET, "1", task): {
            "validation_kl": 0.1, "text_kl": 0.05, "chosen_step": 100, "steps_run": 100, "seconds": 900.0},
        row_key("equal_distill", fit, PRESERVE_SET, task): {
            "weight": 1.0, "steps": 100, "per_task": {"accuracy": distilled_acc},
            "per_task_fresh": {"accuracy": distilled_acc}, "untouched": {"kl_all": distilled_kl, "kept": {"a": 0.75}},
            "seconds": {"distilled": distilled_s, "selection": 1000.0}},
    }


def test_the_summary_row_counts_distillation_on_equal_terms_as_the_report_does(tmp_path):
    """EVAL's claims row and the report's sentence come from one count (``equal_distill_counts``): a tie in accuracy
    or in untouched-set KL counts for the patch, and the verdict is *reproduced* only where all three hold on every
    pair, *not* where they hold on none."""
    import json

    from experiments.report import claims_summary
    from experiments.thought.method import equal_distill_counts, equal_distill_pairs

    fit = default_fit()
    tie = dict(patched_acc=0.9, distilled_acc=0.9, patched_kl=0.05, distilled_kl=0.05, patched_s=60.0, distilled_s=900.0)
    worse = dict(tie, patched_acc=0.8, patched_kl=0.2)

    def row(**pairs):
        cache = {k: v for task, kw in pairs.items() for k, v in _distill_pair(fit, task, **kw).items()}
        (tmp_path / "eval_thought.m.json").write_text(json.dumps(cache))
        counts = equal_distill_counts(equal_distill_pairs({"m": cache}, ["m"], list(pairs)))
        return counts, next(r for r in claims_summary(tmp_path) if "context distillation on equal terms" in r["claim"])

    counts, summary = row(plural=tie, past_tense=worse)
    assert counts == {"pairs": 2, "accuracy": 1, "locality": 1, "time": 2, "all": 1}
    assert summary["verdict"] == "partly"
    assert summary["number"].startswith("the patch is at least as accurate on the test queries on 1 of 2 (model, task) "
                                        "pairs, has the lower or equal untouched-set KL on 1 of 2, and fits in no "
                                        "more time on 2 of 2; all three on 1 of 2")
    sentence = "\n".join(equal_distill_lines({"m": json.loads((tmp_path / "eval_thought.m.json").read_text())}, ["m"],
                                             ["plural", "past_tense"]))
    assert summary["number"].split(";")[0] in sentence
    assert row(plural=tie, past_tense=tie)[1]["verdict"] == "reproduced"
    assert row(plural=tie, past_tense=dict(tie, patched_kl=0.2))[1]["verdict"] == "partly"  # as accurate, less local
    assert row(plural=worse, past_tense=dict(tie, patched_s=1000.0))[1]["verdict"] == "not"
