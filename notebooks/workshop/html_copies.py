"""Executed HTML copies of the workshop notebooks, to project when a kernel stalls or runs slow in the room.

    make html                                                   # every notebook, into build/html/
    python notebooks/workshop/html_copies.py --out DIR [--as-opened] [05_live_dashboard ...]

Each notebook runs top to bottom in a fresh kernel, as the notebook tests run it (working directory
``notebooks/``, one torch thread, 05 on its own model, SmolLM2-135M), and is written as one HTML
file ``DIR/<notebook>.html``. The hidden solutions are on (``ICL_LENS_SOLUTIONS=1``: every exercise
answered, what the answer sheet in docs/workshop.md shows) unless ``--as-opened`` (every check says
"no answer yet"). For 05 the dashboard's view of the exercise prompt is also saved as
``DIR/05_dashboard_view.html`` (``Dashboard.save_html``: one file that any browser opens with no
kernel and no network), the fallback when the live dashboard is too slow. ``build/`` is ignored by
git: the copies are built the day before, never committed. A notebook that fails is reported and the
others still run; the exit status is then 1.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter

NOTEBOOKS = Path(__file__).resolve().parents[1]
DASHBOARD_PROMPT = "The capital of France is Paris. The capital of Italy is"  # exercise 1 of 05
VIEW_CELL = "dash.set_prompt({prompt!r})\ndash.save_html({path!r})"


def build(stem: str, out: Path, *, solutions: bool, timeout: int = 1800) -> Path:
    """Execute ``notebooks/<stem>.ipynb`` in a fresh kernel and write ``out/<stem>.html``; return its path."""
    nb = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    view = None
    if any("icl_lens.dashboard(" in c.source for c in nb.cells if c.cell_type == "code"):
        view = nbformat.v4.new_code_cell(VIEW_CELL.format(prompt=DASHBOARD_PROMPT,
                                                          path=str(out / f"{stem[:2]}_dashboard_view.html")))
        nb.cells.append(view)
    os.environ["ICL_LENS_SOLUTIONS"] = "1" if solutions else "0"  # the kernel inherits this process's environment
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}},
                   store_widget_state=True).execute()
    if view is not None:
        nb.cells.remove(view)  # the copy shows the notebook as users open it; the view is its own file
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    path = out / f"{stem}.html"
    path.write_text(body, encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stems", nargs="*", help="notebooks to build (default: every numbered one), e.g. 05_live_dashboard")
    parser.add_argument("--out", type=Path, default=NOTEBOOKS.parent / "build" / "html")
    parser.add_argument("--as-opened", action="store_true", help="solutions off: every check says 'no answer yet'")
    args = parser.parse_args(argv)
    stems = args.stems or sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    unknown = [s for s in stems if not (NOTEBOOKS / f"{s}.ipynb").exists()]
    if unknown:
        parser.error(f"no such notebook in {NOTEBOOKS}: {', '.join(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for i, stem in enumerate(stems, 1):
        start = time.perf_counter()
        print(f"[{i}/{len(stems)}] {stem} …", end=" ", flush=True)
        try:
            path = build(stem, args.out, solutions=not args.as_opened)
        except Exception as err:  # one notebook's failure is reported; the others are still built
            failed.append(stem)
            print(f"FAILED ({type(err).__name__}: {str(err).strip().splitlines()[-1][:200] if str(err).strip() else ''})")
            continue
        print(f"{path} ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"html copies in {args.out}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
