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
