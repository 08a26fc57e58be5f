"""What every report fragment (``reports/eval_*.md``, ``reports/bench_*.md``) shares.

The machine line is read from the machine at the time of the run (CPUs usable by this
process and their model, torch threads, load average, the GPU when one is used), the
command line from the arguments given, so no fragment carries a typed-in description.
"""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import pandas as pd
import torch


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else what :mod:`platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> float:
    """One-minute load average (NaN where the system has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def machine(device: str = "cpu", load_before: float | None = None) -> str:
    """One line describing what ran the measurement, now.

    ``load_before``: the load average taken when the measurement started; the line then
    gives it next to the current one.
    """
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = f"{load_average():.1f}" if load_before is None else f"{load_before:.1f} before / {load_average():.1f} after"
    text = (f"{usable} CPU cores usable of {os.cpu_count()} ({cpu_model()}, {platform.machine()} {platform.system()}), "
            f"torch {torch.__version__} with {torch.get_num_threads()} thread(s), Python {platform.python_version()}, "
            f"load average {load}")
    if str(device).startswith("cuda"):
        text += f"; GPU {torch.cuda.get_device_name(device)}"
    return text


def command(prefix: str, argv: list[str] | None = None) -> str:
    """The command that produced a fragment: ``prefix`` and its arguments (``sys.argv[1:]`` when None)."""
    return " ".join([prefix, *(sys.argv[1:] if argv is None else argv)])


def write_fragment(path, lines: list[str]) -> str:
    """Write ``lines`` as one Markdown fragment (parent folders created); returns the text."""
    text = "\n".join(lines).rstrip("\n") + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return text


def markdown_table(df: pd.DataFrame, digits: int = 4) -> str:
    """A GitHub table; floats in ``digits`` significant digits (scientific when small)."""
    def fmt(x):
        if isinstance(x, float):
            return f"{x:.{digits}g}" if x == 0 or 1e-3 <= abs(x) < 1e5 else f"{x:.2e}"
        return str(x)
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])
