"""Report text comes from the run: the machine line is read from the machine, readings follow the numbers."""
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch

from icl_lens.evals import lab, thought
from icl_lens.evals.report import machine, write_fragment

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
import assemble_reports  # noqa: E402


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


def _lab_results(cosine: float, gru_alpha: float, test_mse: float):
    archs = ["softmax", "linear", "delta", "gru"]
    eq = pd.DataFrame([{"arch": a, "dtype": d, "rel_error_prediction": 1e-16 if d == "float64" else 1e-7,
                        "rel_error_residual": 1e-16 if d == "float64" else 1e-7}
                       for a in archs for d in ("float64", "float32")])
    align = [{"arch": a, "cumulative_cosine": cosine, "control_cosine": 0.0, "query_gradient_cosine": 0.1} for a in archs]
    conv = pd.DataFrame({"arch": archs, "alpha_mean_curve": [1.0, 0.95, 0.5, gru_alpha],
                         "late_over_early": [0.1, 0.1, 0.2, 0.7]})
    tp = pd.DataFrame({"K": [1, 64], "train_mse": [0.0, 0.08], "test_mse": [0.9, test_mse],
                       "no_context_test_mse": [0.5, 0.5], "contextual_test_mse": [0.01, 0.01]})
    state = {"softmax": lambda t: 80 * t, "linear": lambda t: 11520, "delta": lambda t: 10240, "gru": lambda t: 1280}
    mc = pd.DataFrame([{"arch": a, "context_length": t, "us_per_token_min": 100.0} for a in archs for t in (32, 256)])
    return (SimpleNamespace(to_frame=lambda: eq), align,
            SimpleNamespace(summary=lambda: conv, n_max=64, n_train=16), SimpleNamespace(summary=lambda: tp),
            SimpleNamespace(to_frame=lambda: mc, bytes_at=lambda a, t: state[a](t)),
            SimpleNamespace(rows=[{"max_rel_error": 5e-16}]))


def test_lab_findings_follow_the_numbers():
    text = "\n".join(lab.findings(*_lab_results(cosine=0.02, gru_alpha=0.1, test_mse=0.1)))
    assert "Aligned: none, so the papers' high alignment is **not** reproduced" in text
    assert "claim (attention's steps shrink, a recurrent layer's do not) holds here" in text
    assert "converges: softmax, linear; converges slowly: delta; flat: gru" in text
    assert "0.100 is below no context (0.500) and above the prompt in context" in text
    other = "\n".join(lab.findings(*_lab_results(cosine=0.7, gru_alpha=0.9, test_mse=0.6)))
    assert "Aligned: softmax, linear, delta, gru, so the papers' high alignment is reproduced for" in other
    assert "do not) **does not** hold here" in other
    assert "0.600 is above no context" in other


def _thought_row(n_test: int, correct: dict[str, int]) -> dict:
    return {"n_train": 4, "n_test": n_test, "seconds": 9.0, "steering_layer": 1,
            "accuracy": {c: k / n_test for c, k in correct.items()}, "correct": correct,
            "locality_kl": {"patched": 0.25, "control": 1.5, "steering": 0.125},
            "locality_accuracy": {"patched": 1.0, "control": 0.5, "steering": 0.75}}


def test_thought_report_names_the_runs_and_reads_the_target_from_the_numbers(tmp_path):
    """The 0.9 × full target is decided by the rule, per row: 18/20 = 0.90 is met, 17/20 missed, full < 50% n/a."""
    out = tmp_path / "eval_thought.md"
    base = {"none": 0, "control": 0, "steering": 3}
    cache = {"runs": {"`python -m icl_lens.evals.thought --models m` on 3 CPU cores": ["table/t", "table/u"]},
             "table/t": _thought_row(24, {**base, "full": 20, "patched": 18}),
             "table/u": _thought_row(24, {**base, "full": 20, "patched": 17})}
    (tmp_path / "eval_thought.m.json").write_text(json.dumps(cache))
    (tmp_path / "eval_thought.n.json").write_text(json.dumps({"table/t": _thought_row(24, {**base, "full": 11,
                                                                                           "patched": 2})}))
    text = thought.write_report(out, ["m", "n"], ["t", "u"], "python -m icl_lens.evals.thought --report-only")
    assert "- m: 2 result(s) by `python -m icl_lens.evals.thought --models m` on 3 CPU cores" in text
    assert "- n: command and machine not recorded" in text
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in text.splitlines() if line.startswith("| m |")
            or line.startswith("| n |")}
    assert "| 0.90 | met |" in rows[("m", "t")] and "| 0.85 | missed |" in rows[("m", "u")]
    assert "n/a (full < 50%)" in rows[("n", "t")]
    assert "| 0.250 / 1.500 / 0.125 |" in rows[("m", "t")]
    assert "- m: target met on 1 of 2 tasks where full ≥ 50%; missed: u." in text
    assert "**Not evaluated** on n (no cached result): u." in text
