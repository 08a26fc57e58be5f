"""`make html`'s script (notebooks/workshop/html_copies.py), as the teacher runs it the day before: the dashboard
notebook executed into one HTML file with its outputs, and the dashboard's static view beside it; a wrong name is
refused at once."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "notebooks" / "workshop" / "html_copies.py"


def _run(*args, timeout=900):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def test_builds_an_executed_copy_and_the_dashboard_view(tmp_path):
    done = _run("--out", str(tmp_path), "--as-opened", "05_live_dashboard")
    assert done.returncode == 0, done.stdout + done.stderr
    page = (tmp_path / "05_live_dashboard.html").read_text()
    assert "Open exploration: the live dashboard" in page
    assert "no answer yet" in page and "✓" not in page  # executed as opened: every check answered "no answer yet"
    assert "application/vnd.jupyter.widget-view+json" in page  # the dashboard's widget, with its stored state
    view = (tmp_path / "05_dashboard_view.html").read_text()
    assert "smollm2-135m" in view and "Italy" in view  # exercise 1's prompt on the workshop model
    assert "dash.save_html" not in page  # the extra cell that saved the view is not in the copy


def test_an_unknown_notebook_is_refused_before_anything_runs(tmp_path):
    done = _run("--out", str(tmp_path), "07_no_such", timeout=60)
    assert done.returncode == 2 and "no such notebook" in done.stderr and "07_no_such" in done.stderr
    assert not any(tmp_path.iterdir())
