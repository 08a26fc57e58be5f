"""Token strip widget: the anywidget front end in ``widgets/token_strip.js`` (+ ``.css``),
package data next to this module. The front end also keeps the dashboard's plotly figure
as wide as the dashboard (it has no width of its own; see ``fitFigures`` there).

Synced traits: ``tokens``, ``values`` (patch norm per position), ``flags`` (spike flags),
``selected`` (clicked position, -1 for none), ``vmax`` (colour scale top), ``empty_text``.
"""
from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets


def widgets_dir() -> Path:
    """Folder of the front-end assets (``icl_lens/ui/widgets``, shipped as package data)."""
    return Path(__file__).resolve().with_name("widgets")


class TokenStrip(anywidget.AnyWidget):
    _esm = widgets_dir() / "token_strip.js"
    _css = widgets_dir() / "token_strip.css"

    tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    values = traitlets.List(traitlets.Float()).tag(sync=True)
    flags = traitlets.List(traitlets.Bool()).tag(sync=True)
    selected = traitlets.Int(-1).tag(sync=True)
    vmax = traitlets.Float(0.0).tag(sync=True)
    empty_text = traitlets.Unicode("Type a prompt to see its token patches.").tag(sync=True)
