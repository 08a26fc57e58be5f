"""Report text comes from the run: the machine line is read from the machine, readings follow the numbers."""
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch

from experiments import lab
from experiments.report import machine, write_fragment
from experiments.thought import run as thought

from experiments import assemble_reports  # noqa: E402


def test_machine_line_is_read_from_the_machine():
    line = machine(load_before=1.25)
    assert f"{len(os.sched_getaffinity(0))} CPU cores usable of {os.cpu_count()}" in line
    assert f"torch {torch.__version__} with {torch.get_num_threads()} thread(s)" in line
    assert "load average 1.2 before / " in line and "GPU" not in line


def test_write_fragment(tmp_path):
    out = tmp_path / "new" / "bench_x.md"
    assert write_fragment(out, ["## X", "", "text", ""]) == "## X\n\ntext\n"
    assert out.read_text() == "## X\n\ntext\n"


def test_assembler_names_gpu_sections_from_machine_lines():
    cpu = "## A\n\nMachine: 2 CPU cores usable of 2 (x), load average 0.1\n"
    gpu = "## B on cuda\n\nMachine: 16 CPU cores usable of 16 (y); GPU NVIDIA H200\n"
    assert assemble_reports.gpu_line([cpu]) == "Sections measured on a GPU: none.\n"
    assert assemble_reports.gpu_line([cpu, gpu]) == "Sections measured on a GPU: B on cuda.\n"


def _lab_results(gru_slopes, test_mse: float, delta_mse: float = 0.003, softmax_slopes=(-0.5, -0.55, -0.48)):
    from experiments import lab_rules

    archs = ["softmax", "linear", "delta", "gru"]
    eq = pd.DataFrame([{"arch": a, "dtype": d, "rel_error_prediction": 1e-16 if d == "float64" else 1e-7,
                        "rel_error_residual": 1e-16 if d == "float64" else 1e-7}
                       for a in archs for d in ("float64", "float32")])
    conv = pd.DataFrame({"arch": archs, "alpha_mean_curve": [1.0, 0.95, 0.5, 0.1],
                         "norm_mse_at_n_train": [0.01, 0.15, delta_mse, 0.12], "norm_mse_at_n_max": [0.01, 0.1, 0.01, 0.1]})
    slopes = {"softmax": list(softmax_slopes), "linear": [-0.45, -0.5, -0.6], "delta": [-0.2, -0.3, -0.25],
              "gru": list(gru_slopes)}
    trend = {a: {"ns": [2, 4, 8], "seeds": [0, 1, 2], "drift_mean": [0.5, 0.4, 0.3], "slopes": v,
                 **lab_rules.trend_verdict(v)} for a, v in slopes.items()}
    claim = lab_rules.settling_claim(slopes)
    tp = pd.DataFrame({"K": [1, 64], "train_mse": [0.0, 0.08], "test_mse": [0.9, test_mse],
                       "no_context_test_mse": [0.5, 0.5], "contextual_test_mse": [0.01, 0.01]})
    state = {"softmax": lambda t: 80 * t, "linear": lambda t: 11520, "delta": lambda t: 10240, "gru": lambda t: 1280}
    mc = pd.DataFrame([{"arch": a, "context_length": t, "us_per_token_min": 100.0} for a in archs for t in (32, 256)])
    return (SimpleNamespace(to_frame=lambda: eq), SimpleNamespace(summary=lambda: conv, n_max=64, n_train=16),
            trend, claim, SimpleNamespace(summary=lambda: tp),
            SimpleNamespace(to_frame=lambda: mc, bytes_at=lambda a, t: state[a](t)),
            SimpleNamespace(rows=[{"max_rel_error": 5e-16}]))


def test_lab_findings_follow_the_numbers():
    text = "\n".join(lab.findings(*_lab_results(gru_slopes=(0.0, 0.05, -0.02), test_mse=0.1)))
    assert "softmax slope -0.51 [" in text and "(converges; drift 2→4 0.50, 4→8 0.40, 8→16 0.30; 3 seed(s))" in text
    assert "gru slope +0.01 [" in text and "(does not converge;" in text and "delta slope -0.25 [" in text
    assert "softmax converges, GRU does not converge" in text and "**reproduced** by the rule" in text
    assert "delta rule's in-context MSE at 16 pairs is 0.003 (below 0.2; softmax 0.010)" in text and "supported here" in text
    assert "0.100 is below no context (0.500) and above the prompt in context" in text
    other = "\n".join(lab.findings(*_lab_results(gru_slopes=(-0.5, -0.6, -0.55), test_mse=0.6, delta_mse=0.5)))
    assert "gru slope -0.55 [" in other and "**not reproduced** by the rule" in other
    assert "0.500 (not below 0.2;" in other and "**not** supported here" in other
    assert "0.600 is above no context" in other
    partly = "\n".join(lab.findings(*_lab_results(gru_slopes=(0.0, 0.05, -0.02), test_mse=0.1,
                                                    softmax_slopes=(-0.3, -0.28, -0.31))))
    assert "softmax does not converge, GRU does not converge" in partly and "**partly reproduced** by the rule" in partly


def _thought_row(n_test: int, correct: dict[str, int]) -> dict:
    from experiments.thought.settings import default_setting

    return {**default_setting(), "n_train": 4, "n_test": n_test, "seconds": 9.0, "steering_layer": 1,
            "accuracy": {c: k / n_test for c, k in correct.items()}, "correct": correct,
            "outcomes": {c: [1] * k + [0] * (n_test - k) for c, k in correct.items()},
            "locality_kl": {"patched": 0.25, "control": 1.5, "steering": 0.125},
            "locality_accuracy": {"patched": 1.0, "control": 0.5, "steering": 0.75}}


def _table_key(task: str) -> str:
    """Where the current default's test-query row of ``task`` is cached."""
    from experiments.thought.cache import row_key
    from experiments.thought.settings import default_fit

    return row_key("table", default_fit(), task)


def test_thought_report_names_the_runs_and_reads_the_target_from_the_numbers(tmp_path):
    """The target is decided by the rule, per row: 72/80 = 0.90 (lower bound above 0.8) is met, 68/80 missed, full <
    50% n/a."""
    out = tmp_path / "eval_thought.md"
    base = {"none": 0, "control": 0, "steering": 3}
    cache = {"runs": {"`python -m experiments.thought --models m` on 3 CPU cores": [_table_key("t"), _table_key("u")]},
             _table_key("t"): _thought_row(96, {**base, "full": 80, "patched": 72}),
             _table_key("u"): _thought_row(96, {**base, "full": 80, "patched": 68})}
    (tmp_path / "eval_thought.m.json").write_text(json.dumps(cache))
    (tmp_path / "eval_thought.n.json").write_text(json.dumps({_table_key("t"): _thought_row(24, {**base, "full": 11,
                                                                                           "patched": 2})}))
    text = thought.write_report(out, ["m", "n"], ["t", "u"], "python -m experiments.thought --report-only")
    assert "- m: 2 result(s) by `python -m experiments.thought --models m` on 3 CPU cores" in text
    assert "- n: command and machine not recorded" in text
    rows = {tuple(c.strip().removesuffix(" †") for c in line.split("|")[1:3]): line for line in text.splitlines() if line.startswith("| m |")
            or line.startswith("| n |")}
    assert "| 0.90 [0.83–0.96] | met |" in rows[("m", "t")] and "| 0.85 [" in rows[("m", "u")]
    assert "| missed |" in rows[("m", "u")]
    assert "n/a (full < 50%)" in rows[("n", "t")]
    assert "| 0.250 / 1.500 / 0.125 |" in rows[("m", "t")]
    assert "- m: target met on 1 of 2 tasks where full ≥ 50%; missed: u." in text
    assert "**Not evaluated** on n with the current default: u." in text


def test_finetune_alignment_verdict_rule():
    """The language models' verdict (one model each: the unit is the prompt)."""
    from experiments.finetune_alignment import ALIGNED, verdict
    from icl_lens.stats._bootstrap import MeanCI

    control = MeanCI(0.0, -0.02, 0.03, 64)
    assert verdict(MeanCI(ALIGNED + 0.1, ALIGNED, ALIGNED + 0.2, 64), control) == "holds"
    assert verdict(MeanCI(0.2, 0.1, 0.3, 64), control) == "weak"
    assert verdict(MeanCI(0.06, 0.04, 0.08, 64), MeanCI(0.0, -0.01, 0.01, 64)) == "negligible"
    assert verdict(MeanCI(0.05, 0.02, 0.08, 64), control) == "no"  # overlaps the control
    assert verdict(MeanCI(-0.3, -0.4, -0.2, 64), MeanCI(-0.6, -0.7, -0.5, 64)) == "no"  # not above 0


def test_finetune_alignment_eval_quick(tmp_path):
    """The whole command in --quick mode: every section present, JSON beside the Markdown, readings computed, the
    per-seed cells and the claim's wording by the rules (one seed: undecided)."""
    from experiments import finetune_alignment, lab_rules

    out = tmp_path / "eval_finetune_alignment.md"
    before = torch.get_num_threads()
    try:
        finetune_alignment.main(["--quick", "--out", str(out), "--no-progress"])
    finally:
        torch.set_num_threads(before)
    text = out.read_text()
    for heading in ("### 1. Loss curves", "### 2. Weight-space alignment", "### 2a. The sign of the alignment",
                    "### 3. Capacity", "### 4. Function-space", "### 5. Where the context effect lives", "### Reading"):
        assert heading in text
    numbers = json.loads((tmp_path / "eval_finetune_alignment.json").read_text())
    assert set(numbers["lab"]) == set(finetune_alignment.QUICK_LAB) and set(numbers["lm"]) == set(finetune_alignment.QUICK_LM)
    assert numbers["seeds"]["single_block"] == [0] and numbers["lab"]["single_block"]["seeds"] == [0]
    cell = numbers["lab"]["single_block"]["cells"]["absorb step"]
    row = next(r for r in numbers["lab"]["single_block"]["alignment"]["summary"]
               if (r["comparison"], r["order"], r["kind"]) == ("sgd", "absorb", "step"))
    assert cell["per_seed"] == row["per_seed"] and cell["verdict"] == "one seed" and cell["signs"] in ("+", "−")
    assert numbers["claim"] == lab_rules.claim_wording(lab_rules.claim_cells(numbers["lab"], numbers["main_models"]))
    assert numbers["claim"]["verdict"] == "undecided"
    signs = numbers["signs"]["single_block"]["rows"][0]
    assert signs["population"] == "similar" and signs["label response ρ"] > 0  # the shipped seed (issue 39)
    assert "tiny-gemma3 (extension)" in text and numbers["reading"] == text.split("### Reading (computed from the tables above)\n\n")[1].strip().splitlines()


def _summary_reports(root, *, gru_slopes, delta_mse: float, best: float):
    conv = [{"arch": a, "norm_mse_at_n_train": m} for a, m in (("softmax", 0.01), ("gru", 0.1), ("delta", delta_mse))]
    trend = {a: {"ns": [2, 4, 8], "seeds": [0, 1, 2], "slopes": v}
             for a, v in (("softmax", [-0.5, -0.55, -0.48]), ("gru", list(gru_slopes)), ("delta", [-0.2, -0.3, -0.25]))}
    lab_json = {"rules": {"exact": {"float64": 1e-10, "float32": 1e-4}, "trend_slope": -0.4, "learns": 0.2},
                "equivalence": [{"dtype": "float64", "rel_error_prediction": 1e-15, "rel_error_residual": 2e-15}],
                "convergence": {"n_train": 16, "n_max": 64, "summary": conv, "trend": trend},
                "memory_cost": [{"arch": "delta", "context_length": t, "state_bytes": 10240} for t in (32, 2048)],
                "attention_regression": [{"max_rel_error": 3e-16}],
                "thought_patch": [{"K": 64, "test_mse": 0.1, "no_context_test_mse": 0.5, "contextual_test_mse": 0.01}]}
    (root / "eval_lab.json").write_text(json.dumps(lab_json))
    spread = [-0.02, 0.0, 0.02]
    cell = lambda m: {"per_seed": [m + e for e in spread], "control_per_seed": [0.0, 0.01, -0.01]}  # noqa: E731
    cells = {f"{o} {k}": cell(best if (o, k) == ("absorb", "step") else 0.01)
             for o, k in (("absorb", "step"), ("prefix", "step"), ("absorb", "cumulative"), ("prefix", "cumulative"),
                          ("end", "cumulative"))}
    (root / "eval_finetune_alignment.json").write_text(json.dumps(
        {"aligned_threshold": 0.5, "weak_threshold": 0.1, "main_models": ["single_block"],
         "lab": {"single_block": {"seeds": [0, 1, 2], "cells": cells}}}))


def test_summary_is_computed_from_the_reports_json_and_flips_with_it(tmp_path):
    from experiments.report import NOT_TESTED, QUANTISATION, claims_summary, write_summary

    assert {r["verdict"] for r in claims_summary(tmp_path)} == {NOT_TESTED}  # no reports: nothing claimed
    _summary_reports(tmp_path, gru_slopes=(0.0, 0.05, -0.02), delta_mse=0.01, best=0.6)
    rows = {r["claim"].split(" (")[0][:40]: r for r in claims_summary(tmp_path)}
    settle = next(r for r in rows.values() if r["claim"].startswith("Attention's implicit weights settle"))
    assert settle["verdict"] == "reproduced" and "softmax -0.51 [" in settle["number"] and "(converges)" in settle["number"]
    assert "GRU +0.01 [" in settle["number"] and "seeds: softmax 3, GRU 3" in settle["number"]
    fixed = next(r for r in rows.values() if r["claim"].startswith("A fixed-state parametric layer"))
    assert fixed["verdict"] == "reproduced" and fixed["paper"].startswith("McDermott")
    align = next(r for r in rows.values() if r["claim"].startswith("Implicit updates align"))
    assert align["verdict"] == "partly" and "reproduced only in single_block (absorb step)" in align["number"]
    assert "1 of 5 cells aligned at 95% each" in align["number"] and "3 seed(s) per model" in align["number"]
    assert "multiplicity: the verdict rests on 1 of 5 cells" in align["number"]
    _summary_reports(tmp_path, gru_slopes=(-0.5, -0.6, -0.55), delta_mse=0.5, best=0.05)
    rows = claims_summary(tmp_path)
    settle = next(r for r in rows if r["claim"].startswith("Attention's implicit weights settle"))
    assert settle["verdict"] == "not"  # the GRU converges as fast as softmax
    assert next(r for r in rows if r["claim"].startswith("A fixed-state"))["verdict"] == "not"
    assert next(r for r in rows if r["claim"].startswith("Implicit updates align"))["verdict"] == "not"
    text = write_summary(tmp_path)
    assert QUANTISATION in text and "4-bit GGUF" in text and (tmp_path / "eval_summary.json").exists()
    assert text.count("\n| ") == len(rows) + 1


def test_summary_counts_thought_rows_only_under_the_boundary_verdict(tmp_path):
    """A row scored by the earlier starts-with verdict ("six" accepted "sixteen") is named, never counted."""
    from experiments.report import NOT_TESTED, claims_summary

    def row(full, patched, new):  # on 100 queries, the patch right on the first of the full prompt's right ones
        k = {"full": round(100 * full), "patched": round(100 * patched)}
        r = {"accuracy": {"none": 0.0, "full": full, "patched": patched}, "n_test": 100, "correct": k,
             "outcomes": {c: [1] * x + [0] * (100 - x) for c, x in k.items()}}
        return {**r, "continuations": {"patched": ["x"]}} if new else r

    def verdict(cache):
        (tmp_path / "eval_thought.m.json").write_text(json.dumps(cache))
        return next(r for r in claims_summary(tmp_path) if r["claim"].startswith("A thought patch fitted"))

    assert verdict({_table_key("a"): row(0.9, 0.9, False), _table_key("b"): row(0.9, 0.9, False)})["verdict"] == NOT_TESTED
    part = verdict({_table_key("a"): row(0.9, 0.9, True), _table_key("b"): row(0.9, 0.9, False)})
    assert part["verdict"] == "partly" and "1 of 1 measured on the test queries (1 of 2 tasks only under the earlier" in part["number"]
    assert verdict({_table_key("a"): row(0.9, 0.9, True), _table_key("b"): row(0.9, 0.85, True)})["verdict"] == "reproduced"
    assert verdict({_table_key("a"): row(0.9, 0.1, True), _table_key("b"): row(0.9, 0.85, True)})["verdict"] == "partly"
    assert verdict({_table_key("a"): row(0.9, 0.1, True), _table_key("b"): row(0.9, 0.2, True)})["verdict"] == "not"


def test_summary_spike_rows_follow_the_leave_one_kind_out_entries(tmp_path):
    from experiments.report import claims_summary

    def diff(low):
        return {"difference": low + 0.02, "low": low, "high": low + 0.04}

    def entry(adds_logp, adds_hidden, ranks, meets):
        return {"patch_adds": {"beyond −log p": {"all answers": diff(0.01 if adds_logp else -0.03),
                                                 "no copied answer": diff(-0.05)},
                               "beyond the hidden state": {"all answers": diff(0.01 if adds_hidden else -0.03)}},
                "shipped": {"detector": {"name": "−mean log p, answer", "auroc_unseen_kinds": 0.8,
                                         "auroc_unseen_kinds_interval": [0.7, 0.9], "baseline": "−mean log p, answer",
                                         "versus": {"−log p": None}, "ranks_as_well_as_neglogp": ranks},
                            "unseen_kinds": {"meets_within": meets, "strata_correct_ok": 18, "strata_with_correct": 20,
                                             "max_correct_flagged": 0.12, "strata_wrong_ok": 9,
                                             "strata_with_wrong": 21, "correct_flagged": 0.02,
                                             "wrong_flagged": 0.3}}}

    def rows(a, b):
        (tmp_path / "eval_spikes.json").write_text(json.dumps({"models": {"a": entry(*a), "b": entry(*b)}}))
        return [r for r in claims_summary(tmp_path) if r["topic"] == "spikes"]

    got = rows((False, True, True, False), (False, False, True, True))
    assert [r["verdict"] for r in got] == ["not", "partly", "reproduced", "partly"]
    assert "a -0.010 [-0.030, +0.010] (no copied answer -0.030 [-0.050, -0.010])" in got[0]["number"]
    assert "a: −mean log p, answer 0.800 [0.700, 0.900], it is the −log p baseline" in got[2]["number"]
    assert "correct ≤ 5% in 18 of 20 strata (largest 12.0%)" in got[3]["number"]
    assert [r["verdict"] for r in rows((True, True, False, True), (True, True, False, True))] == [
        "reproduced", "reproduced", "not", "reproduced"]


def test_every_report_has_its_json_beside_it():
    """Every section of EVAL.md and BENCHMARKS.md (a reports/*.md fragment) has the JSON its numbers come from:
    ``<name>.json``, or one ``<name>.<model>.json`` per model."""
    reports = Path(__file__).parents[1] / "reports"
    fragments = sorted(reports.glob("*.md"))
    assert fragments
    missing = [f.name for f in fragments
               if not (f.with_suffix(".json").exists() or list(reports.glob(f"{f.stem}.*.json")))]
    assert not missing, f"reports without their JSON: {missing}"


def test_training_length_rule_and_report(tmp_path):
    """experiments.lab_training_length: the rule flips at the tolerance, and a (tiny) run writes the report and its
    JSON with the verdict the rule gives on its own rows."""
    from experiments import lab_training_length as ltl

    flat = [{"recipe": 0.20, "longer": 0.195}, {"recipe": 0.15, "longer": 0.16}]
    falling = [{"recipe": 0.20, "longer": 0.195}, {"recipe": 0.15, "longer": 0.12}]
    assert ltl.verdict(flat) and not ltl.verdict(falling)
    out = tmp_path / "eval_lab_training.md"
    ltl.main(["--seeds", "0", "--steps", "3", "--out", str(out)])
    numbers = json.loads(out.with_suffix(".json").read_text())
    assert [r["longer_steps"] for r in numbers["rows"]] == [6]
    assert numbers["stopped_falling"] == ltl.verdict(numbers["rows"])
    text = out.read_text()
    assert ("stopped falling" if numbers["stopped_falling"] else "still falling") in text
