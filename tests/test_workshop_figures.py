"""Every figure the teacher says is read from the reports: the marked figures of docs/workshop.md and of the
notebooks' markdown are exactly what ``notebooks/workshop/figures.py`` renders from ``reports/*.json``, and what the
teacher is told to say carries no figure outside a marker."""
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "notebooks"))

from workshop import figures  # noqa: E402

GUIDE = ROOT / "docs" / "workshop.md"
# a decimal or a percentage: what a rerun of an evaluation changes
FIGURE = re.compile(r"\d+\.\d+|\d+(?:\.\d+)?\s?%")


@pytest.mark.parametrize("path", figures.documents(), ids=lambda p: p.name)
def test_marked_figures_are_what_the_reports_hold(path):
    bad = figures.stale(path.read_text(encoding="utf-8"))
    assert not bad, "\n".join(f"{path.name}: {name}: says {was!r}, the reports hold {now!r} "
                              f"(make reports rewrites it)" for name, was, now in bad)


def test_every_figure_is_marked_somewhere_and_measured():
    """Each figure is quoted (marked) in the guide or a notebook, and each is measured in this checkout."""
    marked = {m.group(1) for p in figures.documents() for m in figures.MARKER.finditer(p.read_text(encoding="utf-8"))}
    assert marked == set(figures.FIGURES), \
        f"never quoted: {set(figures.FIGURES) - marked}; unknown: {marked - set(figures.FIGURES)}"
    missing = [name for name in marked if figures.render(name) == figures.NOT_MEASURED]
    assert not missing, f"not measured in this checkout's reports: {missing}"


def test_each_notebook_states_its_peak_memory_at_its_top():
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        top = path.read_text(encoding="utf-8").split("\n# %%", 2)[1]  # the header, then the first cell
        assert f"<!-- report:memory_{path.name[:2]} -->" in top, f"{path.name}: its first cell does not state its peak"


def _unmarked(text: str) -> str:
    return figures.MARKER.sub("FIGURE", text)


def test_what_the_teacher_says_carries_no_typed_figure():
    """The run of show's "say" column and the section on claims not reproduced: every decimal and percentage is a
    marked figure (a typed one would not follow a rerun)."""
    text = _unmarked(GUIDE.read_text(encoding="utf-8"))
    show = text[text.index("## Run of show"):text.index("### If you run late")]
    says = [line.split("|")[3] for line in show.splitlines() if re.match(r"^\| \d:\d\d", line)]
    assert len(says) > 10
    claims = text[text.index("## Claims the participants"):text.index("## Run times and memory")]
    typed = [f for part in (*says, claims) for f in FIGURE.findall(part)]
    assert not typed, f"figures typed by hand in what the teacher says: {typed}"


def expected_answers(text: str) -> list[str]:
    """The "expected answer" column of the guide's exercise table, markers replaced (``\\|``: a pipe in a cell)."""
    section = text[text.index("## What each exercise teaches"):]
    section = section[:section.index("\n\n", section.index("\n|"))]
    rows = [re.split(r"(?<!\\)\|", line) for line in section.splitlines() if re.match(r"^\| \d\d ·", line)]
    return [_unmarked(row[3]) for row in rows]


def test_expected_answers_carry_no_typed_digit():
    """Every digit in the exercise table's expected answers sits inside a marker: each is rendered from the answer
    sheet (``reports/workshop_answers.json``), which the notebooks' checks compare with their own run."""
    answers = expected_answers(GUIDE.read_text(encoding="utf-8"))
    assert len(answers) >= 15
    typed = [a.strip() for a in answers if re.search(r"\d", a)]
    assert not typed, f"digits typed by hand in the guide's expected answers: {typed}"


def test_a_typed_digit_in_an_expected_answer_is_caught():
    """Planted fault: a number typed beside a marker in the exercise table."""
    text = GUIDE.read_text(encoding="utf-8")
    planted = text.replace("<!-- /report --> without enough context",
                           "<!-- /report --> (10 here) without enough context")
    assert planted != text
    assert [a for a in expected_answers(planted) if re.search(r"\d", a)]


def test_a_wrong_or_drifted_figure_is_caught(tmp_path):
    """Planted faults: a number typed wrong inside a marker, and a report rerun whose number changed."""
    text = GUIDE.read_text(encoding="utf-8")
    m = re.search(r"(<!-- report:thought_locality -->a median )(\d+)%", text)
    wrong = text[:m.start(2)] + str(int(m.group(2)) + 1) + text[m.end(2):]
    assert [name for name, *_ in figures.stale(wrong)] == ["thought_locality"]
    assert figures.rendered(wrong) == text  # make reports puts it back
    reports = tmp_path / "reports"
    shutil.copytree(ROOT / "reports", reports)
    spikes = json.loads((reports / "eval_spikes.json").read_text())
    spikes["models"]["smollm2-135m"]["shipped"]["unseen_kinds"]["wrong_flagged"] += 0.05
    (reports / "eval_spikes.json").write_text(json.dumps(spikes))
    assert {name for name, *_ in figures.stale(text, reports)} == {"spike_flag"}
    (reports / "eval_spikes.json").unlink()
    assert {name for name, *_ in figures.stale(text, reports)} == {"spike_flag", "spike_score", "answers_06_prediction"}


def test_a_rewritten_notebook_keeps_its_cell_ids(tmp_path):
    """Planted: a rerun changes notebook 04's measured peak. ``make reports`` rewrites that figure in the .py twin and
    in the .ipynb, and every cell of the .ipynb keeps its id (new ids made each figure update a diff of every cell)."""
    import nbformat

    for part in ("docs/workshop.md", "notebooks/04_thought_patches.py", "notebooks/04_thought_patches.ipynb"):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / part, tmp_path / part)
    shutil.copytree(ROOT / "reports", tmp_path / "reports")
    runs = json.loads((tmp_path / "reports" / "workshop_notebooks.json").read_text())
    runs["runs"]["04_thought_patches"]["peak_gb"] += 0.11
    (tmp_path / "reports" / "workshop_notebooks.json").write_text(json.dumps(runs))
    assert tmp_path / "notebooks" / "04_thought_patches.py" in figures.write(tmp_path)
    before = nbformat.read(ROOT / "notebooks" / "04_thought_patches.ipynb", as_version=4).cells
    after = nbformat.read(tmp_path / "notebooks" / "04_thought_patches.ipynb", as_version=4).cells
    assert [c.id for c in after] == [c.id for c in before]
    changed = [c.source for c, was in zip(after, before) if c.source != was.source]
    assert len(changed) == 1 and figures.render("memory_04", tmp_path / "reports") in changed[0]
