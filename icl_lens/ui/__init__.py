"""Front ends built on the library: the live dashboard (:func:`dashboard`, ``icl_lens.dashboard()``) and
the figure helpers the notebooks share with it (:func:`layer_lines`, :func:`vertical_marker`).

Names are imported on first use, so the command line (which imports this package's siblings) does
not pull in ipywidgets or plotly.
"""
from typing import TYPE_CHECKING

from icl_lens._lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.ui._app_mode import APP_MODELS_ENV
    from icl_lens.ui._dashboard import Dashboard, dashboard
    from icl_lens.ui._panels import layer_lines, token_label, vertical_marker

__getattr__, __dir__, __all__ = lazy_exports(globals())
