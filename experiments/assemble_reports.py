"""Assemble EVAL.md and BENCHMARKS.md from the fragments the eval/benchmark commands write.

Each command writes ``reports/eval_<topic>.md`` or ``reports/bench_<topic>.md`` (its own
numbers, the command that produced them, the machine). This script only concatenates
them in a fixed order under a short header, so the two top-level files never drift
from what the commands printed.

    python -m experiments.assemble_reports
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
HEADERS = {
    "eval": ("EVAL.md", "# Evaluations\n\nProduced by the commands named in each section (`python -m experiments.<name>`, "
             "run from the repository root); "
             "rebuild this file with `python -m experiments.assemble_reports` after re-running them. "
             "Numbers are what the commands printed on the machine stated, whatever they were.\n"),
    "bench": ("BENCHMARKS.md", "# Benchmarks\n\nSpeed and memory, measured by the scripts in `benchmarks/`; "
              "each section names its command and machine. Ratios are against a baseline measured in the "
              "same run. Rebuild this file with `python -m experiments.assemble_reports`.\n"),
}
ORDER = ["summary", "patches", "patches_4096", "patches_floor", "patches_floor_all_cores", "patches_256_rounds", "patches_256_rounds_all_cores", "gpu", "trajectory", "dashboard", "attribution", "thought",
         "thought_all_cores", "spikes", "finetune_alignment", "lab_training", "lab"]


def _key(path: Path) -> tuple[int, str]:
    topic = path.stem.split("_", 1)[1]
    return (ORDER.index(topic) if topic in ORDER else len(ORDER), topic)


def gpu_line(fragments: list[str]) -> str:
    """Which sections ran on a GPU, read from their ``Machine:`` lines (``experiments.report.machine``)."""
    gpu = [f.splitlines()[0].lstrip("# ") for f in fragments if re.search(r"Machine:.*; GPU ", f)]
    return f"Sections measured on a GPU: {'; '.join(gpu) if gpu else 'none'}.\n"


def main() -> None:
    import sys

    sys.path.insert(0, str(ROOT))
    from experiments.report import write_summary

    write_summary(REPORTS)  # the one-screen summary, from the reports' JSON
    for kind, (name, header) in HEADERS.items():
        fragments = [p.read_text().strip() + "\n" for p in sorted(REPORTS.glob(f"{kind}_*.md"), key=_key)]
        parts = [header.rstrip("\n") + " " + gpu_line(fragments)] + fragments
        (ROOT / name).write_text("\n".join(parts))
        print(f"wrote {name} from {len(parts) - 1} fragment(s)")


if __name__ == "__main__":
    main()
