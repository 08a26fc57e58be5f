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
# # 04 · Spike flags: tokens whose context changes the computation unusually much
#
# Every token `t` gets a *token patch* per layer, the rank-1 update `ΔW[l,t]` that makes its context-free input reproduce its contextual output (Dherin et al. 2025, arXiv 2507.16003). Its norm `‖ΔW[l,t]‖_F` says how much the context changes layer `l` at `t`.
#
# A **spike** is a token whose patch norm is unusually large compared with the tokens just before it. `icl_lens.spike_scores` turns each layer's norm series into a robust z-score against a trailing window (median and `1.4826·MAD` of the previous `window` tokens), aggregates the layers (`statistic="mean"`, `"max"`, `"median"` of the per-layer z, or `"norm"`: z of the whole patch's norm), and flags tokens whose score passes `threshold`. Tokens with fewer than `window` predecessors are reported as *not enough context*, never flagged.

# %%
import icl_lens

model = icl_lens.load_model("gemma-3-270m")
print(model.cfg.n_layers, "layers")

# %% [markdown]
# ## Scores on a prompt

# %%
prompt = ("The cat sat on the mat. The dog sat on the rug. The bird sat on the branch. "
          "The fish swam in the bowl. The horse stood in the field. Meanwhile, the Treaty of Westphalia "
          "was signed in 1648.")
patches = icl_lens.token_patches(model, prompt)
spikes = icl_lens.spike_scores(patches, window=16, threshold=3.5)
print("flagged:", [(t, spikes.tokens[t]) for t in spikes.flagged_positions])
print("positions without enough context:", int((~spikes.enough_context).sum()))
spikes.to_frame().tail(12)

# %% [markdown]
# Positions are the x axis (tokens repeat, so they are only labels). Gaps at the start are the positions without enough context.

# %%
import plotly.graph_objects as go

frame = spikes.to_frame()
labels = [f"{p}:{t}" for p, t in zip(frame.position, frame.token)]
fig = go.Figure(go.Bar(x=frame.position, y=frame.score, marker_color=["crimson" if f else "steelblue" for f in frame.flagged],
                       hovertext=labels))
fig.add_hline(y=spikes.threshold, line_dash="dash", annotation_text="threshold")
fig.update_layout(xaxis={"tickmode": "array", "tickvals": frame.position, "ticktext": frame.token, "tickangle": -60},
                  yaxis_title=f"spike score ({spikes.statistic} of per-layer robust z)", height=380)
fig

# %% [markdown]
# The per-layer scores (`layer_scores`, layer × position) show where in depth a spike happens.

# %%
fig = go.Figure(go.Heatmap(z=spikes.layer_scores.numpy(), x=labels, colorscale="RdBu_r", zmid=0,
                           colorbar={"title": "robust z"}))
fig.update_layout(xaxis_title="token", yaxis_title="layer", height=420)
fig

# %% [markdown]
# Different aggregations flag different tokens. The default (`mean` over layers) is strict: a token must stand out in many layers at once. `max` flags a token that stands out in any single layer, which with many layers happens far more often; `norm` is dominated by the layers with the largest patch norms.

# %%
for statistic in ("mean", "max", "norm"):
    s = icl_lens.spike_scores(patches, statistic=statistic)
    print(f"{statistic:>5}:", [s.tokens[t] for t in s.flagged_positions])

# %% [markdown]
# ## Generation with flags
#
# `generate_with_patches` records, for each generated token, its patch norms, spike score and flag, the log-probability of the token and the entropy of the distribution it came from. It reuses the key/value cache: `recomputed` lists how many positions each step computed (the prompt, then one per token).

# %%
gen = icl_lens.generate_with_patches(model, prompt, max_new_tokens=12)
print(repr(gen.text))
print("positions computed per step:", gen.recomputed)
gen.to_frame()

# %% [markdown]
# ## Exercises
#
# 1. Compare `window=8` with the default 16: how many positions lack enough context in each case, and which tokens are flagged with `statistic="max"`?
# 2. Sample three continuations (`greedy=False`, `temperature=1.2`, seeds 0, 1, 2, `statistic="max"`). For each, print the text, the number of flagged tokens and the mean log-prob. Are flagged tokens less likely than the others?

# %% jupyter={"source_hidden": true} tags=["solution"]
for window in (8, 16):
    s = icl_lens.spike_scores(patches, window=window, statistic="max")
    print(f"window {window}: {int((~s.enough_context).sum())} without enough context; flagged",
          [s.tokens[t] for t in s.flagged_positions])

# %% jupyter={"source_hidden": true} tags=["solution"]
for seed in range(3):
    g = icl_lens.generate_with_patches(model, prompt, max_new_tokens=10, greedy=False, temperature=1.2, seed=seed,
                                        statistic="max")
    f = g.to_frame()
    flagged, other = f[f.flagged].logprob.mean(), f[~f.flagged].logprob.mean()
    print(f"seed {seed}: {g.text!r}: {int(f.flagged.sum())} flagged; mean log-prob {f.logprob.mean():.2f} "
          f"(flagged {flagged:.2f}, others {other:.2f})")
