"""One self-contained HTML file of what the dashboard shows, and browser downloads of exported files.

The page needs no kernel and no network: the plotly figures are inlined with plotly.js
(``include_plotlyjs=True``), the token strips are static HTML coloured as the live
widget colours them (``widgets/token_strip.js``), the next-token predictions a table, and
the attention pattern circuitsvis' own offline bundle in a frame. It is the fallback where
widgets cannot run (Colab, VS Code without network) and a file to share.

Downloads: a link whose ``href`` is a ``data:`` URL with a ``download`` attribute, shown in an
``ipywidgets.HTML``; the browser saves the file (JupyterLab, Voila, and the saved page alike)
without any server route.
"""
from __future__ import annotations

import base64
import datetime as dt
import html
import mimetypes
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from icl_lens.ui._token_strip import widgets_dir

MIME = {".html": "text/html", ".png": "image/png", ".svg": "image/svg+xml", ".csv": "text/csv"}


def strip_colour(value: float, vmax: float) -> str:
    """The live token strip's colour (white → deep orange) for ``value`` on a ``0..vmax`` scale."""
    x = max(0.0, min(1.0, value / vmax)) if vmax > 0 else 0.0
    return f"rgb(255,{round(255 - 150 * x)},{round(255 - 220 * x)})"


def static_strip(tokens, values, flags, selected: int, vmax: float, label, *, css_class: str = "") -> str:
    """The token strip as static HTML: the same classes, colours, titles and markers as the live widget."""
    spans = []
    for pos, (tok, value) in enumerate(zip(tokens, values)):
        classes = "icl-token" + (" icl-flagged" if flags and flags[pos] else "") + (" icl-selected" if pos == selected else "")
        title = (f"position {pos} · {tok!r} · mean patch norm over layers {value:.3g}"
                 + (" · spike" if flags and flags[pos] else ""))
        spans.append(f"<span class='{classes}' data-position='{pos}' title='{html.escape(title, quote=True)}' "
                     f"style='background:{strip_colour(value, vmax)}'>{html.escape(label(tok))}</span>")
    return (f"<div class='icl-token-strip {css_class}' data-count='{len(spans)}'>{''.join(spans)}</div>")


def figure_html(fig, first: bool) -> str:
    """A plotly figure as a ``<div>``; the first one carries plotly.js inline."""
    static = go.Figure(fig.to_dict())
    return pio.to_html(static, include_plotlyjs=True if first else False, full_html=False,
                       config={"responsive": True, "displaylogo": False})


def view_page(*, title: str, header: str, sections: list[str], figures: list, after: list[str] = ()) -> str:
    """The whole page: ``sections`` (HTML, in order), ``figures`` (plotly figures), then ``after`` (HTML)."""
    css = (widgets_dir() / "token_strip.css").read_text(encoding="utf-8")
    plots = [figure_html(fig, i == 0) for i, fig in enumerate(figures)]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{css}\n"
            "body{font-family:sans-serif;margin:12px auto;max-width:1400px;padding:0 12px;color:#222}"
            ".icl-side{display:flex;gap:8px}.icl-side>*{flex:1 1 0;min-width:0}</style></head>"
            f"<body class='icl-saved-view'><h3 style='margin:4px 0'>{html.escape(title)}</h3>"
            f"<div class='icl-saved-header'>{header}<br><small>saved {stamp} by icl_lens.dashboard.save_html; "
            "static: no kernel, no network</small></div>" + "\n".join(sections) + "\n".join(plots)
            + "\n".join(after) + "</body></html>")


def download_link(path: Path) -> str:
    """An ``<a download>`` link carrying the file in a ``data:`` URL (the browser saves it; no server route)."""
    path = Path(path)
    mime = MIME.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    size = path.stat().st_size
    shown = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
    return (f"<a class='icl-download' download='{html.escape(path.name, quote=True)}' "
            f"href='data:{mime};base64,{data}' style='margin-right:12px'>⬇ {html.escape(path.name)} ({shown})</a>")


def download_links(paths) -> str:
    return "<span class='icl-downloads'>download: " + "".join(download_link(p) for p in paths) + "</span>"
