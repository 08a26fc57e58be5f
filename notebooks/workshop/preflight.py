"""Preflight for a workshop participant's machine: one PASS/FAIL line per item, with what to do on a FAIL.

    python notebooks/workshop/preflight.py --stage system   # before setup, any Python: version, free RAM, free disk
    python notebooks/workshop/preflight.py                  # after setup (the venv's Python): also the model and a widget

``make preflight`` runs both (the first with the system Python, then ``make models``, then the
second with the venv's). Items:

- **python**: the version pyproject.toml requires (≥ 3.10);
- **ram**: available memory (a notebook's kernel peaks near 1.3 GB with SmolLM2-135M, JupyterLab and a
  browser tab need the rest);
- **disk**: free space where the repository lives (the venv with the CPU build of torch and the prepared models
  take about 5 GB; 1 GB spare once they are installed);
- **model**: the embedded model loads offline, and its token patches reproduce its logits on a short prompt;
- **widget**: ipywidgets and a plotly ``FigureWidget`` construct and serialise their state (what JupyterLab
  renders).

Only the standard library is imported at the top, so ``--stage system`` runs before anything is installed.
The exit status is 1 when any item fails.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GB = 2**30


@dataclass(frozen=True)
class Result:
    """One preflight item: passed or not, what was found, and what to do when it failed."""

    item: str
    ok: bool
    found: str
    fix: str = ""

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.item:<7} {self.found}" + ("" if self.ok else f"  → {self.fix}")


def check_python(minimum: tuple[int, int] = (3, 10)) -> Result:
    found = ".".join(map(str, sys.version_info[:3]))
    return Result("python", sys.version_info[:2] >= minimum, f"{found} (need ≥ {'.'.join(map(str, minimum))})",
                  f"install Python {minimum[0]}.{minimum[1]}–3.12 (python.org, or your package manager), then "
                  f"`make preflight PY=python3.11` (PY names the interpreter)")


def available_memory() -> int | None:
    """Bytes of memory available to a new program (MemAvailable on Linux, psutil elsewhere), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def check_ram(minimum_gb: float = 2.0) -> Result:
    free = available_memory()
    if free is None:
        return Result("ram", False, "could not read the available memory",
                      "install psutil (`pip install psutil`) or check it by hand: 2 GB must be free")
    return Result("ram", free >= minimum_gb * GB, f"{free / GB:.1f} GB available (need ≥ {minimum_gb:g} GB)",
                  "close other programs and browser tabs, and run one notebook kernel at a time; "
                  "or use Binder (2 GB per session)")


def check_disk(minimum_gb: float = 5.0, where: Path = ROOT) -> Result:
    free = shutil.disk_usage(where).free
    return Result("disk", free >= minimum_gb * GB, f"{free / GB:.1f} GB free at {where} (need ≥ {minimum_gb:g} GB)",
                  "free some space (the venv and the prepared models take about 5 GB), or clone the "
                  "repository onto a larger disk")


def check_model(name: str = "smollm2-135m") -> Result:
    """The model loads (offline) and its token patches reproduce its logits on a short prompt."""
    start = time.perf_counter()
    try:
        import torch

        import icl_lens

        torch.set_num_threads(1)
        model = icl_lens.load_model(name)
        prompt = "The capital of France is Paris. The capital of Italy is"
        error = icl_lens.verify_equivalence(model, prompt, icl_lens.token_patches(model, prompt)).relative_error
    except Exception as err:  # any failure is the participant's to fix: say which and how
        return Result("model", False, f"{name} did not load ({type(err).__name__}: {str(err)[:160]})",
                      "run `make models` (or `icl-lens prepare`) once, online; check that `make setup` finished")
    seconds = time.perf_counter() - start
    return Result("model", error < 1e-4, f"{name} loads; identity error {error:.1e} ({seconds:.0f} s)",
                  "the token-patch identity fails on this machine: report it with `pip freeze` attached")


def check_widget() -> Result:
    """An ipywidgets slider and a plotly FigureWidget construct and serialise their state."""
    try:
        import ipywidgets
        import plotly.graph_objects as go
        from ipywidgets.widgets.widget import _remove_buffers

        sizes = []
        for widget in (ipywidgets.IntSlider(3), go.FigureWidget(go.Scatter(y=[1, 3, 2]))):
            state, _, _ = _remove_buffers(widget.get_state())
            sizes.append(len(json.dumps(state)))
            widget.close()
    except Exception as err:
        return Result("widget", False, f"widgets do not build ({type(err).__name__}: {str(err)[:160]})",
                      "reinstall the lab extras: `.venv/bin/pip install -e '.[lab]'`, then restart JupyterLab")
    return Result("widget", True, f"ipywidgets {ipywidgets.__version__} and plotly FigureWidget serialise "
                                  f"({sum(sizes) // 1024} kB of state)")


def run(stage: str, *, model: str, min_ram_gb: float, min_disk_gb: float | None) -> list[Result]:
    """Run the items of ``stage`` (``system`` or ``all``), printing each line as it completes."""
    disk = min_disk_gb if min_disk_gb is not None else (5.0 if stage == "system" else 1.0)
    checks = [check_python, lambda: check_ram(min_ram_gb), lambda: check_disk(disk)]
    if stage == "all":
        checks += [lambda: check_model(model), check_widget]
    results = []
    for check in checks:
        results.append(check())
        print(results[-1].line(), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("system", "all"), default="all",
                        help="system: Python, RAM and disk only (standard library); all: also the model and a widget")
    parser.add_argument("--model", default=os.environ.get("ICL_LENS_PREFLIGHT_MODEL", "smollm2-135m"),
                        help="the model the notebooks use (default smollm2-135m)")
    parser.add_argument("--min-ram-gb", type=float, default=2.0)
    parser.add_argument("--min-disk-gb", type=float, default=None,
                        help="default: 5 GB before setup (--stage system), 1 GB after")
    args = parser.parse_args(argv)
    results = run(args.stage, model=args.model, min_ram_gb=args.min_ram_gb, min_disk_gb=args.min_disk_gb)
    failed = [r.item for r in results if not r.ok]
    print(f"preflight: {'all ' + str(len(results)) + ' passed' if not failed else 'FAILED: ' + ', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
