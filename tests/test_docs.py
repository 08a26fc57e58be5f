"""Every code sample in README.md and docs/*.md runs (Python blocks and icl-lens command lines)."""
import json
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(lang):
    for doc in DOCS:
        for i, block in enumerate(re.findall(rf"```{lang}\n(.*?)```", doc.read_text(), flags=re.S)):
            yield pytest.param(block, id=f"{doc.name}-{lang}{i}")


@pytest.mark.parametrize("source", list(_blocks("python")))
def test_python_sample_runs(source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(source, "<doc sample>", "exec"), {"__name__": "__doc_sample__"})


CLI_LINES = [line.split("#")[0].strip() for _, block in [(0, b.values[0]) for b in _blocks("bash")]
             for line in block.splitlines() if line.strip().startswith("icl-lens ")]


@pytest.mark.parametrize("line", CLI_LINES)
def test_cli_sample_runs(line, tmp_path):
    shutil.copytree(ROOT / "docs" / "examples", tmp_path / "docs" / "examples")  # the samples' input files, as in a checkout
    args = shlex.split(line)[1:]
    # a guard against hangs, not a speed test, inside pytest's own 900 s: the slowest sample (`thought-eval`, four
    # conditions on SmolLM2) took 220 s on a 2-core CPU
    proc = subprocess.run([sys.executable, "-m", "icl_lens.cli", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip()
    if args[0] == "patches" and "--json" in args:  # the printed identity must hold, not just the exit status
        data = json.loads(proc.stdout)
        assert data["exact"] and data["relative_error"] <= data["tolerance"] <= 1e-4


# ---------------------------------------------------------------- the workshop day's clock (docs/workshop.md)
GUIDE = ROOT / "docs" / "workshop.md"
NOTEBOOK_SOURCES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
TIMED_HEADING = re.compile(r"^# #{2,3} .*?(?:\((\d+) min|— (\d+) min)", re.M)


def _minutes(clock: str) -> int:
    hours, minutes = clock.split(":")
    return 60 * int(hours) + int(minutes)


def run_of_show() -> list[tuple[int, int, str]]:
    """The run of show's rows as (start, end, step) in minutes; a row with one time (a switch) lasts 0."""
    text = GUIDE.read_text()
    table = text[text.index("## Run of show"):text.index("### If you run late")]
    rows = []
    for line in table.splitlines():
        m = re.match(r"^\| (\d:\d\d)(?:–(\d:\d\d))? \| ([^|]+?) \|", line)
        if m:
            start = _minutes(m.group(1))
            rows.append((start, _minutes(m.group(2)) if m.group(2) else start, m.group(3)))
    return rows


def time_box(source: str) -> int:
    return int(re.search(r"\*\*Time box: (\d+) minutes", source).group(1))


def section_minutes(source: str) -> int:
    """The sum of the section and exercise times in the headings ("(5 min)", "— 10 min")."""
    return sum(int(a or b) for a, b in TIMED_HEADING.findall(source))


def test_run_of_show_fills_three_hours_with_15_minutes_of_buffer():
    rows = run_of_show()
    assert rows[0][0] == 0 and rows[-1][1] == 180, (rows[0], rows[-1])
    for (_, end, step), (start, _, following) in zip(rows, rows[1:]):
        assert start == end, f"a gap or an overlap between '{step}' and '{following}'"
    assert sum(end - start for start, end, _ in rows) == 180
    buffer = sum(end - start for start, end, step in rows if step.startswith("buffer"))
    assert buffer >= 15, f"only {buffer} minutes of buffer"


def test_each_notebooks_sections_fit_its_time_box_and_the_run_of_show():
    """A notebook's minutes in the run of show equal its header's time box; its sections' times add up to no more."""
    rows = run_of_show()
    for path in NOTEBOOK_SOURCES:
        number, source = path.name[:2], path.read_text()
        scheduled = sum(end - start for start, end, step in rows
                        if step.startswith(number + " ") or (number in ("05", "06") and step.startswith("05 or 06")))
        box, sections = time_box(source), section_minutes(source)
        print(f"{path.stem}: run of show {scheduled} min, time box {box} min, sections {sections} min")
        assert scheduled == box, f"{path.name}: the run of show gives {scheduled} min, its time box says {box}"
        assert 0 < sections <= box, f"{path.name}: its sections add up to {sections} min, its time box is {box}"


def test_every_block_has_a_cut_cue():
    text = GUIDE.read_text()
    cues = text[text.index("### If you run late"):]
    blocks = {m.group(1) for m in re.finditer(r"^\| ([^|]+?) \| \d+ min \| \S", cues, re.M)}
    needed = {"setup check", "break", "wrap-up", "05 or 06"} | {p.name[:2] for p in NOTEBOOK_SOURCES[:4]}
    assert needed <= blocks, f"no 'if behind, cut' cue for {sorted(needed - blocks)}"


def test_slides_draw_the_two_paths_and_plan_the_day_of_the_run_of_show():
    slides = (ROOT / "docs" / "slides.md").read_text()
    diagram = re.search(r"# One block, two paths.*?```text\n(.*?)```", slides, re.S)
    assert diagram and "MLP branch" in diagram.group(1) and "skip connection" in diagram.group(1)
    plan = [(m.group(1), int(m.group(2))) for m in re.finditer(r"^\| ([^|]+?) \| (\d+) \|$", slides, re.M)]
    assert sum(v for _, v in plan) == 180
    assert sum(v for k, v in plan if k.startswith("buffer")) >= 15
    for path in NOTEBOOK_SOURCES:
        minutes = [v for k, v in plan if re.search(rf"\b{path.name[:2]}\b", k)]
        assert minutes == [time_box(path.read_text())], f"slides plan {path.name[:2]}: {minutes}"
