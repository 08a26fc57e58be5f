"""Front ends built on the library: the live dashboard (``icl_lens.ui.dashboard``) and CLI subcommands.

Nothing is imported here, so the CLI does not pull in ipywidgets or plotly.
"""
