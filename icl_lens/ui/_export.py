"""Export what the dashboard shows: figures as HTML, PNG or SVG (explicit sizes), the attention view as
HTML, numbers as tidy CSV."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import plotly.io as pio

CHROMIUM = "/usr/bin/chromium"
EXPORT_WIDTH = 1000  # px: inside the 800–1400 px range the figures are laid out (and browser-tested) for


def export_html(figures: dict, folder: Path) -> list[Path]:
    """One self-contained HTML file with every figure (plotly.js inlined once)."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = [pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False) for i, fig in enumerate(figures.values())]
    path = folder / "dashboard_figures.html"
    path.write_text("<html><head><meta charset='utf-8'></head><body>" + "\n".join(parts) + "</body></html>",
                    encoding="utf-8")
    return [path]


def export_size(fig, width: int = EXPORT_WIDTH) -> tuple[int, int]:
    """``(width, height)`` in px for a static image of ``fig``: its layout height, at ``width``.

    ``plotly.io.write_image(s)`` draws at 700 × 500 unless told otherwise, whatever the layout
    says; the dashboard's figures are laid out for 800–1400 px wide and their own height.
    """
    return int(fig.layout.width or width), int(fig.layout.height or 500)


def export_images(figures: dict, folder: Path, fmt: str = "png", width: int = EXPORT_WIDTH) -> list[Path]:
    """One PNG or SVG per figure at :func:`export_size` (plotly's kaleido, which drives a local Chrome/Chromium)."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"image format must be 'png' or 'svg', got {fmt!r}")
    try:
        import kaleido  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("PNG/SVG export needs the kaleido package (pip install kaleido); "
                           "use 'view → HTML' instead") from exc
    browser = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if browser and "BROWSER_PATH" not in os.environ:
        os.environ["BROWSER_PATH"] = browser  # kaleido (choreographer) then uses the system Chromium
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.{fmt}" for name in figures]
    sizes = [export_size(fig, width) for fig in figures.values()]
    try:  # one browser session for all figures; explicit sizes (the layout's are ignored)
        pio.write_images(list(figures.values()), paths, format=fmt, width=[w for w, _ in sizes],
                         height=[h for _, h in sizes])
    except Exception as exc:  # noqa: BLE001 - say what is missing instead of a traceback
        raise RuntimeError(f"{fmt.upper()} export failed ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
                           f"kaleido needs Chrome or Chromium (set BROWSER_PATH); use 'view → HTML' instead") from exc
    return paths


def export_png(figures: dict, folder: Path, width: int = EXPORT_WIDTH) -> list[Path]:
    """One PNG per figure, ``width`` px wide and as tall as its layout."""
    return export_images(figures, folder, "png", width)


def export_svg(figures: dict, folder: Path, width: int = EXPORT_WIDTH) -> list[Path]:
    """One SVG per figure, ``width`` px wide and as tall as its layout."""
    return export_images(figures, folder, "svg", width)


def export_attention(page: str | None, layer: int, head: int, folder: Path) -> list[Path]:
    """The attention view (circuitsvis' offline page of one layer and head) as an HTML file."""
    if page is None:
        raise RuntimeError("nothing to export yet: type a prompt first")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"attention_L{layer}_H{head}.html"
    path.write_text(page, encoding="utf-8")
    return [path]


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
