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
# # 01 · Quickstart: a prompt as weight updates
#
# A transformer reading a prompt behaves *exactly* as if each MLP's first dense weights had received a rank-1 update per token, the **token patch** `ΔW = (W δ) aᵀ/‖a‖²` (Dherin et al. 2025, arXiv 2507.16003). In this notebook you load the embedded Gemma 3 270M (offline), compute the patches of every layer and token, and check the identity that makes them exact.

# %%
import icl_lens

model = icl_lens.load_model("gemma-3-270m")
print(model.cfg.n_layers, "layers,", model.cfg.d_model, "model dim,", model.cfg.d_mlp, "MLP dim")

# %% [markdown]
# ## Token patches from one forward pass
#
# `token_patches` reads one contextual forward pass and returns the factors `u = W δ`, `v = a/‖a‖²` for every layer and position — never a dense matrix per token.

# %%
prompt = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
patches = icl_lens.token_patches(model, prompt)
frame = patches.to_frame()
frame.head()

# %% [markdown]
# ## Where does context change the computation?
#
# Rows are layers, columns are token positions (labelled with the token text; repeated tokens stay separate).

# %%
import plotly.graph_objects as go

labels = [f"{i}:{t}" for i, t in enumerate(patches.tokens)]
fig = go.Figure(go.Heatmap(z=patches.norms().numpy(), x=labels, colorscale="Viridis",
                           colorbar={"title": "‖ΔW‖_F"}))
fig.update_layout(xaxis_title="token", yaxis_title="layer", height=420)
fig

# %% [markdown]
# ## The identity
#
# Run the model on the BOS and the query token only (query at its original position), with every layer's patch applied through hooks. Its logits must equal the contextual logits.

# %%
report = icl_lens.verify_equivalence(model, prompt, patches)
print(f"max |logit difference| {float(report.max_abs_err.max()):.2e}, "
      f"relative {report.relative_error:.2e} (float32 target 1e-4)")
report.to_frame().tail()

# %% [markdown]
# ## Exercises
#
# 1. Which layer has the largest mean patch norm for this prompt? Is it the same for a prompt with no repeated structure?
# 2. Use `remove=` to ablate only the first sentence (`token_patches(model, prompt, remove=range(1, k))`) and check the identity still holds.

# %% jupyter={"source_hidden": true} tags=["solution"]
by_layer = frame.groupby("layer").norm.mean()
print("largest mean patch norm at layer", by_layer.idxmax())
other = icl_lens.token_patches(model, "Green ideas sleep furiously under a quiet bridge").to_frame()
print("other prompt:", other.groupby("layer").norm.mean().idxmax())

# %% jupyter={"source_hidden": true} tags=["solution"]
k = patches.tokens.index(".") + 1  # positions 1..k-1 hold the first sentence
ablated = icl_lens.token_patches(model, prompt, remove=range(1, k))
print(icl_lens.verify_equivalence(model, prompt, ablated).relative_error)
