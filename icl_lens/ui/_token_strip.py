"""Token strip widget: the anywidget front end in the top-level ``widgets/`` folder
(``token_strip.js`` + ``.css``), installed as the package ``icl_lens.widgets``. The front end
also keeps the dashboard's plotly figure as wide as the dashboard (it has no width of its
own; see ``fitFigures`` there).

Synced traits: ``tokens``, ``values`` (patch norm per position), ``flags`` (spike flags),
``selected`` (clicked position, -1 for none), ``vmax`` (colour scale top), ``empty_text``.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import anywidget
import traitlets

# A source checkout run without installing (PYTHONPATH=.): widgets/ sits next to the package folder.
_CHECKOUT_WIDGETS = Path(__file__).resolve().parents[2] / "widgets"


def widgets_dir() -> Path:
    """Folder of the front-end assets: the installed package ``icl_lens.widgets`` (a wheel, or an
    editable install, which maps it to the checkout's ``widgets/``), else a checkout's ``widgets/``."""
    try:
        return Path(str(resources.files("icl_lens.widgets")))
    except ModuleNotFoundError:
        if (_CHECKOUT_WIDGETS / "token_strip.js").is_file():
            return _CHECKOUT_WIDGETS
        raise FileNotFoundError("the dashboard's front-end assets (icl_lens.widgets) are not installed, and "
                                f"{_CHECKOUT_WIDGETS} is not a checkout's widgets/ folder; reinstall icl_lens") from None


class TokenStrip(anywidget.AnyWidget):
    _esm = widgets_dir() / "token_strip.js"
    _css = widgets_dir() / "token_strip.css"

    tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    values = traitlets.List(traitlets.Float()).tag(sync=True)
    flags = traitlets.List(traitlets.Bool()).tag(sync=True)
    selected = traitlets.Int(-1).tag(sync=True)
    vmax = traitlets.Float(0.0).tag(sync=True)
    empty_text = traitlets.Unicode("Type a prompt to see its token patches.").tag(sync=True)
