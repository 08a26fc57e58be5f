"""The workshop helpers: claims tables and report readers (missing reports read as "not measured"),
accuracies with their Wilson intervals, exercise checks (right passes, wrong says why, missing says "no answer yet";
strict only with the solutions on; predictions graded on overlapping intervals),
and the figure helpers for log axes and many layers."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.express as px
import pytest

from icl_lens.thought import ThoughtFit
from icl_lens.ui import layer_lines, vertical_marker
from workshop import claims
from workshop.claims import (
    NOT_MEASURED, alignment_row, auroc_ci, claim, claims_table, count_where, mean_ci, rate, read_report,
    spike_auroc, verdict_above,
)
from icl_lens.stats._bootstrap import bootstrap_mean
from workshop.claims import spike_shipped, spike_without_copied_answers, thought_locality
from workshop.exercise_checks import (
    NO_ANSWER, NOT_DISTINGUISHABLE, RIGHT, WRONG, ExerciseCheckFailed, as_number, check_answer, check_below,
    check_choice, check_compare, check_sheet, compare_intervals, missing, no_answer, solutions_on,
)
from workshop.cleanup import free


def test_rate_states_the_wilson_interval():
    assert rate(12, 24) == "0.50 [0.31, 0.69] (12/24)"


def test_claims_table_rows_and_verdicts():
    rows = [claim("c1", "paper", 1.5e-6, "1e-4", True), claim("c2", "paper", None, "x", None),
            claim("c3", "paper", "text", None, np.bool_(False), "why")]
    frame = claims_table(rows)
    assert list(frame.columns) == ["claim", "paper", "measured", "baseline", "reproduced", "why"]
    assert frame.reproduced.tolist() == ["yes", "not measured", "no"]
    assert frame.measured[1] == NOT_MEASURED and frame.baseline[2] == NOT_MEASURED
    assert frame.measured[0] == "1.5e-06"
    with pytest.raises(ValueError, match="reproduced is None"):
        claim("c", "p", 1.0, "b", None)
    with pytest.raises(ValueError, match="one of"):
        claim("c", "p", 1.0, "b", "maybe")
    with pytest.raises(ValueError):
        claims_table([])


def test_verdict_and_formatting():
    above = {"mean": 0.4, "low": 0.3, "high": 0.5}
    control = {"mean": 0.0, "low": -0.1, "high": 0.1}
    assert verdict_above(above, control) is True
    assert verdict_above(control, above) is False
    assert verdict_above(above, control, floor=0.35) is False  # above the control but below the floor
    assert verdict_above(None, control) is None
    assert mean_ci(above) == "+0.400 [+0.300, +0.500]" and mean_ci(None) is None
    assert auroc_ci({"auroc": 0.7, "low": 0.6, "high": 0.8}) == "0.700 [0.600, 0.800]"
    assert count_where([-1, 2, -3], lambda x: x < 0) == "2 of 3"


def _write(root, name, data):
    (root / f"eval_{name}.json").write_text(json.dumps(data))


def test_readers_on_reports_written_here(tmp_path):
    summary = [{"comparison": "sgd", "order": "absorb", "kind": "step", "mean": 0.3, "low": 0.2, "high": 0.4}]
    _write(tmp_path, "finetune_alignment", {"lab": {"softmax": {"alignment": {"summary": summary}}},
                                            "lm": {"gemma-3-270m": {"alignment": {"summary": summary}}}})
    assert alignment_row("softmax", "sgd", "absorb", "step", root=tmp_path)["mean"] == 0.3
    assert alignment_row("gemma-3-270m", "sgd", "absorb", "step", root=tmp_path)["low"] == 0.2
    assert alignment_row("gemma-3-270m", "control", "absorb", "step", root=tmp_path) is None
    assert alignment_row("smollm2-135m", "sgd", "absorb", "step", root=tmp_path) is None
    row = {"auroc": 0.77, "low": 0.71, "high": 0.82}
    _write(tmp_path, "spikes", {"models": {"m": {
        "aurocs": {"d": {"aurocs": {"within kind, grouped": row}}},
        "comparisons": {"patch vs baseline": {"within_grouped": {"difference": 0.07, "low": -0.02, "high": 0.17}}}}}})
    assert spike_auroc("m", "d", root=tmp_path) == row
    assert spike_auroc("m", "missing", root=tmp_path) is None


def test_missing_or_broken_reports_read_as_not_measured(tmp_path):
    assert read_report("spikes", tmp_path) is None
    (tmp_path / "eval_spikes.json").write_text("{not json")
    assert read_report("spikes", tmp_path) is None
    assert spike_auroc("gemma-3-270m", "d", root=tmp_path) is None
    assert claim("c", "p", spike_auroc("gemma-3-270m", "d", root=tmp_path), "b", None).reproduced == "not measured"


def test_checkout_reports_are_read():
    """The checkout's own finetune-alignment report has the rows notebook 03 reads."""
    assert (claims.REPORTS / "eval_finetune_alignment.json").exists()
    for comparison in ("sgd", "control"):
        for kind in ("step", "cumulative"):
            row = alignment_row("gemma-3-270m", comparison, "absorb", kind)
            assert row is not None and row["low"] <= row["mean"] <= row["high"]


def test_exercise_checks_pass_right_answers_and_explain_wrong_ones(capsys, monkeypatch):
    monkeypatch.delenv("ICL_LENS_SOLUTIONS", raising=False)
    assert not solutions_on()
    assert check_answer(3, 3, "layer") == RIGHT
    check_answer(0.1 + 0.2, 0.3, "sum", rel_tol=1e-9)
    check_answer(" Paris ", "paris", "token")
    check_choice("No", "no", ("yes", "no"), "identity", why="because")
    check_below(1e-6, 1e-4, "error")
    out = capsys.readouterr().out
    assert out.count("✓") == 5 and "because" in out
    # a participant's wrong answer is explained, and the notebook goes on (no exception)
    assert check_answer(2, 3, "layer") == WRONG
    assert "✗ layer: you answered 2, icl_lens measures 3" in capsys.readouterr().out
    assert check_answer("three", 3, "layer") == WRONG and "expected a number" in capsys.readouterr().out
    assert check_choice("maybe", "no", ("yes", "no"), "identity") == WRONG
    assert "answer one of" in capsys.readouterr().out
    assert check_choice("yes", "no", ("yes", "no"), "identity") == WRONG
    assert check_below(1e-3, 1e-4, "error") == WRONG and check_below(float("nan"), 1e-4, "error") == WRONG
    capsys.readouterr()
    # an answer not given yet: "no answer yet", never ✓ and never a crash, whatever the check compares
    for unanswered in (check_answer(None, 3, "layer"), check_answer(None, None, "layer"),
                       check_choice(None, "no", ("yes", "no"), "identity"), check_below(None, 1e-4, "error"),
                       check_compare(None, (0.5, 0.4, 0.6), (0.1, 0.0, 0.2), "which"), no_answer("patches")):
        assert unanswered == NO_ANSWER
    out = capsys.readouterr().out
    assert out.count("no answer yet") == 6 and "✓" not in out and "✗" not in out
    assert missing(None) and missing(1, ...) and not missing(0, "", [])


def test_numbers_in_any_form_a_notebook_hands_over(capsys, monkeypatch):
    """One-element tensors and arrays, numpy scalars, numeric strings and ints are numbers; `prediction = 0` picks "0"."""
    import torch

    monkeypatch.delenv("ICL_LENS_SOLUTIONS", raising=False)
    for same in (torch.tensor(0.25), torch.tensor([0.25]), torch.tensor([[0.25]], dtype=torch.float64),
                 np.float32(0.25), np.float64(0.25), np.array([0.25]), "0.25", " 2.5e-1 "):
        assert as_number(same) == pytest.approx(0.25), same
        assert check_answer(same, 0.25, "value", rel_tol=1e-6) == RIGHT, same
        assert check_below(same, 0.3, "error") == RIGHT and check_below(same, 0.2, "error") == WRONG, same
    assert as_number(np.int64(3)) == 3.0 and check_answer(torch.tensor(3), 3, "layer") == RIGHT
    for not_one in (torch.tensor([1.0, 2.0]), np.array([1, 2]), [0.25], "a quarter", True, torch.tensor(True), None):
        assert as_number(not_one) is None, not_one
    assert check_answer(torch.tensor([0.25, 0.5]), 0.25, "value") == WRONG
    assert "expected a number" in capsys.readouterr().out
    # a numeric choice answered with a number: 0 is "0", 1.0 is "1"; 2 is still outside the choices
    choices = ("0", "1", NOT_DISTINGUISHABLE)
    assert check_choice(0, "0", choices, "exponent") == RIGHT and check_choice(1.0, "1", choices, "exponent") == RIGHT
    assert check_choice(np.int64(1), "0", choices, "exponent") == WRONG
    assert check_choice(2, "0", choices, "exponent") == WRONG and "answer one of" in capsys.readouterr().out
    assert check_compare(0, (0.0, -0.1, 0.1), (0.5, 0.5, 0.5), "0 or 1", labels=("1", "0")) == RIGHT


def test_cleanup_frees_only_what_exists(capsys):
    namespace = {"model": object(), "patches": [1], "keep": 2}
    assert free(namespace, "model", "homework_parts", "patches") == ["model", "patches"]
    assert namespace == {"keep": 2}
    out = capsys.readouterr().out
    assert "freed model, patches" in out and "never defined here: homework_parts" in out
    assert free({}, "model") == [] and "freed nothing" in capsys.readouterr().out


def test_checks_are_strict_with_the_solutions_on(monkeypatch):
    monkeypatch.setenv("ICL_LENS_SOLUTIONS", "1")
    assert solutions_on()
    assert check_answer(3, 3, "layer") == RIGHT
    with pytest.raises(ExerciseCheckFailed, match="no answer yet"):
        check_answer(None, 3, "layer")
    with pytest.raises(ExerciseCheckFailed, match="you answered 2"):
        check_answer(2, 3, "layer")
    assert issubclass(ExerciseCheckFailed, AssertionError)


def test_check_sheet_compares_a_run_with_the_answer_sheet(capsys, monkeypatch):
    """What a check cell measured against the stored answer sheet: agreement is silent (no ✓: the as-opened run of a
    check cell grades nothing), a drifted number, count or missing entry is a ✗ naming it, strict with solutions on."""
    monkeypatch.delenv("ICL_LENS_SOLUTIONS", raising=False)
    ci = bootstrap_mean([0.1, 0.9, 0.5])
    measured = {"errors": [0.99, np.float32(1.9e-6)], "ci": ci, "count": np.int64(14), "token": "capital"}
    stored = {"errors": [0.9901, 2.4e-6], "ci": {"mean": ci.mean, "low": ci.low, "high": ci.high, "n": 3},
              "count": 14, "token": "capital", "command": "python notebooks/workshop/answer_sheet.py"}
    assert check_sheet(measured, stored, "x") == RIGHT
    assert check_sheet(measured, None, "x") is None  # no sheet for this model: nothing to compare
    out = capsys.readouterr().out
    assert "✓" not in out and "✗" not in out and out.count("\n") == 1 and "expected answer for x" in out
    for key, wrong in [("count", 15), ("errors", [0.9, 2.4e-6]), ("token", "Paris")]:
        assert check_sheet(measured, {**stored, key: wrong}, "x") == WRONG
        assert "✗ x: this run differs from the answer sheet" in (said := capsys.readouterr().out) and key in said
    assert check_sheet(measured, {k: v for k, v in stored.items() if k != "ci"}, "x") == WRONG  # a stale sheet
    monkeypatch.setenv("ICL_LENS_SOLUTIONS", "1")
    with pytest.raises(ExerciseCheckFailed, match=r"count: sheet 15, measured 14"):
        check_sheet(measured, {**stored, "count": 15}, "x")


def test_predictions_are_graded_on_signal(capsys, monkeypatch):
    monkeypatch.delenv("ICL_LENS_SOLUTIONS", raising=False)
    apart, near, low = {"mean": 0.6, "low": 0.55, "high": 0.65}, (0.49, 0.40, 0.58), (0.2, 0.1, 0.3)
    assert compare_intervals(apart, low) == "higher" and compare_intervals(low, apart) == "lower"
    assert compare_intervals(near, (0.5, 0.5, 0.5)) == NOT_DISTINGUISHABLE  # 0.49 against 0.5 is no verdict
    assert check_compare("higher", apart, low, "a vs b") == RIGHT
    assert check_compare("lower", apart, low, "a vs b") == WRONG
    # overlapping intervals: only "not distinguishable" is right, whichever way the point estimates fall
    assert check_compare("lower", near, (0.5, 0.5, 0.5), "a vs half") == WRONG
    assert check_compare("not distinguishable", near, (0.5, 0.5, 0.5), "a vs half") == RIGHT
    assert "The intervals overlap" in capsys.readouterr().out
    ci = bootstrap_mean([0.1, 0.2, 0.3, 0.4])
    assert compare_intervals(ci, (0.9, 0.9, 0.9), labels=("1", "0")) == "0"


def test_evaluation_failures_are_read_from_the_reports(tmp_path):
    """04's locality and 06's flag numbers come from the committed reports, and read as None where missing."""
    kept = thought_locality()
    assert kept and all(0.0 <= share <= 1.0 for share in kept.values())
    assert {model for model, _ in kept} == {"gemma-3-270m", "smollm2-135m"}
    shipped = spike_shipped("gemma-3-270m")
    assert 0 <= shipped["held_out"]["correct_flagged"] <= 1 and shipped["detector"]["name"]
    without = spike_without_copied_answers("smollm2-135m")
    assert without["low"] <= without["difference"] <= without["high"]
    assert thought_locality(root=tmp_path) is None and spike_shipped("gemma-3-270m", root=tmp_path) is None
    assert spike_without_copied_answers("gemma-3-270m", root=tmp_path) is None
    default, other = ThoughtFit(), ThoughtFit(ridge=0.5)
    _write(tmp_path, "thought.m", {f"table/{default.key()}/a": {"locality_accuracy": {"patched": 0.25},
                                                                 "fit": default.to_dict()},
                                   f"table/{other.key()}/a": {"locality_accuracy": {"patched": 0.5},
                                                               "fit": other.to_dict()},  # another default's row
                                   "preserve/a": {}})
    assert thought_locality(("m",), root=tmp_path) == {("m", "a"): 0.25}


def test_vertical_marker_keeps_a_log_axis_on_the_data():
    frame = pd.DataFrame({"x": [1, 2, 4, 8, 16, 32, 64], "y": [1.0, 0.5, 0.25, 0.12, 0.06, 0.03, 0.015]})
    fig = px.line(frame, x="x", y="y", log_x=True, log_y=True)
    vertical_marker(fig, 16, "training length")
    shape, note = fig.layout.shapes[0], fig.layout.annotations[0]
    assert shape.x0 == shape.x1 == 16 and shape.yref == "paper"
    assert note.x == pytest.approx(np.log10(16)) and note.text == "training length"  # log axes: log10 coordinates
    linear = vertical_marker(px.line(frame, x="x", y="y"), 16, "n")
    assert linear.layout.annotations[0].x == 16
    with pytest.raises(ValueError):
        vertical_marker(fig, 0, "bad")


def test_layer_lines_colour_bar_instead_of_a_legend():
    frame = pd.DataFrame({"layer": np.repeat(np.arange(18), 5), "step": np.tile(np.arange(1, 6), 18),
                          "value": np.random.default_rng(0).random(90) + 0.1, "token": "t"})
    fig = layer_lines(frame, "step", "value", hover="token", log_x=True, log_y=True)
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 18 and not any(t.showlegend for t in fig.data)
    assert len({t.line.color for t in lines}) == 18  # one colour per layer, along Viridis
    assert fig.data[-1].marker.showscale and fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_claims_view_shows_whole_sentences():
    long = "a claim whose sentence is much longer than pandas' fifty-character display limit, kept whole"
    html = claims.claims_view([claim(long, "paper", 1.0, "b", True)]).to_html()
    assert long.replace("'", "&#39;") in html or long in html


def test_new_readers_read_only_the_json(tmp_path):
    from workshop.claims import summary_verdicts

    assert summary_verdicts(root=tmp_path) is None
    (tmp_path / "eval_summary.md").write_text("| c | partly |")  # Markdown is never read
    assert summary_verdicts(root=tmp_path) is None
    _write(tmp_path, "summary", {"rows": [{"claim": "c", "verdict": "partly"}]})
    assert summary_verdicts(root=tmp_path) == [{"claim": "c", "verdict": "partly"}]


def test_summary_claims_carry_the_summary_verdicts_of_their_topics(tmp_path):
    """The notebooks' claims tables show EVAL.md's verdicts (read from eval_summary.json), never their own."""
    from experiments.report import write_summary
    from workshop.claims import summary_claims

    assert [c.reproduced for c in summary_claims("lab", root=tmp_path)] == ["not measured"]
    write_summary(tmp_path)  # no reports: every claim "not tested here"
    rows = json.loads((tmp_path / "eval_summary.json").read_text())["rows"]
    rows[0] = {**rows[0], "verdict": "partly", "number": "drift 0.2"}
    (tmp_path / "eval_summary.json").write_text(json.dumps({"rows": rows}))
    lab = summary_claims("lab", root=tmp_path)
    assert len(lab) == sum(r["topic"] == "lab" for r in rows) > 0 and rows[0]["topic"] == "lab"
    assert (lab[0].reproduced, lab[0].measured) == ("partly", "drift 0.2")
    assert {c.reproduced for c in lab[1:]} == {"not measured"}
    assert not summary_claims("nothing", root=tmp_path)


def test_summary_links_point_at_eval_md_headings():
    """Each summary row links to a section of EVAL.md: the anchor of one of its headings (GitHub's slug)."""
    import re

    from experiments.report import SECTIONS

    text = (Path(__file__).resolve().parents[1] / "EVAL.md").read_text(encoding="utf-8")
    slugs = {"#" + re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
             for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
    assert set(SECTIONS.values()) <= slugs, set(SECTIONS.values()) - slugs


def test_spike_shipped_reads_the_shipped_detector_and_its_held_out_flag(tmp_path):
    from workshop.claims import percent_ci, spike_shipped

    assert spike_shipped("m", root=tmp_path) is None
    held = {"correct_flagged": 0.016, "correct_flagged_interval": [0.0, 0.042]}
    report = {"models": {"m": {"shipped": {"detector": {"name": "patch"}, "held_out": held}}, "n": {"shipped": {}}}}
    (tmp_path / "eval_spikes.json").write_text(json.dumps(report))
    assert spike_shipped("m", root=tmp_path)["detector"]["name"] == "patch" and spike_shipped("n", root=tmp_path) is None
    assert percent_ci(held, "correct_flagged") == "1.6% [0.0%, 4.2%]"
