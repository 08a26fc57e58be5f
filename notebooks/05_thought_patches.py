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
# # 05 · Thought patches: turn a prompt into weights
#
# A few-shot prompt changes what a model does. *Transmuting prompts into weights*
# (Mazzawi, Dherin et al. 2025, arXiv 2510.08734) makes that change permanent: for each
# layer, average the exact token patches of many calibration queries into a
# **thought vector** (mean residual) and a **thought matrix**
# `Δ = (Σ W δᵢ aᵢᵀ)(Σ aᵢ aᵢᵀ + λI)⁻¹`, fitted layer by layer (Algorithm 1).
# The patched model then answers *without* the prompt.
#
# In this notebook: fit a thought patch from a few-shot prompt on Gemma 3 270M, evaluate
# it, export it as a plain Hugging Face model and reload it without icl_lens.

# %%
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from icl_lens import Task, evaluate_thought, load_model, load_task, thought_patch

model = load_model("gemma-3-270m")
task = load_task("capitals")  # shipped with icl_lens: icl_lens/thought/tasks/capitals.jsonl
print(task.instruction)
print("train:", task.train[:3], "...")
print("test: ", task.test[:3], "...")

# %% [markdown]
# ## 1 · Fit the thought patch
#
# The calibration set is the task's *train* queries (`"Kenya:"`, …). Each query is read once
# after the instruction (contextual pass) and then alone, layer by layer, with the patch
# fitted so far. The table shows, per layer, the norms of the weight edit and how much of
# the residual the least-squares fit leaves (0 = interpolated exactly).

# %%
calibration = [q for q, _ in task.train[:8]]
patch = thought_patch(model, task.instruction, calibration)  # defaults: kind="both+down", eta=1, ridge, query_prefix="\n"
patch.to_frame().round(3)

# %% [markdown]
# ## 2 · Does the model now answer without the prompt?
#
# Five conditions on held-out test queries: the query alone (*none*), the few-shot prompt
# plus query (*full*), the query alone with the thought patch (*patched*), a *control*
# patch with the same per-layer norms but random directions, and a *steering* vector. The
# query alone is read as `[BOS] + "\n" + query`, as the patch was fitted
# (`patch.prompt_ids`). (A smaller test set keeps this cell quick.)

# %%
small = Task(task.name, task.instruction, task.train[:8], task.test[:6])
result = evaluate_thought(model, small)
result.to_frame()

# %%
from icl_lens.model.greedy import greedy_continuations

queries = [q for q, _ in task.test[:5]]
prompts = [patch.prompt_ids(q) for q in queries]  # [BOS] + query prefix + query
with patch.applied():
    patched = greedy_continuations(model, prompts, 4)
plain = greedy_continuations(model, prompts, 4)
for q, a, b in zip(queries, plain, patched):
    print(f"{q!r:16} unpatched {model.tokenizer.decode(a)!r:24} patched {model.tokenizer.decode(b)!r}")

# %% [markdown]
# ## 3 · Export and reload in plain `transformers`
#
# `save_pretrained` writes a normal Hugging Face directory: the MLP input weights carry
# `W + W M`; the thought vector sits in the post-FFN norm gain for Gemma (a bias on the
# MLP output for GPT-2 and Llama). Loading it needs nothing but `transformers`.

# %%
export_dir = tempfile.mkdtemp(prefix="thought-capitals-")
patch.save_pretrained(export_dir)

hf = AutoModelForCausalLM.from_pretrained(export_dir)
tok = AutoTokenizer.from_pretrained(export_dir)
ids = torch.tensor([patch.prompt_ids(queries[0])])  # BOS + "\n" + query, as fitted
out = hf.generate(ids, max_new_tokens=4, do_sample=False)
print(queries[0], "->", repr(tok.decode(out[0, ids.shape[1]:])))

with torch.no_grad():
    with patch.applied():
        bridge_logits = model(ids)[0, -1]
    hf_logits = hf(ids).logits[0, -1]
print("max |logit difference| / max |logit|:",
      float((hf_logits - bridge_logits).abs().max() / bridge_logits.abs().max()))

# %% [markdown]
# ## Exercise 1 · Vector or matrix?
#
# Fit `kind="vector"` (only the thought vector: the classic steering vector) and
# `kind="matrix"` (only the thought matrix) on the same 8 calibration queries, and compare
# their *patched* accuracy on `small` with the `"both"` result above. Which part carries the
# instruction?

# %%
# your code here

# %% jupyter={"source_hidden": true} tags=["solution"]
for kind in ("vector", "matrix"):
    r = evaluate_thought(model, small, kind=kind, conditions=("patched",))
    print(kind, r.accuracy["patched"])
print("both", result.accuracy["patched"])

# %% [markdown]
# ## Exercise 2 · How many calibration queries?
#
# Fit patches from 1, 2 and 8 calibration queries (`n_train=`) and print the patched
# accuracy for each. With λ = 0 and few queries the least squares would interpolate them
# exactly (minimum norm); the default ridge shrinks that fit. Does it generalise to the
# test queries?

# %%
# your code here

# %% jupyter={"source_hidden": true} tags=["solution"]
for n in (1, 2, 8):
    r = evaluate_thought(model, small, n_train=n, conditions=("patched",))
    print(n, r.accuracy["patched"])
