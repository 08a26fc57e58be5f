"""Model side of icl_lens: loading models, capturing activations through TransformerLens
hooks (always inside context managers that remove them), and applying patches."""
