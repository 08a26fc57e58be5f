# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %%
import os

import icl_lens

# The browser test serves this with Voila; ICL_LENS_TEST_MODEL picks the model (default: a tiny one).
dash = icl_lens.dashboard(os.environ.get("ICL_LENS_TEST_MODEL", "tiny-gpt2"), debounce_s=0.1)
dash
