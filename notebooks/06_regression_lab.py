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
# # 06 · The regression lab: in-context learning as weight updates, on models you can hold in your hand
#
# Small models (10 Pre-LN blocks, d_model 32) were trained to do **in-context linear regression**: a prompt holds
# pairs `(xᵢ, yᵢ = wᵀxᵢ)` from a fresh random `w`, then a query `x`; the model must output `wᵀx`.
# Four models share everything except the **contextual layer** — the part that mixes positions:
# softmax attention, linear attention, a delta rule (fast-weight memory) and a GRU.
#
# We check six claims from three papers:
# [Dherin et al. 2025 (arXiv 2507.16003)](https://arxiv.org/abs/2507.16003),
# [Mazzawi, Dherin et al. 2025 (arXiv 2510.08734)](https://arxiv.org/abs/2510.08734) and
# [McDermott, Heath, Parhi 2026 (arXiv 2606.25342)](https://arxiv.org/abs/2606.25342).
# The trained checkpoints ship with `icl_lens`; nothing is trained here. Solutions to the exercises are hidden
# (click the collapsed cell to reveal them).

# %%
import torch
import plotly.express as px
import pandas as pd
import plotly.graph_objects as go
from icl_lens import lab
from icl_lens.core.power_law import power_law_fit

torch.set_num_threads(1)  # the models are tiny: one thread is fastest
torch.manual_seed(0)
models = {arch: lab.load_lab_model(arch) for arch in lab.ARCHITECTURES}  # 10-layer Pre-LN models
{arch: round(lab.training_record(arch)["eval_loss_n_train"], 4) for arch in lab.ARCHITECTURES}

# %% [markdown]
# The numbers above are each model's normalised error with 16 context pairs (0 = perfect least squares,
# 1 = ignoring the context). A prompt is a tensor of tokens `[x, y, is_query]`:

# %%
prompts = lab.sample_prompts(2, n_context=5, d_x=4, generator=torch.Generator().manual_seed(1))
print(prompts.tokens[0])
print("target:", prompts.targets[0].item(), " model says:", models["softmax"](prompts.tokens)[0, -1].item())

# %% [markdown]
# ## 1 · Context = a rank-1 weight update (exactly)
#
# Dherin et al. show that a block *contextual layer → MLP* run **with** its context gives the same output as the block
# run **without** context but with the MLP's first weight matrix patched by a rank-1 matrix
# `ΔW = (W δ) aᵀ/‖a‖²`, where `δ = A(C, x) − A(x)` is what the context changed in the MLP's input. The theorem does not
# care what the contextual layer is, so it must hold for all four models. We run every token **alone** with its patches
# and compare with the contextual forward.

# %%
eq = lab.numerical_equivalence(n_prompts=8)
df = eq.to_frame()
px.bar(df, x="arch", y="rel_error_prediction", color="dtype", barmode="group", log_y=True,
       title="Contextual vs patched context-free forward (max relative error)")

# %% [markdown]
# **Try:** the float64 errors sit at machine precision (~1e-16) and float32 at ~1e-7. What would you expect if you
# patched only the MLP weights but forgot the skip-connection correction (`correction` in `lab.lab_token_patches`)?
# Look at `df.mean_correction_norm` for a hint of how large the missing term would be.

# %% [markdown]
# ## 2 · Implicit dynamics vs explicit finetuning, the paper's way
#
# Feed the context pairs one at a time: after `i` pairs, layer `l` behaves as if its weights were `W + ΔW_l(i)`.
# The steps `ΔW_l(i) − ΔW_l(i−1)` are the *meta-gradients*. Is this the same as actually fine-tuning the context-free
# model with SGD on the same pairs, one pair per step? The paper's first experiment uses a **single block** without
# skip connection or LayerNorm (tokens `[x, y]`, `x ∈ R²`, MLP 3 → 128 → 3, `lab.load_lab_model("single_block")`).
# First the loss curves: test error on held-out queries after `i` examples, in context and by SGD on `W_in`
# (the best rate of a sweep).

# %%
curves = {name: lab.loss_curves(name, n_prompts=16, n_probes=16) for name in ("single_block", "softmax")}
frame = pd.concat([c.curves().assign(model=name) for name, c in curves.items()])
px.line(frame, x="examples", y="test_mse", color="method", facet_col="model", log_y=True,
        title="Test error vs examples consumed: in context vs finetuning W_in")

# %%
curves["single_block"].sweep()

# %% [markdown]
# Now the weight-space alignment, per layer and prompt, in both orders of consuming the context: *prefix* (the query
# sees `c₁..cᵢ`) and *absorb*, the paper's (`c₁..cᵢ` absorbed into the weights, the rest still in context).
# *cumulative* = cos(Wᵢ − W₀, Σ_{j≤i} SGD steps), *step* = cos(Wᵢ − Wᵢ₋₁, i-th SGD step); the *control* uses another
# prompt's SGD steps; *random* is a random direction of the same weight space.

# %%
rows = []
for name in ("single_block", "one_block", "one_block_skip", "one_block_ln", "one_block_preln", "softmax"):
    c = lab.loss_curves(name, n_prompts=8, n_probes=8) if name not in curves else curves[name]
    s = lab.implicit_vs_explicit(name, n_prompts=8, lr=c.lrs[c.best]).summary()
    s = s[s.comparison.isin(["sgd", "control", "random"])]
    rows.append(s.assign(model=name, column=s.comparison + " " + s.order + " " + s.kind))
table = pd.concat(rows).pivot(index="model", columns="column", values="mean").round(3)
table

# %% [markdown]
# **Try:** on the single block each implicit step lines up with the SGD step on the same pair; on the 10-layer
# Pre-LN model the cosines are as small as the control. Two things to check. First, `input_side` in
# `lab.implicit_vs_explicit("single_block").summary()`: a rank-1 cosine is the product of an input-side and an
# output-side cosine, and in a 3-dimensional residual stream every context-free MLP input points almost the same way.
# Second, where does the context act at all? `lab.context_effect(name).summary()` runs the query with only the `W_in`
# patches or only the skip corrections.

# %%
pd.concat([lab.context_effect(name, n_prompts=16).summary().assign(model=name)
           for name in ("single_block", "one_block_preln", "softmax")]).pivot(index="model", columns="variant",
                                                                             values="unexplained").round(3)

# %% [markdown]
# ## 3 · Does the implicit learning converge?
#
# The papers claim that attention produces meta-gradients that shrink as the context grows (a convergent learner),
# while recurrent layers do not. The models were trained on up to 16 pairs; we go to 64.

# %%
conv = lab.convergence_by_architecture(n_prompts=4, n_max=64)
frame = conv.to_frame().groupby(["arch", "pairs_seen"], as_index=False).meta_gradient_norm.mean()
fig = px.line(frame, x="pairs_seen", y="meta_gradient_norm", color="arch", log_x=True, log_y=True,
              title="Meta-gradient norm vs pairs seen (mean over prompts)")
fig.add_vline(x=conv.n_train, line_dash="dash", annotation_text="training length")
fig

# %%
conv.summary()[['arch', 'alpha_mean_curve', 'late_over_early', 'norm_mse_at_n_train', 'norm_mse_at_n_max']]

# %% [markdown]
# **Try:** compare the fitted exponents `alpha_mean_curve` with the error columns. Does the architecture whose steps shrink
# the fastest also keep its error low beyond the training length?
#
# ### Exercise 1
# Fit the decay exponent of the GRU's mean meta-gradient norm using **only** context lengths beyond the training
# length (`pairs_seen ≥ conv.n_train`). Use `power_law_fit(y, x=n)` (already imported; its `.exponent`) and `conv.total_norms("gru")`.

# %%
# your code here

# %% jupyter={"source_hidden": true} tags=["solution"]
n = torch.arange(1, conv.n_max + 1, dtype=torch.float64)
beyond = n >= conv.n_train
mean_norm = conv.total_norms("gru").double().mean(0)
alpha = power_law_fit(mean_norm[beyond], x=n[beyond]).exponent[0]
print(f"GRU decay exponent beyond training length: {alpha.item():.3f}")

# %% [markdown]
# ## 4 · A static *thought patch*
#
# A token patch depends on the query. Averaging over `K` calibration queries gives one static edit per layer
# (the *thought matrix*, by least squares, plus a bias) that stands in for the prompt for **any** query
# (Algorithm 1 of arXiv 2510.08734). With one calibration query the edit fits it perfectly (train error ≈ 0) but
# generalises badly; as `K` grows the train and test errors should meet.

# %%
tp = lab.static_thought_patch(n_prompts=2, ks=(1, 2, 4, 8, 16, 32, 64))
s = tp.summary()
fig = go.Figure([go.Scatter(x=s.K, y=s.train_mse, name="train (calibration queries)"),
                 go.Scatter(x=s.K, y=s.test_mse, name="test (fresh queries)"),
                 go.Scatter(x=s.K, y=s.no_context_test_mse, name="no context, no patch", line_dash="dot"),
                 go.Scatter(x=s.K, y=s.contextual_test_mse, name="with the prompt in context", line_dash="dot")])
fig.update_layout(xaxis_type="log", yaxis_type="log", xaxis_title="K calibration queries",
                  yaxis_title="normalised MSE to y = wᵀx", title="Static thought patch: train vs test error")
fig

# %% [markdown]
# **Try:** the patched model never quite reaches the contextual model's error. Which layers would you expect to need the
# most calibration data? (`lab.fit_thought_patch` returns the per-layer edits; compare their norms.)
#
# ### Exercise 2
# Refit with a much stronger ridge (`ridge=1.0`) and compare the test error at `K = 4` with the default.

# %%
# your code here

# %% jupyter={"source_hidden": true} tags=["solution"]
strong = lab.static_thought_patch(n_prompts=2, ks=(4,), ridge=1.0).summary()
print("ridge 1e-2:", s.set_index("K").test_mse[4], " ridge 1.0:", strong.test_mse.item())

# %% [markdown]
# ## 5 · Memory and time per token
#
# Softmax attention must keep every key and value (a cache growing with the context); the parametric layers keep a
# fixed-size state. We decode token by token and read the bytes held and the time per token.

# %%
mc = lab.memory_and_cost(lengths=(32, 128, 256), window=16).to_frame()
px.line(mc, x="context_length", y="state_bytes", color="arch", log_x=True, log_y=True, markers=True,
        title="State held while decoding (bytes)")

# %%
px.line(mc, x="context_length", y="us_per_token_min", color="arch", log_x=True, markers=True,
        title="Wall time per token (µs, minimum over a window; noisy on a shared machine)")

# %% [markdown]
# **Try:** the cache grows linearly but the time per token barely moves at these sizes. At what context length would you
# expect the softmax model's per-token time to be dominated by attention over the cache (d_model = 32, 10 layers)?

# %% [markdown]
# ## 6 · Attention is regression
#
# Softmax attention *is* a Nadaraya–Watson kernel estimator on its own keys and values with kernel `exp(q·k/√d)`; the
# fixed-state layers are online regressors whose updates are gradient steps (linear attention: Hebbian loss
# `−⟨S k, v⟩`; delta rule: `½‖S k − v‖²`). All checked at float64:

# %%
rv = lab.attention_as_regression(n_prompts=2).to_frame()
px.bar(rv, x="check", y="max_rel_error", color="arch", log_y=True, title="Identities: max relative error")

# %%
rv

# %% [markdown]
# **Try:** the delta rule shrinks the current pair's loss by exactly `(1 − β)²`. What does a layer with `β ≈ 1` remember
# about earlier pairs, and why might a trained model keep `β` well below 1?
#
# ### Exercise 3
# For layer 0 of the delta-rule model, plot the learned rates `β` (hook `blocks.0.mix.hook_beta`) along one prompt.
# Use `run_with_cache` on `models["delta"]`.

# %%
# your code here

# %% jupyter={"source_hidden": true} tags=["solution"]
p = lab.sample_prompts(1, 16, 4, generator=torch.Generator().manual_seed(2))
_, cache = models["delta"].run_with_cache(p.tokens)
beta = cache["blocks.0.mix.hook_beta"][0]  # pos × head
px.line(beta.numpy(), labels={"index": "position", "value": "β", "variable": "head"}, title="Delta-rule rates, layer 0")
