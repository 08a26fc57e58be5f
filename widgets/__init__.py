"""The dashboard's front-end source: anywidget ES modules and their CSS (``token_strip.js``,
``token_strip.css``). Installed as the package ``icl_lens.widgets`` (pyproject.toml maps this folder);
:func:`icl_lens.ui._token_strip.widgets_dir` finds it installed or in a checkout."""
