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

# %% [markdown]
# # 05 · Open exploration: the live dashboard
#
# **Learning objective.** Use what notebooks 01–04 built to explore your own prompts: read the per-token patch
# norms within a layer, pick a query and read its implicit dynamics (decay exponent α, with the sign read as in
# 03), and check any surprising number with the library.
#
# **Time box: 15 minutes**, open exploration (in a 3-hour session, pick 05 or 06; the other is homework); the
# two exercises are a starting point.
#
# Every token of a prompt changes the first MLP weights of every layer by a rank-1 *token patch*
# `ΔW = (W δ) aᵀ/‖a‖²` plus the skip correction (Dherin et al. 2025, arXiv 2507.16003; notebook 01). Type below: the
# strip colours each token by its patch norm (▲ = spike flag, notebook 06), the heatmap shows every layer (colour
# per cell: compare tokens within a layer, not layers), and clicking a token shows how its implicit weights evolve as
# context is consumed (meta-gradient norms, log–log, with the fitted decay exponent α: α > 0 means the steps
# shrink, which is not yet convergence). Appending text recomputes only the new positions (`PatchSession`).
# `make lab` opens this notebook; `make app` serves the dashboard alone (Voila).

# %%
import torch

import icl_lens
from workshop.claims import claim, claims_view, count_where
from workshop.exercise_checks import check_answer, check_choice

torch.set_num_threads(1)
dash = icl_lens.dashboard()  # embedded Gemma 3 270M; try model='smollm2-135m'
dash

# %% [markdown]
# ## Exercise 1 · Which token? (5 min)
#
# Type `The capital of France is Paris. The capital of Italy is` into the dashboard. Which token has the largest patch
# norm in the last layer? Read it off the heatmap, put the token text into `answer_1`, then run the check.

# %%
answer_1 = None  # e.g. " Paris"

# %% jupyter={"source_hidden": true} tags=["solution"]
frame = icl_lens.token_patches(dash.model, "The capital of France is Paris. The capital of Italy is").to_frame()
last = frame[frame.layer == frame.layer.max()]
answer_1 = last.loc[last.norm.idxmax(), "token"]
last.nlargest(3, "norm")[["position", "token", "norm"]]

# %%
prompt = "The capital of France is Paris. The capital of Italy is"
patches = icl_lens.token_patches(dash.model, prompt)
every = patches.to_frame()
last_layer = every[every.layer == every.layer.max()]
check_answer(str(answer_1).strip(), last_layer.loc[last_layer.norm.idxmax(), "token"].strip(),
             "token with the largest last-layer patch norm")

# %% [markdown]
# ## Exercise 2 · Predict, then check: do the last token's steps shrink? (5 min)
#
# **Predict** for the same prompt: in most layers, do the meta-gradients of the last token *shrink* (α > 0) or
# *grow* (α < 0)? Write `"shrink"` or `"grow"` into `prediction_2`. Then read the fitted exponents in the bar chart
# (hover a line for its layer's α and R²), or compute them with
# `icl_lens.trajectory(dash.model, prompt).decay_fit().to_frame()`.

# %%
prediction_2 = None  # "shrink" or "grow"

# %% jupyter={"source_hidden": true} tags=["solution"]
fit = icl_lens.trajectory(dash.model, "The capital of France is Paris. The capital of Italy is").decay_fit().to_frame()
prediction_2 = "shrink" if (fit.exponent > 0).mean() > 0.5 else "grow"
fit[["layer", "exponent", "r_squared"]].round(2)

# %%
exponents = icl_lens.trajectory(dash.model, prompt).decay_fit().to_frame().exponent
shrinking = count_where(exponents, lambda a: a > 0)
check_choice(prediction_2, "shrink" if (exponents > 0).mean() > 0.5 else "grow", ("shrink", "grow"),
             "do most layers' steps shrink", why=f"α > 0 in {shrinking} layers on this prompt.")

# %% [markdown]
# ## Paper says / we measure (on the exercise prompt)

# %%
report = icl_lens.verify_equivalence(dash.model, prompt, patches)
assert report.relative_error < 1e-4
claims_view([
    claim("The patches behind the dashboard are exact", "Dherin et al. 2025", f"relative error {report.relative_error:.1e}",
          "float32 tolerance 1e-4", report.relative_error < 1e-4, ""),
    claim("Meta-gradients shrink as the context grows", "Dherin et al. 2025", f"α > 0 in {shrinking} layers",
          "α = 0: steps of constant size", bool((exponents > 0).mean() > 0.5),
          "One prompt: explore others; notebook 03 and EVAL.md for more."),
])
