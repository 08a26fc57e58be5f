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
# # 04 · Prompts into weights: thought patches
#
# **Learning objective.** After this notebook you can fit a *thought patch* (a prompt turned into a static weight
# edit), say what exactly it edits on each block family, measure its accuracy **with an interval** against the
# prompt and a random control, and export it as a plain Hugging Face model.
#
# **Time box: 30 minutes** (10 running and reading, 20 for the two exercises; the evaluation cells take a few
# minutes on a 2-core laptop: read section 3 while they run).
#
# A few-shot prompt changes what a model does. *Transmuting prompts into weights*
# (Mazzawi, Dherin et al. 2025, arXiv 2510.08734) makes that change permanent: for each
# layer, average the exact token patches of many calibration queries into a
# **thought vector** (mean residual) and a **thought matrix**
# `Δ = (Σ W δᵢ aᵢᵀ)(Σ aᵢ aᵢᵀ + λI)⁻¹`, fitted layer by layer (Algorithm 1).
# The patched model then answers *without* the prompt.
#
# In this notebook: fit a thought patch from a few-shot prompt on Gemma 3 270M, evaluate
# it, export it as a plain Hugging Face model and reload it without icl_lens. Notebook 02 did the
# same on the regression lab (section 4).

# %%
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from icl_lens import Task, evaluate_thought, load_model, load_task, thought_patch
from workshop.claims import claim, claims_view, rate, thought_counts
from workshop.exercise_checks import check_answer, check_choice

torch.set_num_threads(1)
model = load_model("gemma-3-270m")
task = load_task("capitals")  # shipped with icl_lens: icl_lens/thought/tasks/capitals.jsonl
print(task.instruction)
print("train:", task.train[:3], "...")
print("test: ", task.test[:3], "...")

# %% [markdown]
# ## 1 · Fit the thought patch (5 min)
#
# The calibration set is the task's *train* queries (`"Kenya:"`, …). Each query is read once
# after the instruction (contextual pass) and then alone, layer by layer, with the patch
# fitted so far. The table shows, per layer, the norms of the weight edit and how much of
# the residual the least-squares fit leaves (0 = interpolated exactly).

# %%
calibration = [q for q, _ in task.train[:8]]
patch = thought_patch(model, task.instruction, calibration, kind="both", ridge=0.0, query_prefix="",
                      answer_tokens=0)  # Algorithm 1 as published
patch.to_frame().round(3)

# %% [markdown]
# ### What the "thought vector" is on each block family
#
# The paper's thought vector is a constant added after the MLP branch (a bias). Where it can go depends on the
# block (`icl_lens/thought/fit.py`, `model/block_family.py`):
#
# - **GPT-2, GPT-NeoX, Llama**: a real bias after the MLP (`c_proj.bias`, `dense_4h_to_h.bias`,
#   `down_proj.bias`): the mean block-output residual, a classic steering vector.
# - **Gemma 2/3, OLMo-2**: the MLP branch *ends in an RMSNorm* (the post-FFN norm), and the Hugging Face
#   architecture has no bias after it. icl_lens fits an update `g` of that norm's **gain** instead: the branch
#   output `gain ⊙ ŷ` becomes `(gain + g) ⊙ ŷ`, with `g` the per-coordinate least-squares fit of the residual. It is exact
#   for one calibration token, like the bias, but it is a *multiplicative* edit, not a steering vector: where the
#   normalised MLP output `ŷ` is near zero, a large gain is needed, hence gain norms in the thousands below.
# - **Mistral, Qwen 2/3, Phi-3**: the vector is a bias, but no parameter of the Hugging Face class adds a
#   constant after the MLP: it applies through hooks only and `save_pretrained` refuses it.

# %%
print("family:", patch.family, "· vector site:", patch.vector_site)
print("largest per-layer vector norm:", round(float(patch.vector_norms().max()), 1))

# %% [markdown]
# ## 2 · Does the model now answer without the prompt? (5 min)
#
# Four conditions on the task's 24 held-out test queries: the query alone (*none*), the few-shot prompt
# plus query (*full*), the query alone with the thought patch (*patched*), and a *control*
# patch with the same per-layer norms but random directions. With 24 queries one query is
# 4 points, so every accuracy comes with its 95% Wilson interval: two conditions whose
# intervals overlap are not shown to differ.

# %%
small = Task(task.name, task.instruction, task.train[:8], task.test[:24])
result = evaluate_thought(model, small)
counts = {c: round(a * result.n_test) for c, a in result.accuracy.items()}
assert result.n_test >= 24
{c: rate(k, result.n_test) for c, k in counts.items()}

# %% [markdown]
# The patch is fitted to make the query alone behave as the query *after the prompt*, so the
# fair question is also answer by answer: on how many test queries does each condition give
# exactly the answer the full prompt gives, right or wrong? (`agreement_with_full`; a wrong
# answer the patched model shares with the full prompt is the prompt's effect carried over.)

# %%
assert result.agreement_with_full["patched"] > result.agreement_with_full["control"]
{c: f"{a:.0%}" for c, a in result.agreement_with_full.items()}

# %%
from icl_lens.model.greedy import greedy_continuations
from icl_lens.thought.instruction_batches import text_ids, with_bos

queries = [q for q, _ in task.test[:5]]
prompts = [with_bos(model, text_ids(model, q)) for q in queries]
with patch.applied():
    patched = greedy_continuations(model, prompts, 4)
plain = greedy_continuations(model, prompts, 4)
for q, a, b in zip(queries, plain, patched):
    print(f"{q!r:16} unpatched {model.tokenizer.decode(a)!r:24} patched {model.tokenizer.decode(b)!r}")

# %% [markdown]
# ## 3 · Export and reload in plain `transformers` (5 min)
#
# `save_pretrained` writes a normal Hugging Face directory: the MLP input weights carry
# `W + W M`; the thought vector sits in the post-FFN norm gain for Gemma (a bias on the
# MLP output for GPT-2 and Llama). Loading it needs nothing but `transformers`.

# %%
export_dir = tempfile.mkdtemp(prefix="thought-capitals-")
patch.save_pretrained(export_dir)

hf = AutoModelForCausalLM.from_pretrained(export_dir)
tok = AutoTokenizer.from_pretrained(export_dir)
ids = tok(queries[0], return_tensors="pt").input_ids  # the tokenizer adds BOS
out = hf.generate(ids, max_new_tokens=4, do_sample=False)
print(queries[0], "->", repr(tok.decode(out[0, ids.shape[1]:])))

with torch.no_grad():
    with patch.applied():
        bridge_logits = model(ids)[0, -1]
    hf_logits = hf(ids).logits[0, -1]
export_error = float((hf_logits - bridge_logits).abs().max() / bridge_logits.abs().max())
assert export_error < 1e-4, export_error  # the exported model is the patched model
print("max |logit difference| / max |logit|:", export_error)

# %% [markdown]
# ## Exercise 1 · Predict, then check: vector or matrix? (10 min)
#
# **Predict** first: which part of the patch carries the instruction on Gemma, the thought *vector* (here: the
# post-FFN gain) or the thought *matrix*? Write `"vector"` or `"matrix"` into `prediction_1`. Then fit
# `kind="vector"` and `kind="matrix"` on the same 8 calibration queries and put their evaluations on `small`
# (`evaluate_thought(model, small, kind=..., conditions=("patched",))`) into `by_kind`.

# %%
prediction_1 = None  # "vector" or "matrix"
by_kind = {}  # {"vector": ThoughtEval, "matrix": ThoughtEval}

# %% jupyter={"source_hidden": true} tags=["solution"]
by_kind = {kind: evaluate_thought(model, small, kind=kind, conditions=("patched",)) for kind in ("vector", "matrix")}
prediction_1 = max(by_kind, key=lambda kind: by_kind[kind].accuracy["patched"])
for kind, r in by_kind.items():
    print(kind, r.accuracy["patched"])
print("both", result.accuracy["patched"])

# %%
check_answer(sorted((k, r.kind, r.n_test) for k, r in by_kind.items()),
             [("matrix", "matrix", 24), ("vector", "vector", 24)], "evaluations of each kind on the 24 test queries")
acc = {k: r.accuracy["patched"] for k, r in by_kind.items()}
print({k: rate(round(a * 24), 24) for k, a in acc.items()})
check_choice(prediction_1, max(acc, key=acc.get), ("vector", "matrix"), "the part that carries the instruction",
             why="Compare the intervals: where they overlap, 24 queries cannot tell the two apart.")

# %% [markdown]
# ## Exercise 2 · How many calibration queries? (10 min)
#
# Fit a patch from a single calibration query (`n_train=1`) and put its evaluation on `small` into `one_query`.
# With the default settings its rows are that query's tokens and the tokens of the model's own answer under the
# instruction (`answer_tokens`), a handful of rows for a d_model-wide fit. **Predict**: is its patched
# accuracy on the 24 test queries *lower* than with 8 queries (`result` above), or *not lower*?
# Write `"lower"` or `"not lower"` into `prediction_2`.

# %%
prediction_2 = None  # "lower" or "not lower"
one_query = None

# %% jupyter={"source_hidden": true} tags=["solution"]
one_query = evaluate_thought(model, small, n_train=1, conditions=("patched",))
prediction_2 = "lower" if one_query.accuracy["patched"] < result.accuracy["patched"] else "not lower"
print(1, one_query.accuracy["patched"], "·", 8, result.accuracy["patched"])

# %%
check_answer((one_query.n_train, one_query.n_test), (1, 24), "calibration and test queries of one_query")
one, eight = round(one_query.accuracy["patched"] * 24), counts["patched"]
check_choice(prediction_2, "lower" if one < eight else "not lower", ("lower", "not lower"),
             "one calibration query vs eight", why=f"1 query: {rate(one, 24)}; 8 queries: {rate(eight, 24)}.")

# %% [markdown]
# ## Paper says / we measure
#
# This notebook's numbers (8 calibration queries, 24 test queries, 95% Wilson intervals) beside the evaluation
# reports (`python -m experiments.thought`, `reports/eval_thought.<model>.json`; a checkout without them says
# "not measured in this checkout").

# %%
def row(counts_or_none, what):  # one claims row from {condition: (correct, n)}
    c = counts_or_none
    holds = None if c is None else c["patched"][0] > c["none"][0] and c["patched"][0] > c["control"][0]
    return claim(f"A thought patch makes the model answer without the prompt ({what})", "Mazzawi, Dherin et al. 2025",
                 None if c is None else f"patched {rate(*c['patched'])}",
                 None if c is None else f"none {rate(*c['none'])}, full prompt {rate(*c['full'])}, "
                                        f"random control {rate(*c['control'])}",
                 "partly" if holds else holds,
                 "Above no prompt and the random control; compare its interval with the full prompt's."
                 if holds else "Not above no prompt or the random control.")


here = {c: (k, result.n_test) for c, k in counts.items()}
claims_view([row(here, "capitals, this notebook"),
              row(thought_counts("gemma-3-270m", "capitals"), "capitals, eval report"),
              row(thought_counts("gemma-3-270m", "en_fr"), "en_fr, eval report"),
              claim("The thought vector is a steering vector (bias)", "Mazzawi, Dherin et al. 2025",
                    f"Gemma: {patch.vector_site} of the post-FFN norm, max norm {float(patch.vector_norms().max()):.0f}",
                    "a bias on GPT-2 / Llama", "partly", "No bias slot after Gemma's post-FFN RMSNorm.")])
