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
# # 03 · Implicit dynamics: in-context learning as online gradient steps
#
# Reading the context one token at a time turns a query's token patch into a sequence of implicit weights `W₀, W₁, …, Wₙ`: `Wᵢ` makes the context-free input `[BOS, x_t]` reproduce the model's output with context `c₁..cᵢ`. The step `Wᵢ − Wᵢ₋₁` is the *meta-gradient* of token `cᵢ` (Dherin et al. 2025, arXiv 2507.16003, §3). icl_lens computes all n+1 steps for every layer of a real model in one batched forward, factored.

# %%
import icl_lens
import plotly.express as px

model = icl_lens.load_model("gemma-3-270m")
prompt = "France: Paris\nJapan: Tokyo\nItaly: Rome\nSpain: Madrid\nGermany:"
traj = icl_lens.trajectory(model, prompt)  # query = last token
print(f"query {traj.query} {traj.tokens[traj.query]!r}, n = {traj.n_context} context tokens, "
      f"{len(traj.layers)} layers")

# %% [markdown]
# ## Each step is exact
#
# For a few prefix lengths i, run the model on `[BOS, c₁..cᵢ, x_t]` (query at its original position) and compare with `[BOS, x_t]` carrying `Wᵢ` in every layer.

# %%
n = traj.n_context
check = icl_lens.verify_trajectory(model, prompt, traj, steps=[1, n // 2, n])
check.to_frame()

# %% [markdown]
# ## Meta-gradient norm vs context length
#
# `‖Wᵢ − Wᵢ₋₁‖_F` in closed form from the factors. Hover to see which token each step consumed.

# %%
frame = traj.to_frame()
steps = frame[frame.metric == "meta_gradient_norm"]
fig = px.line(steps, x="step", y="value", color="layer", hover_data=["token"], log_y=True,
              labels={"value": "‖Wᵢ − Wᵢ₋₁‖_F", "step": "context tokens consumed i"})
fig

# %% [markdown]
# ## Do the steps shrink? Decay exponents
#
# Per layer, a least-squares fit of `‖Wᵢ − Wᵢ₋₁‖ ≈ c·i^(−b)` in log-log space. `b > 0` means convergence; `r_squared` says how well a power law describes the steps.

# %%
fit = traj.decay_fit().to_frame()
px.bar(fit, x="layer", y="exponent", hover_data=["r_squared"], title="fitted decay exponent b")

# %% [markdown]
# ## Alignment along the trajectory
#
# Cosine of each meta-gradient with the total update `Wₙ − W₀`.

# %%
align = frame[frame.metric == "total_alignment"].pivot(index="layer", columns="step", values="value")
px.imshow(align, color_continuous_scale="RdBu", zmin=-1, zmax=1, aspect="auto",
          labels={"x": "step i", "y": "layer", "color": "cos(Gᵢ, Wₙ − W₀)"})

# %% [markdown]
# ## Implicit vs explicit finetuning
#
# `finetune_alignment` runs plain SGD on `W_gate` and `W_up` of every layer, on the context-free input, toward the contextual next-token prediction, keeping every update factored, and compares it with the implicit update `Wₙ − W₀` (per-layer cosine). The model is not modified.

# %%
fa = icl_lens.finetune_alignment(model, prompt, lr=1e-3, steps=3)
print("target", repr(fa.target_token), "loss", [round(x, 3) for x in fa.losses.tolist()])
px.bar(x=list(fa.layers), y=fa.cosine().numpy(), labels={"x": "layer", "y": "cos(implicit, SGD)"})

# %% [markdown]
# ## Exercises
#
# 1. Compute the trajectory of a free-text prompt (no repeated structure). Do its meta-gradients decay faster or slower than the few-shot prompt's (compare the mean exponent over layers)?
# 2. Does restricting the SGD update to the query row's gradient terms (`fa.cosine(rows="query")`) change the alignment? And how does the cosine evolve over SGD steps (`fa.cosine_by_sgd_step()`)?

# %% jupyter={"source_hidden": true} tags=["solution"]
free = icl_lens.trajectory(model, "The old lighthouse keeper climbed the stairs every night to light the")
print("few-shot mean exponent", float(traj.decay_fit().exponent.mean()))
print("free text mean exponent", float(free.decay_fit().exponent.mean()))

# %% jupyter={"source_hidden": true} tags=["solution"]
import pandas as pd
pd.DataFrame({"all rows": fa.cosine().numpy(), "query row": fa.cosine(rows="query").numpy(),
              "after SGD step 1": fa.cosine_by_sgd_step()[:, 0].numpy()}, index=list(fa.layers))
