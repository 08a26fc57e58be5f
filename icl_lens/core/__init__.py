"""Math core of icl_lens: pure torch on tensors, no model code.

Nothing in this sub-package imports transformer_lens, transformers, ipywidgets or
plotly; the model side (:mod:`icl_lens.model`) and the front ends build on it.
"""
