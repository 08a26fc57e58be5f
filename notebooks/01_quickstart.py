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
# # 01 · What a token patch is
#
# **Learning objective.** After this notebook you can say what a *token patch* is, compute the patches of every
# layer and token of a real model, and run the identity that makes them exact, including the two parts
# learners forget: the skip-connection **correction** and the **kept BOS**.
#
# **Time box: 30 minutes** (10 reading and running, 20 for the three exercises).
#
# A transformer reading a prompt behaves *exactly* as if each MLP's first dense weights had received a rank-1
# update per token, the **token patch** `ΔW = (W δ) aᵀ/‖a‖²` (Dherin et al. 2025, arXiv 2507.16003), **plus a
# correction vector added after the MLP branch** (the skip connection's share, below). "Without context" always
# means: the token at its original position with the BOS token kept in front of it. You load the embedded Gemma 3
# 270M (offline: `icl-lens prepare` has cached it), compute the patches, and check the identity.
#
# Next notebook (02): the same identity on small models you can hold in your hand, and *why* the implicit steps
# shrink for attention.

# %%
import dataclasses

import torch

import icl_lens
from workshop.claims import claim, claims_view
from workshop.exercise_checks import check_answer, check_below, check_choice

torch.set_num_threads(1)  # a shared 2-core laptop: one thread per notebook
model = icl_lens.load_model("gemma-3-270m")
print(model.cfg.n_layers, "layers,", model.cfg.d_model, "model dim,", model.cfg.d_mlp, "MLP dim")

# %% [markdown]
# ## 1 · Token patches from one forward pass (5 min)
#
# `token_patches` reads one contextual forward pass and returns the factors `u = W δ`, `v = a/‖a‖²` for every
# layer and position — never a dense matrix per token — and the **correction** `attn_C − attn_0` of every layer
# and position.

# %%
prompt = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
patches = icl_lens.token_patches(model, prompt)
frame = patches.to_frame()
frame.head()

# %% [markdown]
# ### Gotcha 1: the correction column is not a mistake
#
# Each block adds attention's output to the residual stream *twice over*: once through the MLP (whose input
# it changes) and once directly, through the **skip connection** that carries it past the MLP. The token
# patch only changes the MLP's weights, so it can only reproduce the first path. The second path —
# `attn_C − attn_0`, what the context changed in attention's output — must be added back as a bias after the
# MLP branch (after Gemma's post-FFN norm). That vector is the **correction**. The identity below holds
# *only* with it.
#
# ### Gotcha 2: the two norms are not in the same units
#
# `norm` is the Frobenius norm of a `d_mlp × d_model` weight change; `correction_norm` is the length of a vector
# in the residual stream, which in Gemma is large (tens in the first layers, up to thousands deeper: the table
# below). Their ratio says nothing about which part
# "matters more"; exercise 1 measures what dropping the correction does instead. Likewise, patch norms are
# **not comparable across layers**: each layer has its own `W` scale and its own input norm `‖a‖`. Compare
# tokens *within* a layer (the rows of the heatmap below), not layers with each other.

# %%
frame.groupby("layer")[["norm", "correction_norm"]].median().T.round(2)

# %% [markdown]
# ## 2 · Where does context change the computation? (5 min)
#
# Rows are layers, columns are token positions (labelled with the token text; repeated tokens stay separate).
# The colour is per-cell; read along a row.

# %%
import plotly.graph_objects as go

labels = [f"{i}:{t}" for i, t in enumerate(patches.tokens)]
fig = go.Figure(go.Heatmap(z=patches.norms().numpy(), x=labels, colorscale="Viridis",
                           colorbar={"title": "‖ΔW‖_F"}))
fig.update_layout(xaxis_title="token", yaxis_title="layer", height=420, width=880)
fig

# %% [markdown]
# ## 3 · The identity (5 min)
#
# Run the model on the BOS and the query token only (query at its original position), with every layer's patch
# **and correction** applied through hooks. Its logits must equal the contextual logits; the notebook asserts it.

# %%
report = icl_lens.verify_equivalence(model, prompt, patches)
print(f"max |logit difference| {float(report.max_abs_err.max()):.2e}, "
      f"relative {report.relative_error:.2e} (float32 target 1e-4)")
assert report.relative_error < 1e-4, "the token-patch identity no longer holds"
report.to_frame().tail()

# %% [markdown]
# ### Gotcha 3: the kept BOS
#
# Gemma (like most LMs) parks most of its attention on the BOS token, an *attention sink*. The context-free
# forward therefore keeps BOS: the query attends to BOS and itself. `keep_bos=False` gives a different
# decomposition (the query alone), which is also exact but needs **larger** patches, because removing the sink
# changes every attention pattern. Patches computed one way cannot be checked the other way.

# %%
no_bos = icl_lens.token_patches(model, prompt, keep_bos=False)
no_bos_error = icl_lens.verify_equivalence(model, prompt, no_bos).relative_error
assert no_bos_error < 1e-4
print(f"median patch norm (BOS kept) {float(patches.norms()[:, 1:].median()):.3f}, "
      f"(BOS removed too) {float(no_bos.norms()[:, 1:].median()):.3f}; identity without BOS: {no_bos_error:.1e}")

# %% [markdown]
# ## Exercises (15 min)
#
# ### Exercise 1 · Predict, then check: is the correction needed?
#
# Before running anything, predict: if you keep the patches but **drop the correction** (set it to zero), will
# the patched context-free logits still match the contextual ones (relative error below 1e-4)? Write `"yes"` or
# `"no"` into `prediction_1`. Then build the patches without correction
# (`dataclasses.replace(patches, correction=torch.zeros_like(patches.correction))`) and run the check cell.

# %%
prediction_1 = None  # "yes" or "no"
without_correction = None  # the patches with a zero correction

# %% jupyter={"source_hidden": true} tags=["solution"]
prediction_1 = "no"
without_correction = dataclasses.replace(patches, correction=torch.zeros_like(patches.correction))

# %%
# Check cell: verify_equivalence runs the identity with your patches.
error_1 = icl_lens.verify_equivalence(model, prompt, without_correction).relative_error
check_choice(prediction_1, "yes" if error_1 < 1e-4 else "no", ("yes", "no"),
             "does the identity hold without the correction",
             why=f"Without it the relative logit error is {error_1:.2f}: the skip connection's share is missing.")

# %% [markdown]
# ### Exercise 2 · Remove only the first sentence
#
# `remove=` chooses which context positions count as removed. Compute `ablated`, the patches that remove only the
# first sentence (`token_patches(model, prompt, remove=range(1, k))`, with `k` the position after its full stop),
# and check that the identity still holds for them.

# %%
ablated = None  # token_patches(model, prompt, remove=range(1, k))

# %% jupyter={"source_hidden": true} tags=["solution"]
k = icl_lens.token_patches(model, prompt).tokens.index(".") + 1  # positions 1..k-1 hold the first sentence
ablated = icl_lens.token_patches(model, prompt, remove=range(1, k))

# %%
# Check cell: the identity with your patches, and which tokens the last query still sees.
sentence_end = patches.tokens.index(".")
check_answer([patches.tokens[i] for i in ablated.kept[-1].nonzero().flatten().tolist()][:2],
             [patches.tokens[0], patches.tokens[sentence_end + 1]], "first tokens the last query keeps",
             why="BOS stays, the first sentence is removed, the rest of the context stays.")
check_below(icl_lens.verify_equivalence(model, prompt, ablated).relative_error, 1e-4,
            "relative logit error with the first sentence removed")

# %% [markdown]
# ### Exercise 3 · Which layer?
#
# Which layer has the largest mean patch norm for this prompt? Put the layer index into `answer_3`
# (`frame.groupby("layer").norm.mean()`). Then read Gotcha 2 again: why is this not "the layer where the
# context matters most"?

# %%
answer_3 = None

# %% jupyter={"source_hidden": true} tags=["solution"]
answer_3 = int(icl_lens.token_patches(model, prompt).to_frame().groupby("layer").norm.mean().idxmax())

# %%
check_answer(answer_3, int(frame.groupby("layer").norm.mean().idxmax()), "layer with the largest mean patch norm",
             why="Patch norms carry each layer's own weight and input scale: compare tokens within a layer, "
                 "and use the identity (not the norm) to say what a patch does.")

# %% [markdown]
# ## Paper says / we measure
#
# Every number below is computed in this notebook. *Baseline* is what the number must beat to count.

# %%
claims_view([
    claim("Context = a rank-1 update of each MLP's first dense weights, exactly", "Dherin et al. 2025 (2507.16003)",
          f"relative logit error {report.relative_error:.1e} (patch + correction, float32)",
          f"without the correction: {error_1:.2f}", report.relative_error < 1e-4 <= error_1,
          "The theorem is stated for a contextual block (contextual layer → MLP); a real block's skip "
          "connection adds a term the weight patch cannot carry, so the identity needs the correction."),
    claim("The context-free forward is the token alone", "Dherin et al. 2025 (2507.16003)",
          f"with BOS kept: median ‖ΔW‖ {float(patches.norms()[:, 1:].median()):.3f}",
          f"BOS removed too: {float(no_bos.norms()[:, 1:].median()):.3f} (error {no_bos_error:.1e})", "partly",
          "Both kept sets are exact; icl_lens keeps BOS (the attention sink), which gives smaller patches."),
])
