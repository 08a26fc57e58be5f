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
# # Live dashboard: watch the token patches while you type
#
# Every token of a prompt changes the first MLP weights of every layer by a rank-1 *token patch* `ΔW = (W δ) aᵀ/‖a‖²` (Dherin et al. 2025, arXiv 2507.16003). Type below: the strip colours each token by its patch norm (▲ = spike flag), the heatmap shows every layer, and clicking a token shows how its implicit weights converge as context is consumed (meta-gradient norms, log–log, with the fitted decay exponent α). Appending text recomputes only the new positions (`PatchSession`).

# %%
import icl_lens

dash = icl_lens.dashboard()  # embedded Gemma 3 270M; try model='smollm2-135m'
dash

# %% [markdown]
# ## Exercise 1
#
# Type `The capital of France is Paris. The capital of Italy is` into the dashboard. Which token has the largest patch norm in the last layer? Check with the heatmap, then with the library: `icl_lens.token_patches(dash.model, prompt).to_frame()`.

# %% jupyter={"source_hidden": true} tags=["solution"]
prompt = "The capital of France is Paris. The capital of Italy is"
frame = icl_lens.token_patches(dash.model, prompt).to_frame()
last = frame[frame.layer == frame.layer.max()]
last.nlargest(3, "norm")[["position", "token", "norm"]]

# %% [markdown]
# ## Exercise 2
#
# Do the meta-gradients of the last token shrink as the context grows? Read the fitted exponents α in the bar chart, or hover a line for its layer's α and R² (α > 0: the implicit steps shrink, α < 0: they grow). Which layers converge on this prompt, and does it change with a longer prompt? Compute them with `icl_lens.trajectory(dash.model, prompt).decay_fit().to_frame()`.

# %% jupyter={"source_hidden": true} tags=["solution"]
fit = icl_lens.trajectory(dash.model, prompt).decay_fit().to_frame()
fit[["layer", "exponent", "r_squared"]].round(2)
