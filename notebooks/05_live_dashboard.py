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

# %% [markdown]
# # 05 · Open exploration: the live dashboard
#
# Type a prompt: each token's *token patch* (the rank-1 change reading it makes to every layer's first MLP weights,
# Dherin et al. 2025) colours the strip and the heatmap; click a token to see how its implicit weights evolve as the
# context is consumed.
#
# **Memory.** In the notebook tests (SmolLM2-135M, solutions on) this kernel peaked at
# <!-- report:memory_05 -->1.23 GB (above the 1 GB Binder guarantees; measured 2026-12-06)<!-- /report -->: run one notebook's kernel at a time (Binder allows up to 2 GB when its machine has it free).

# %% [markdown] tags=["lesson"]
# **Learning objective.** Use what notebooks 01–04 built to explore your own prompts: read the per-token patch
# norms within a layer, pick a query and read its implicit dynamics (decay exponent α, with the sign read as in
# 03), and check any surprising number with the library.
#
# **Time box: 15 minutes**, open exploration (in a 3-hour session, pick 05 or 06; the other is homework); the
# two exercises are a starting point.
#
# Every token of a prompt changes the first MLP weights of every layer by a rank-1 *token patch*
# `ΔW = (W δ) aᵀ/‖a‖²`, plus the skip correction (Dherin et al. 2025, arXiv 2507.16003; notebook 01). Type below: the
# strip colours each token by its patch norm (▲ = spike flag, notebook 06), the heatmap shows every layer (compare
# tokens within a layer, not layers), and clicking a token shows how its implicit weights evolve as context is
# consumed (meta-gradient norms, log–log, with the fitted decay exponent α: α > 0 means the steps shrink, which is
# not yet convergence). Appending text recomputes only the new positions (`PatchSession`). `make lab` opens this
# notebook; `make app` serves the dashboard alone (Voila: the cells tagged `lesson`, these exercises, are left out).
# The model is the workshop's, the embedded SmolLM2-135M, as in notebooks 01–04 and 06 and in the answer sheet
# (docs/workshop.md); the first code cell says how to switch to Gemma 3 270M (the papers' family, about 2.2 GB of
# memory).
#
# The dashboard stays live for the whole notebook: nothing below closes it. When you are done, shut the kernel down
# (*Kernel → Shut Down Kernel*) to free its memory before you open another notebook.

# %%
import os

import torch

import icl_lens
from icl_lens.stats import wilson_interval
from workshop.claims import answer_sheet, claim, claims_view, count_where
from workshop.exercise_checks import check_answer, check_compare, check_sheet, solutions_on

torch.set_num_threads(1)
# The workshop model, SmolLM2-135M (what the answer sheet measured). To switch, set MODEL = "gemma-3-270m" here
# (needs about 2.2 GB free), or start JupyterLab with `ICL_LENS_WORKSHOP_MODEL=gemma-3-270m make lab`.
MODEL = os.environ.get("ICL_LENS_WORKSHOP_MODEL", "smollm2-135m")
dash = icl_lens.dashboard(MODEL)
# the guide's expected answers, measured on MODEL (reports/workshop_answers.json); the checks compare this run with it
sheet = answer_sheet("05_live_dashboard", MODEL)
dash

# %% [markdown] tags=["lesson"]
# ## Exercise 1 · Which token? (5 min)
#
# Type `The capital of France is Paris. The capital of Italy is` into the dashboard. Which token has the largest patch
# norm in the last layer? Switch the colour toggle from *global scale* to **per-layer scale**: each layer's row is then
# coloured by its own largest norm, so the last layer's brightest cell is its largest token even where other layers'
# norms are much bigger. Read it off the heatmap's top row (hover for the token), put the token text into
# `answer_1`, then run the check.

# %% tags=["lesson"]
answer_1 = None  # e.g. " Paris"

# %% jupyter={"source_hidden": true} tags=["lesson", "solution"]
if solutions_on():  # runs only in the notebook tests (ICL_LENS_SOLUTIONS=1); read it or copy it up
    frame = icl_lens.token_patches(dash.model, "The capital of France is Paris. The capital of Italy is").to_frame()
    last = frame[frame.layer == frame.layer.max()]
    answer_1 = last.loc[last.norm.idxmax(), "token"]
    print(last.nlargest(3, "norm")[["position", "token", "norm"]])

# %% tags=["lesson"]
prompt = "The capital of France is Paris. The capital of Italy is"
patches = icl_lens.token_patches(dash.model, prompt)
every = patches.to_frame()
last_layer = every[every.layer == every.layer.max()]
check_answer(None if answer_1 is None else str(answer_1).strip(),
             last_layer.loc[last_layer.norm.idxmax(), "token"].strip(), "token with the largest last-layer patch norm")
check_sheet({"largest_last_layer_token": last_layer.loc[last_layer.norm.idxmax(), "token"].strip()}, sheet,
            "the token with the largest last-layer norm")

# %% [markdown] tags=["lesson"]
# ## Exercise 2 · Predict, then check: do the steps shrink? (5 min)
#
# **Predict**: for the last token of a prompt, do the meta-gradients *shrink* (α > 0) or *grow* (α < 0) in most
# layers, or can't three prompts tell (`"not distinguishable"`)? Write `"shrink"`, `"grow"` or
# `"not distinguishable"` into `prediction_2`. Then read the fitted exponents in the dashboard (click the last token;
# hover a line for its layer's α and R²), or compute them with
# `icl_lens.trajectory(dash.model, prompt).decay_fit().to_frame()`. The check pools the layers of three prompts.

# %% tags=["lesson"]
prediction_2 = None  # "shrink", "grow" or "not distinguishable"

# %% jupyter={"source_hidden": true} tags=["lesson", "solution"]
if solutions_on():
    fit = icl_lens.trajectory(dash.model, "The capital of France is Paris. The capital of Italy is").decay_fit()
    print(fit.to_frame()[["layer", "exponent", "r_squared"]].round(2))
    prediction_2 = "grow"

# %% tags=["lesson"]
exercise_prompts = [prompt, "The cat sat on the mat. The dog sat on the rug. The bird sat on the",
                    "One, two, three, four, five, six, seven,"]
exponents = [e for p in exercise_prompts for e in icl_lens.trajectory(dash.model, p).decay_fit().to_frame().exponent]
shrinking = count_where(exponents, lambda a: a > 0)
k, n = sum(e > 0 for e in exponents), len(exponents)
check_compare(prediction_2, (k / n, *wilson_interval(k, n)), (0.5, 0.5, 0.5), "do most layers' steps shrink",
              labels=("shrink", "grow"), names=("share of layers with α > 0", "half"),
              why=f"α > 0 in {shrinking} (prompt, layer) pairs over three prompts.")
check_sheet({"shrinking": k, "prompt_layer_pairs": n}, sheet, "the pairs whose steps shrink")

# %% [markdown] tags=["lesson"]
# ## Paper says / we measure (on the exercise prompts)

# %% tags=["lesson"]
report = icl_lens.verify_equivalence(dash.model, prompt, patches)
assert report.relative_error < 1e-4
claims_view([
    claim("The patches behind the dashboard are exact (rank-1 patch + correction)", "Dherin et al. 2025",
          f"relative error {report.relative_error:.1e}", "float32 tolerance 1e-4", report.relative_error < 1e-4, ""),
    claim("Attention's meta-gradients shrink as the context grows", "Dherin et al. 2025",
          f"α > 0 in {shrinking} (prompt, layer) pairs", "α = 0: steps of constant size",
          k / n > 0.5 and wilson_interval(k, n)[0] > 0.5,
          "Three prompts: explore others; notebook 03 and EVAL.md for more."),
])
