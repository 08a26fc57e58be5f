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
# Exports (and the saved view) go to ICL_LENS_EXPORT_DIR: the test's temporary folder, not the checkout.
dash = icl_lens.dashboard(os.environ.get("ICL_LENS_TEST_MODEL", "tiny-gpt2"), debounce_s=0.1,
                          export_dir=os.environ.get("ICL_LENS_EXPORT_DIR", "icl_lens_exports"))
dash
