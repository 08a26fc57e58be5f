"""Export what the dashboard shows: figures as HTML or PNG, numbers as tidy CSV."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import plotly.io as pio

CHROMIUM = "/usr/bin/chromium"


def export_html(figures: dict, folder: Path) -> list[Path]:
    """One self-contained HTML file with every figure (plotly.js inlined once)."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = [pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False) for i, fig in enumerate(figures.values())]
    path = folder / "dashboard_figures.html"
    path.write_text("<html><head><meta charset='utf-8'></head><body>" + "\n".join(parts) + "</body></html>",
                    encoding="utf-8")
    return [path]


def export_png(figures: dict, folder: Path) -> list[Path]:
    """One PNG per figure (plotly's kaleido, which drives a local Chrome/Chromium)."""
    try:
        import kaleido  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("PNG export needs the kaleido package (pip install kaleido); "
                           "use 'figures → HTML' instead") from exc
    browser = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if browser and "BROWSER_PATH" not in os.environ:
        os.environ["BROWSER_PATH"] = browser  # kaleido (choreographer) then uses the system Chromium
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.png" for name in figures]
    try:
        pio.write_images(list(figures.values()), paths)  # one browser session for all figures
    except Exception as exc:  # noqa: BLE001 - say what is missing instead of a traceback
        raise RuntimeError(f"PNG export failed ({type(exc).__name__}: {str(exc).splitlines()[0]}); kaleido "
                           f"needs Chrome or Chromium (set BROWSER_PATH); use 'figures → HTML' instead") from exc
    return paths


def export_csv(patches, spikes, trajectory, folder: Path) -> list[Path]:
    """``norms.csv`` (layer × position patch and correction norms, spike scores) and, if a
    query is selected, ``trajectory.csv`` and ``decay_fit.csv``."""
    if patches is None:
        raise RuntimeError("nothing to export yet: type a prompt first")
    folder.mkdir(parents=True, exist_ok=True)
    frame = patches.to_frame()
    if spikes is not None:
        spike_frame = spikes.to_frame()
        keep = [c for c in spike_frame.columns if c not in ("token",)]
        frame = frame.merge(spike_frame[keep], on="position", how="left", suffixes=("", "_spike"))
    paths = [folder / "norms.csv"]
    frame.to_csv(paths[0], index=False)
    if trajectory is not None:
        paths.append(folder / "trajectory.csv")
        trajectory.to_frame().to_csv(paths[-1], index=False)
        paths.append(folder / "decay_fit.csv")
        trajectory.decay_fit().to_frame().to_csv(paths[-1], index=False)
    return paths
