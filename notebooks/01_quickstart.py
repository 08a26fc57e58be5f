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
# # 01 · What a token patch is
#
# **Learning objective.** After this notebook you can say what a *token patch* is, compute the patches of every
# layer and token of a real model, show by hand on one layer and token why a patch is exact, build a patch and its correction yourself from an
# activation cache, and run the identity
# for a whole prompt, including the two parts learners forget: the skip-connection **correction** and the **kept
# BOS**; and you can say which earlier tokens, through which attention heads, wrote a patch.
#
# **Time box: 30 minutes** (11 reading and running, 19 for the four exercises); section 4 is homework in the
# 3-hour workshop (5 more minutes on your own).
#
# A transformer reading a prompt behaves *exactly* as if each MLP's first dense weights had received a rank-1
# update per token, the **token patch** `ΔW = (W δ) aᵀ/‖a‖²` (Dherin et al. 2025, arXiv 2507.16003), **plus a
# correction vector** added after the MLP branch (exercise 1 finds out what it is for). "Without context" always
# means: the token at its original position with the BOS token kept in front of it. You load an embedded
# model (offline: `icl-lens prepare` has cached it), compute the patches, and check the identity.
#
# **Which model.** The notebooks use the embedded **SmolLM2-135M** (a Llama-style block, 30 layers): its kernel's
# peak is under **Memory** below. The embedded **Gemma 3 270M** (the papers' family) needs about 2.2 GB
# in float32 (its 262k-token vocabulary alone is 0.7 GB); on a laptop with 4 GB free, set `MODEL = "gemma-3-270m"`
# and rerun: every cell works on both.
#
# **How the exercises work.** Each exercise has a cell where you write your answer into a variable (it starts as
# `None`), a collapsed solution cell (click to reveal it; it only runs when the notebook tests run it, so reading
# it is your choice), and a check cell that says *no answer yet*, ✓ or ✗ and why.
#
# Next notebook (02): the same identity on small models you can hold in your hand, and *why* the implicit steps
# shrink for attention.
#
# **Memory.** In the notebook tests (SmolLM2-135M, solutions on) this kernel peaked at
# <!-- report:memory_01 -->1.23 GB (above the 1 GB Binder guarantees; measured 2026-12-06)<!-- /report -->: run one notebook's kernel at a time (Binder allows up to 2 GB when its machine has it free).

# %%
import dataclasses

import torch

import icl_lens
from workshop.claims import answer_sheet, claim, claims_view
from workshop.exercise_checks import (check_answer, check_below, check_choice, check_sheet, missing, no_answer,
                                      solutions_on)

torch.set_num_threads(1)  # a shared 2-core laptop: one thread per notebook
MODEL = "smollm2-135m"  # or "gemma-3-270m" (about 2.2 GB of memory; see above)
model = icl_lens.load_model(MODEL)
print(model.cfg.n_layers, "layers,", model.cfg.d_model, "model dim,", model.cfg.d_mlp, "MLP dim")
# the guide's expected answers, measured on MODEL (reports/workshop_answers.json); the checks compare this run with it
sheet = answer_sheet("01_quickstart", MODEL)

# %% [markdown]
# ## 1 · Token patches from one forward pass (5 min)
#
# `token_patches` reads one contextual forward pass and returns, for every layer and position, the factors
# `u = W δ` and `v = a/‖a‖²` of the patch (never a dense matrix per token; a gated MLP, as in both embedded
# models, has two first dense matrices, `W_gate` and `W_up`, hence `u_gate` and `u_in`) and a **correction** vector `attn_C − attn_0`: what the context changed in
# attention's output.

# %%
prompt = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
patches = icl_lens.token_patches(model, prompt)
frame = patches.to_frame()
frame.head()

# %% [markdown]
# ### Exercise 1 · Predict, then check: is the correction needed? (5 min)
#
# Before running anything, predict: if you keep the patches but **drop the correction** (set it to zero), will
# the patched context-free logits still match the contextual ones (relative error below 1e-4)? Write `"yes"` or
# `"no"` into `prediction_1`. Then build those patches as `without_correction`
# (`dataclasses.replace(patches, correction=torch.zeros_like(patches.correction))`) and run the check cell: it
# runs the identity without the correction on this prompt and on two others.

# %%
prediction_1 = None  # "yes" or "no"
without_correction = None  # the patches with a zero correction

# %% jupyter={"source_hidden": true} tags=["solution"]
if solutions_on():  # runs only in the notebook tests (ICL_LENS_SOLUTIONS=1); read it or copy it up
    prediction_1 = "no"
    without_correction = dataclasses.replace(patches, correction=torch.zeros_like(patches.correction))

# %%
# Check cell: the identity without the correction, on three prompts (the check builds its own patches).
others = ["The cat sat on the mat because it was", "Two plus two is four. Three plus three is"]
errors_1 = [icl_lens.verify_equivalence(model, p, dataclasses.replace(q, correction=torch.zeros_like(q.correction))
                                        ).relative_error
            for p, q in [(prompt, patches)] + [(p, icl_lens.token_patches(model, p)) for p in others]]
error_1 = errors_1[0]
holds = [e < 1e-4 for e in errors_1]
check_choice(prediction_1, "yes" if all(holds) else "no" if not any(holds) else "depends on the prompt",
             ("yes", "no", "depends on the prompt"), "does the identity hold without the correction",
             why=f"Without it the relative logit errors are {', '.join(f'{e:.2f}' for e in errors_1)} on the three "
                 "prompts, against about 1e-6 with it (section 3).")
check_sheet({"errors_without_correction": errors_1,
             "error_with_correction": icl_lens.verify_equivalence(model, prompt, patches).relative_error},
            sheet, "the identity with and without the correction")
if missing(without_correction):
    no_answer("your patches without the correction")
else:
    check_answer(float(without_correction.correction.abs().max()), 0.0, "largest |correction| in your patches",
                 why="Only the correction is zeroed; the rank-1 factors u and v stay.")

# %% [markdown]
# ### Gotcha 1: the correction column is not a mistake
#
# Each block adds attention's output to the residual stream *twice over*: once through the MLP (whose input
# it changes) and once directly, through the **skip connection** that carries it past the MLP. The token
# patch only changes the MLP's weights, so it can only reproduce the first path. The second path —
# `attn_C − attn_0`, what the context changed in attention's output — must be added back as a bias after the
# MLP branch (after the post-FFN norm where the block has one, as Gemma's). That vector is the **correction**: the
# identity holds *only* with it, so "context = a rank-1 weight update" is always "a rank-1 update **plus** the
# correction" in a real block.
#
# ### Gotcha 2: the two norms are not in the same units
#
# `norm` is the Frobenius norm of a `d_mlp × d_model` weight change; `correction_norm` is the length of a vector
# in the residual stream, in its own units (the table below: the two columns differ by orders of magnitude and
# not in the same way in every layer). Their ratio says nothing about which part "matters more"; exercise 1 measured what dropping the
# correction does instead. Likewise, patch norms are **not comparable across layers**: each layer has its own
# `W` scale and its own input norm `‖a‖`. Compare tokens *within* a layer (the rows of the heatmap below), not
# layers with each other.

# %%
frame.groupby("layer")[["norm", "correction_norm"]].median().T.round(2)

# %% [markdown]
# ## 2 · Where does context change the computation? (3 min)
#
# Rows are layers, columns are token positions (labelled with the token text; repeated tokens stay separate).
# With `per_layer = False` one colour scale spans the whole figure, so the few layers with the largest norms set
# it and the other rows look uniformly dark (their differences are real but invisible at this scale). Set
# `per_layer = True` and rerun: each row is divided by its own largest norm, so every row uses the full scale and
# you can read along a row; the colours then say nothing about one layer against another.

# %%
import plotly.graph_objects as go

per_layer = False  # True: each layer (row) on its own colour scale
norms = patches.norms()
z = norms / norms.amax(dim=1, keepdim=True).clamp_min(1e-12) if per_layer else norms
labels = [f"{i}:{t}" for i, t in enumerate(patches.tokens)]
fig = go.Figure(go.Heatmap(z=z.numpy(), x=labels, colorscale="Viridis",
                           colorbar={"title": "‖ΔW‖_F / row max" if per_layer else "‖ΔW‖_F"}))
fig.update_layout(xaxis_title="token", yaxis_title="layer", height=420, width=880,
                  title="per-layer colour scale (read along a row)" if per_layer
                  else "one colour scale for all layers (the largest layers dominate)")
fig

# %% [markdown]
# ## 3 · The identity (3 min)
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
# ### Why it is exact: one layer, one token, by hand
#
# The whole identity rests on one line of algebra. With `A` the MLP's input *with* context, `a` its input
# *without*, `δ = A − a`, `u = W δ` and `v = a/‖a‖²`, the patched weights applied to `a` give
# `(W + u vᵀ) a = W a + u (vᵀa) = W a + W δ = W A`, because `vᵀa = 1`. Below, the tensors come from the library
# (the patch factors from `patches`, `W` from the model, `A` from one contextual forward pass); the cell only
# evaluates `(W + ΔW) a − W A` for the last token of one layer, for both first dense matrices (gate and up). The residual is float32 rounding; without the patch the difference `W a − W A` is the context's effect.

# %%
from icl_lens.model import block_family, first_dense_weights

layer, t = 6, len(patches.tokens) - 1
_, cache = model.run_with_cache(prompt, names_filter=block_family(model).mlp_input(layer))
A = cache[block_family(model).mlp_input(layer)][0, t]  # the MLP input with context
v = patches.v[layer, t]                                # v = a/‖a‖², so a = v/‖v‖²
a = v / (v @ v)
u = {"in": patches.u_in[layer, t], "gate": patches.u_gate[layer, t]}
with torch.no_grad():
    for name, W in first_dense_weights(model, layer).items():
        patched = (W + torch.outer(u[name], v)) @ a   # (W + ΔW) a, with ΔW = u vᵀ built for this one token
        print(f"W_{'up' if name == 'in' else name}: |(W + ΔW) a − W A| / |W A| = {float((patched - W @ A).norm() / (W @ A).norm()):.1e}; "
              f"without the patch |W a − W A| / |W A| = {float((W @ a - W @ A).norm() / (W @ A).norm()):.2f}")
del cache

# %% [markdown]
# ### Exercise 2 · Build a token patch yourself (6 min)
#
# The cell above took `u` and `v` from the library. Now compute them yourself, and the correction, from an
# activation cache of the contextual pass alone, as `token_patches` does (docs/design.md §2). For layer `l` and query
# token `t`, the context-free forward keeps BOS and the query, so the query's attention reads only those two keys:
#
# - `attn_C`: attention's output at `t` with the context (`blocks.{l}.hook_attn_out`);
# - `attn_0`: attention's output at `t` when the query attends only to BOS and itself: each head's cached pattern
#   restricted to keys `0` and `t` and renormalised to sum to 1, times the cached values of those two keys, through
#   the output projection;
# - `A`: the MLP input with the context (`blocks.{l}.ln2.hook_out`); `a`: the same norm applied to
#   `resid_pre + attn_0` (the residual entering the block stays the contextual one: the earlier layers' patches
#   make it so);
# - then `u = W (A − a)` for the up projection `W` (`first_dense_weights(model, l)["in"]`), the **key**
#   `v = a/‖a‖²`, and the **correction** `attn_C − attn_0`.
#
# Write a function `my_patch(cache, layer, t)` that returns `(u, key, correction)` and assign it to `my_patch`. The
# check runs it at four (layer, token) pairs and compares each part with `token_patches`. (This is SmolLM2's block;
# on Gemma attention's output passes a norm before the skip, and the check will tell you.) Open the hints one at a
# time.

# %%
hooks = ("hook_resid_pre", "hook_attn_out", "ln2.hook_out", "attn.hook_pattern", "attn.hook_v")
_, cache_2 = model.run_with_cache(prompt, names_filter=lambda name: name.endswith(hooks))
print({name: tuple(x.shape) for name, x in cache_2.items() if name.startswith(f"blocks.{layer}.")})
my_patch = None  # def my_patch(cache, layer, t): ...; return u, key, correction

# %% [markdown]
# <details><summary>Hint 1 · the shapes</summary>
#
# `hook_pattern` is (batch, head, query, key) and `hook_v` is (batch, key, key-value head, d_head): SmolLM2's 9 query
# heads share 3 key-value heads, head `h` reading key-value head `h // 3`, so
# `v.repeat_interleave(model.cfg.n_heads // v.shape[1], dim=1)` gives one value per query head.
#
# </details>
# <details><summary>Hint 2 · attn_0</summary>
#
# `p = cache[f"blocks.{layer}.attn.hook_pattern"][0, :, t]`, then `w = p[:, [0, t]] / p[:, [0, t]].sum(-1, keepdim=True)`
# and `z0 = torch.einsum("hk,khd->hd", w, v[[0, t]])`. The output projection takes the heads side by side:
# `model.blocks[layer].attn.o(z0.reshape(1, 1, -1))[0, 0]`.
#
# </details>
# <details><summary>Hint 3 · a, u and the key</summary>
#
# `r = cache[f"blocks.{layer}.hook_resid_pre"][0, t]`; `a = model.blocks[layer].ln2((r + attn_0)[None, None])[0, 0]`
# (the block's own norm module); `u = W @ (A - a)`; `key = a / (a @ a)`.
#
# </details>

# %% jupyter={"source_hidden": true} tags=["solution"]
if solutions_on():
    def my_patch(cache, layer, t):
        """u, key and correction of one layer and query token, from the contextual pass's cache."""
        p = cache[f"blocks.{layer}.attn.hook_pattern"][0, :, t]  # (head, key)
        v = cache[f"blocks.{layer}.attn.hook_v"][0]  # (key, key-value head, d_head)
        v = v.repeat_interleave(model.cfg.n_heads // v.shape[1], dim=1)  # one value per query head
        w = p[:, [0, t]] / p[:, [0, t]].sum(-1, keepdim=True)  # the pattern over BOS and the query, renormalised
        z0 = torch.einsum("hk,khd->hd", w, v[[0, t]])
        attn_0 = model.blocks[layer].attn.o(z0.reshape(1, 1, -1))[0, 0]
        attn_C = cache[f"blocks.{layer}.hook_attn_out"][0, t]
        r = cache[f"blocks.{layer}.hook_resid_pre"][0, t]
        A = cache[f"blocks.{layer}.ln2.hook_out"][0, t]
        a = model.blocks[layer].ln2((r + attn_0)[None, None])[0, 0]
        W = first_dense_weights(model, layer)["in"]
        return W @ (A - a), a / (a @ a), attn_C - attn_0

# %%
# Check cell: your function against token_patches at four (layer, token) pairs.
if missing(my_patch):
    no_answer("your u, key and correction")
else:
    library = {"u": patches.u_in, "key": patches.v, "correction": patches.correction}
    worst = dict.fromkeys(library, 0.0)
    with torch.no_grad():
        for l, s in [(layer, t), (0, 3), (model.cfg.n_layers // 2, 5), (model.cfg.n_layers - 1, 10)]:
            for name, mine in zip(library, my_patch(cache_2, l, s)):
                ref = library[name][l, s].double()
                worst[name] = max(worst[name], float((torch.as_tensor(mine).double() - ref).norm() / ref.norm()))
    for name, error in worst.items():
        check_below(error, 1e-4, f"largest relative difference of your {name} from token_patches'",
                    why="Four (layer, token) pairs; float32 rounding is about 1e-6.")

# %% [markdown]
# ### Gotcha 3: the kept BOS
#
# Most LMs park most of their attention on the BOS token, an *attention sink*. The context-free
# forward therefore keeps BOS: the query attends to BOS and itself. `keep_bos=False` gives a different
# decomposition (the query alone), which is also exact in exact arithmetic but needs **larger** patches, because
# removing the sink changes every attention pattern; larger patches also carry more float32 rounding, so its
# measured error is larger (still thousands of times below the error without the correction). Patches computed one
# way cannot be checked the other way.

# %%
no_bos = icl_lens.token_patches(model, prompt, keep_bos=False)
no_bos_error = icl_lens.verify_equivalence(model, prompt, no_bos).relative_error
assert no_bos_error < 1e-3, no_bos_error
print(f"median patch norm (BOS kept) {float(patches.norms()[:, 1:].median()):.3f}, "
      f"(BOS removed too) {float(no_bos.norms()[:, 1:].median()):.3f}; identity without BOS: {no_bos_error:.1e}")

# %% [markdown]
# ### Exercise 3 · Remove only the first sentence (4 min)
#
# `remove=` chooses which context positions count as removed. Compute `ablated`, the patches that remove only the
# first sentence (`token_patches(model, prompt, remove=range(1, k))`, with `k` the position after its full stop),
# and check that the identity still holds for them.

# %%
ablated = None  # token_patches(model, prompt, remove=range(1, k))

# %% jupyter={"source_hidden": true} tags=["solution"]
if solutions_on():
    k = icl_lens.token_patches(model, prompt).tokens.index(".") + 1  # positions 1..k-1 hold the first sentence
    ablated = icl_lens.token_patches(model, prompt, remove=range(1, k))

# %%
# Check cell: the identity with your patches, and which tokens the last query still sees.
sentence_end = patches.tokens.index(".")
if missing(ablated):
    no_answer("patches without the first sentence")
else:
    check_answer([patches.tokens[i] for i in ablated.kept[-1].nonzero().flatten().tolist()][:2],
                 [patches.tokens[0], patches.tokens[sentence_end + 1]], "first tokens the last query keeps",
                 why="BOS stays, the first sentence is removed, the rest of the context stays.")
    error_3 = icl_lens.verify_equivalence(model, prompt, ablated).relative_error
    check_below(error_3, 1e-4, "relative logit error with the first sentence removed")
    check_sheet({"error_first_sentence_removed": error_3}, sheet, "the first sentence removed")

# %% [markdown]
# ### Exercise 4 · Predict, then check: which layer? (3 min)
#
# **Predict first**, without computing: is the layer with the largest mean patch norm for this prompt in the first
# third of the layers (`"early"`), the middle third (`"middle"`) or the last third (`"late"`)? Write it into
# `prediction_4`. Then compute that layer's index into `answer_4` (`frame.groupby("layer").norm.mean()`) and read
# Gotcha 2 again: why is it not "the layer where the context matters most"?

# %%
prediction_4 = None  # "early", "middle" or "late"
answer_4 = None

# %% jupyter={"source_hidden": true} tags=["solution"]
if solutions_on():
    prediction_4 = "early"
    answer_4 = int(icl_lens.token_patches(model, prompt).to_frame().groupby("layer").norm.mean().idxmax())

# %%
largest = int(frame.groupby("layer").norm.mean().idxmax())
thirds = ("early", "middle", "late")
check_choice(prediction_4, thirds[min(2, 3 * largest // model.cfg.n_layers)], thirds,
             "where the largest mean patch norm lies", why=f"It is layer {largest} of {model.cfg.n_layers}.")
check_sheet({"largest_norm_layer": largest, "n_layers": model.cfg.n_layers}, sheet, "the layer with the largest norm")
check_answer(answer_4, largest, "layer with the largest mean patch norm",
             why="Patch norms carry each layer's own weight and input scale: compare tokens within a layer, "
                 "and use the identity (not the norm) to say what a patch does.")

# %% [markdown]
# ## 4 · Who wrote a patch? (homework: 5 min on your own)
#
# A patch stands out in the heatmap: which earlier tokens, through which heads, wrote it? Before the norms, what
# attention adds with the context minus without it is a sum over heads `h` and removed tokens `j`,
# `Σ_h Σ_j α_hj O_h (v_hj − v̄_h)` (`α` the query's attention weights, `v̄_h` what head `h` reads from the kept
# tokens alone). The norms between that sum and the MLP input are not linear, but their Jacobian averaged along
# the straight path from the context-free to the contextual value carries it through exactly. So every patch
# splits **exactly** into parts `ΔW_hj`, one per head and token, that add up to it; the **share** of a part,
# `⟨ΔW_hj, ΔW⟩ / ‖ΔW‖²`, is how much of the patch it wrote (the shares add up to 1; a negative share points
# against the patch). `icl_lens.patch_attribution` computes them for one query or a list of queries, from one
# forward. It attributes the implicit weight update, not the model's output.
#
# The prompt repeats a list of words. For each word of the second copy: who wrote its patch?

# %%
import pandas as pd

words = " velvet harbour quantum lantern seven orchid marble cobalt thistle ember"
repeated = "Repeat after me:" + words + "." + words
tokens = model.to_str_tokens(repeated)
second = list(range(tokens.index(".") + 1, len(tokens)))  # the second copy
period = len(second) + 1  # each of its tokens appeared `period` tokens earlier
found = icl_lens.patch_attribution(model, repeated, second)  # one attribution per query, every layer
shares = pd.concat([a.to_frame() for a in found])
shares = shares[shares.part == "patch"]
by_layer = shares[shares.offset == period].groupby("layer").share.sum() / len(second)
layer_4 = int(by_layer.idxmax())  # the layer where the earlier occurrences write most, on average
at_layer = shares[shares.layer == layer_4]
per_source = at_layer.groupby(["position", "offset"]).share.sum().reset_index()
top_offset = per_source.loc[per_source.groupby("position").share.idxmax()].set_index("position").offset
by_head = at_layer[at_layer.offset == period].groupby(["position", "head"]).share.sum()
three_heads = by_head.groupby(level="position").apply(lambda s: s.nlargest(3).sum() / s.sum())
table_4 = pd.DataFrame({"token": [tokens[t] for t in second],
                        "share of its earlier occurrence": by_head.groupby(level="position").sum().round(2),
                        "earlier occurrence is the top source": top_offset == period,
                        "top-3 heads' part of it": three_heads.round(2)}, index=second)
top_earlier, heads_part = float(table_4.iloc[:, 2].mean()), float(three_heads.median())
print(f"layer {layer_4}: the earlier occurrence writes {by_layer.max():.2f} of the patch on average "
      f"(other layers: median {by_layer.drop(layer_4).median():.2f}; an even split over the context: "
      f"{1 / len(found[-1].sources):.2f})")
assert top_earlier >= 0.8 and heads_part >= 0.8, table_4  # checked by the notebook tests
table_4

# %% [markdown]
# Each repeated word's patch at that layer is written mostly by **its own earlier occurrence**, through a few
# heads: the table's last column is the part of that share carried by the three heads with the largest shares.
# It is the earlier occurrence itself, not the token after it (the one an induction head would copy forward).
# The map below is one query's: heads × context tokens at that layer. In the dashboard (notebook 05) tick
# *who wrote the patch* and click a token to see the same map while you type.

# %%
last = found[-1]
fig = go.Figure(go.Heatmap(z=last.head_map(layer_4).numpy(), x=[f"{p}:{tokens[p]}" for p in last.sources],
                           colorscale="RdBu", reversescale=True, zmid=0, colorbar={"title": "share"}))
fig.update_layout(xaxis_title="context token", yaxis_title="head", height=320, width=880,
                  title=f"who wrote the patch of {tokens[last.position]!r} (position {last.position}), layer {layer_4}")
fig

# %% [markdown]
# ## Paper says / we measure
#
# Every number below is computed in this notebook. *Baseline* is what the number must beat to count.

# %%
claims_view([
    claim("Context = a rank-1 update of each MLP's first dense weights, exactly", "Dherin et al. 2025 (2507.16003)",
          f"relative logit error {report.relative_error:.1e} (rank-1 patch + correction, float32)",
          f"without the correction: {min(errors_1):.2f}–{max(errors_1):.2f} (3 prompts)",
          "partly" if report.relative_error < 1e-4 <= min(errors_1) else False,
          "The theorem is stated for a contextual block (contextual layer → MLP); a real block's skip "
          "connection adds a term the weight patch cannot carry: exact as a rank-1 update plus the correction."),
    claim("The context-free forward is the token alone", "Dherin et al. 2025 (2507.16003)",
          f"with BOS kept: median ‖ΔW‖ {float(patches.norms()[:, 1:].median()):.3f}",
          f"BOS removed too: {float(no_bos.norms()[:, 1:].median()):.3f} (error {no_bos_error:.1e})", "partly",
          "Both kept sets reproduce the logits; icl_lens keeps BOS (the attention sink): smaller patches, smaller "
          "rounding error."),
    claim("A repeated token's patch is written by its earlier occurrence, through a few heads",
          "icl_lens's exact attribution (docs/design.md §7)",
          f"layer {layer_4}: top source for {top_earlier:.0%} of {len(second)} repeated tokens, mean share "
          f"{by_layer.max():.2f}; the top 3 heads carry {heads_part:.0%} of it (median)",
          f"an even split: {1 / len(found[-1].sources):.2f}; the earlier occurrence at the other layers: "
          f"{by_layer.drop(layer_4).median():.2f} (median)", top_earlier >= 0.8 and heads_part >= 0.8,
          "Shares of the implicit weight update (they add up to 1), not of the output; one prompt."),
])

# %% [markdown]
# **Before you switch notebooks**: the last cell frees the model; then shut this kernel down (JupyterLab: *Kernel →
# Shut Down Kernel*) so its memory is back before 02 starts.

# %%
from workshop.cleanup import free

free(globals(), "model", "patches", "no_bos", "ablated", "without_correction", "cache_2", "found", "shares")
