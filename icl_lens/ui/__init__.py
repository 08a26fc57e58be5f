"""Front ends built on the library: the live dashboard (ipywidgets + plotly + circuitsvis)."""
from icl_lens.ui.dashboard import Dashboard, dashboard

__all__ = ["Dashboard", "dashboard"]
