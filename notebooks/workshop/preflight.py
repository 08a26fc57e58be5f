"""Preflight for a workshop participant's machine: one PASS/FAIL line per item, with what to do on a FAIL.

    python notebooks/workshop/preflight.py --stage system   # before setup, any Python: version, free RAM, free disk
    python notebooks/workshop/preflight.py                  # after setup (the venv's Python): also the model and a widget

``make preflight`` runs both (the first with the system Python, then ``make models``, then the
second with the venv's). Items:

- **python**: the version pyproject.toml requires (≥ 3.10);
- **ram**: available memory (a notebook's kernel peaks near 1.3 GB with SmolLM2-135M, JupyterLab and a
  browser tab need the rest), read without any third-party package: ``/proc/meminfo`` on Linux,
  ``sysctl hw.memsize`` and ``vm_stat`` on macOS, psutil where it is installed; where none can tell,
  the line is a ``WARN`` (check by hand), never a stop;
- **disk**: free space where the repository lives (the venv with the CPU build of torch and the prepared models
  take about 5 GB; 1 GB spare once they are installed);
- **model**: the embedded model loads offline, and its token patches reproduce its logits on a short prompt;
- **widget**: ipywidgets and a plotly ``FigureWidget`` construct and serialise their state (what JupyterLab
  renders).

Only the standard library is imported at the top, so ``--stage system`` runs before anything is installed
(macOS's system Python has no psutil). The exit status is 1 when any item fails; a ``WARN`` is not a failure.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GB = 2**30
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class Result:
    """One preflight item: passed or not, what was found, and what to do when it failed.

    ``warn``: the item could not be measured here; it does not fail the preflight, and the line
    says what to check by hand (``fix``)."""

    item: str
    ok: bool
    found: str
    fix: str = ""
    warn: bool = False

    def line(self) -> str:
        status = "WARN" if self.warn else "PASS" if self.ok else "FAIL"
        return f"{status}  {self.item:<7} {self.found}" + ("" if self.ok and not self.warn else f"  → {self.fix}")


def check_python(minimum: tuple[int, int] = (3, 10)) -> Result:
    found = ".".join(map(str, sys.version_info[:3]))
    return Result("python", sys.version_info[:2] >= minimum, f"{found} (need ≥ {'.'.join(map(str, minimum))})",
                  f"install Python {minimum[0]}.{minimum[1]}–3.12 (python.org, or your package manager), then "
                  f"`make preflight PY=python3.11` (PY names the interpreter)")


def _command(*args: str) -> str | None:
    """The standard output of a system command, or None where it is missing or fails (within 10 s)."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def vm_stat_available(text: str) -> int | None:
    """Bytes available from macOS's ``vm_stat`` output: free, inactive, speculative and purgeable pages.

    Those are the pages macOS hands to a new program without swapping (what Activity Monitor
    counts as not in use, less the compressed and wired memory). None if ``text`` is not vm_stat's.
    """
    size = re.search(r"page size of (\d+) bytes", text)
    pages = {m.group(1).lower(): int(m.group(2)) for m in re.finditer(r"^Pages ([\w ]+?):\s+(\d+)\.?\s*$", text, re.M)}
    counted = [pages[k] for k in ("free", "inactive", "speculative", "purgeable") if k in pages]
    if size is None or "free" not in pages:
        return None
    return sum(counted) * int(size.group(1))


def available_memory() -> int | None:
    """Bytes of memory available to a new program, or None where this machine does not say.

    Linux: ``MemAvailable`` of ``/proc/meminfo``; macOS: ``vm_stat`` (capped by ``sysctl hw.memsize``,
    the installed memory); elsewhere psutil when installed. No third-party package is needed on
    Linux or macOS.
    """
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    stat = _command("vm_stat")
    free = vm_stat_available(stat) if stat else None
    if free is not None:
        total = _command("sysctl", "-n", "hw.memsize")
        return min(free, int(total)) if total and total.strip().isdigit() else free
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def check_ram(minimum_gb: float = 2.0) -> Result:
    free = available_memory()
    if free is None:
        return Result("ram", True, "could not read the available memory on this system",
                      f"check it by hand (Activity Monitor, Task Manager or `free -h`): {minimum_gb:g} GB must be "
                      "free; `pip install psutil` lets this check read it", warn=True)
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
    warned = [r.item for r in results if r.warn]
    passed = f"all {len(results)} passed" + (f" (check by hand: {', '.join(warned)})" if warned else "")
    print(f"preflight: {passed if not failed else 'FAILED: ' + ', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
