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
# # 03 · Does it transfer to a real LM? Implicit dynamics as online gradient steps
#
# **Learning objective.** After this notebook you can compute a query's implicit weights `W₀ … Wₙ` on a real model,
# check that each step is exact, read a decay exponent correctly (what its sign says and what it does *not* say),
# and judge an alignment cosine against a control.
#
# **Time box: 25 minutes** (15 running and reading, 8 for exercise 1 and 2 for the claims table; exercises 2 and 3
# if time, else homework; the first exercise's check runs six trajectories, about a minute).
#
# Reading the context one token at a time turns a query's token patch into a sequence of implicit weights
# `W₀, W₁, …, Wₙ`: `Wᵢ` makes the context-free input `[BOS, x_t]` (BOS kept, as in 01) reproduce the model's output
# with context `c₁..cᵢ`. The step `Wᵢ − Wᵢ₋₁` is the *meta-gradient* of token `cᵢ` (Dherin et al. 2025,
# arXiv 2507.16003, §3). Notebook 02 showed on the regression lab that attention's steps shrink like `1/i` because
# attention is a running average. Here we ask whether the same holds on a real LM: the embedded SmolLM2-135M (30
# layers; it fits Binder's 2 GB), or Gemma 3 270M if you set `MODEL = "gemma-3-270m"` on a laptop with 4 GB free.
# icl_lens computes all n+1 steps for every layer in one batched forward, factored.
#
# **Memory.** In the notebook tests (SmolLM2-135M, solutions on) this kernel peaked at
# <!-- report:memory_03 -->1.15 GB (above the 1 GB Binder guarantees; measured 2026-12-06)<!-- /report -->: run one notebook's kernel at a time (Binder allows up to 2 GB when its machine has it free).

# %%
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import torch

import icl_lens
from icl_lens.stats import bootstrap_mean
from icl_lens.ui import layer_lines
from workshop.claims import alignment_row, answer_sheet, claim, claims_view, count_where, mean_ci, verdict_above
from workshop.exercise_checks import (check_answer, check_below, check_choice, check_compare, check_sheet, missing,
                                      no_answer, solutions_on)

torch.set_num_threads(1)
MODEL = "smollm2-135m"  # or "gemma-3-270m" (about 2.2 GB of memory)
model = icl_lens.load_model(MODEL)
# the guide's expected answers, measured on MODEL (reports/workshop_answers.json); the checks compare this run with it
sheet = answer_sheet("03_implicit_dynamics", MODEL)
prompt = "France: Paris\nJapan: Tokyo\nItaly: Rome\nSpain: Madrid\nGermany:"
traj = icl_lens.trajectory(model, prompt)  # query = last token
print(f"query {traj.query} {traj.tokens[traj.query]!r}, n = {traj.n_context} context tokens, "
      f"{len(traj.layers)} layers")

# %% [markdown]
# ## 1 · Each step is exact (3 min)
#
# For a few prefix lengths i, run the model on `[BOS, c₁..cᵢ, x_t]` (query at its original position) and compare with
# `[BOS, x_t]` carrying `Wᵢ` (and the skip corrections) in every layer. The cell asserts the identity.

# %%
n = traj.n_context
check = icl_lens.verify_trajectory(model, prompt, traj, steps=[1, n // 2, n])
assert check.relative_error < 1e-4, check.to_frame()
check.to_frame()

# %% [markdown]
# ## 2 · Meta-gradient norm vs context length (3 min)
#
# `‖Wᵢ − Wᵢ₋₁‖_F` in closed form from the factors, one line per layer (colour = layer; hover a line to see which
# token each step consumed). Norms are **not comparable across layers** (each layer has its own weight scale):
# look at the slope of each line, not at which line is on top.

# %%
frame = traj.to_frame()
steps = frame[frame.metric == "meta_gradient_norm"]
layer_lines(steps, x="step", y="value", hover="token", log_x=True, log_y=True, x_title="context tokens consumed i",
            y_title="‖Wᵢ − Wᵢ₋₁‖_F", title="Meta-gradient norms, one line per layer")

# %% [markdown]
# ## 3 · Do the steps shrink? Decay exponents (4 min)
#
# Per layer, a least-squares fit of `‖Wᵢ − Wᵢ₋₁‖ ≈ c·i^(−b)` in log–log space. **Read the sign correctly**: `b > 0`
# means the *steps shrink*; `b < 0` means they grow. Shrinking steps are not yet convergence: `Wᵢ` converges only if
# the steps *sum* to a finite total, which needs them to shrink faster than `1/i` (`b > 1`), and even `b = 1` (the
# running average of notebook 02) drifts like `log n`. `r_squared` says how well a power law describes the steps
# at all.

# %%
fit = traj.decay_fit().to_frame()
growing = count_where(fit.exponent, lambda b: b < 0)
assert (fit.exponent < 0).sum() > len(fit) / 2, "the text below says the steps grow in most layers on this prompt"
print(f"fitted exponent negative (steps grow) in {growing} layers; median R² {fit.r_squared.median():.2f}")
px.bar(fit, x="layer", y="exponent", color="r_squared", color_continuous_scale="Viridis", range_color=(0, 1),
       title="fitted decay exponent b (b > 0: steps shrink)")

# %% [markdown]
# On this prompt the steps do **not** shrink in most layers, unlike the lab's attention models. The lab's argument
# (a running average over i.i.d. examples) does not carry over directly: a real prompt's tokens are not examples
# of one regression, most of the model's attention sits on BOS (the sink), and a few tokens (the answers, the newlines)
# move the query far more than the others. The exercise below asks whether a prompt without repeated structure
# behaves differently.
#
# ## 4 · Alignment along the trajectory (2 min)
#
# Cosine of each meta-gradient with the total update `Wₙ − W₀` (layers × steps; colour from −1 to 1).

# %%
align = frame[frame.metric == "total_alignment"].pivot(index="layer", columns="step", values="value")
px.imshow(align, color_continuous_scale="RdBu", zmin=-1, zmax=1, aspect="auto",
          labels={"x": "step i", "y": "layer", "color": "cos(Gᵢ, Wₙ − W₀)"})

# %% [markdown]
# ## 5 · Implicit vs explicit finetuning, against a control (3 min)
#
# `finetune_alignment` runs plain SGD on `W_gate` and `W_up` of every layer, on the context-free input, toward the
# contextual next-token prediction, keeping every update factored, and compares it with the implicit update
# `Wₙ − W₀` (per-layer cosine). The model is not modified. **A cosine means nothing without a control**: here the
# control pairs this prompt's implicit update with the SGD update of *another* prompt. If the two are about
# the same, the alignment is not specific to this prompt's context.

# %%
fa = icl_lens.finetune_alignment(model, prompt, lr=1e-3, steps=3)
other_prompt = "The old lighthouse keeper climbed the stairs every night to light the"
fa_other = icl_lens.finetune_alignment(model, other_prompt, lr=1e-3, steps=3)
cosines = pd.DataFrame({"same prompt": fa.cosine().numpy(),  # control: this implicit update vs another prompt's SGD
                        "control": fa.cosine_with_explicit_of(fa_other).numpy()}, index=list(fa.layers))
print("target", repr(fa.target_token), "loss", [round(x, 3) for x in fa.losses.tolist()])
fig = go.Figure([go.Bar(x=cosines.index, y=cosines[c], name=c) for c in cosines])
fig.update_layout(barmode="group", xaxis_title="layer", yaxis_title="cos(implicit, SGD)", height=360,
                  legend=dict(orientation="h", y=1.1), margin=dict(t=40))
fig

# %% [markdown]
# The evaluation (`python -m experiments.finetune_alignment`: 64 prompts, the paper's per-token protocol, 95%
# intervals; EVAL.md) measured the same question at scale; its numbers are read in the table at the end.
#
# ## Exercises (exercise 1 in the room; 2 and 3 if time, else homework)
#
# ### Exercise 1 · Predict, then check: free text vs few-shot (8 min)
#
# One prompt per kind cannot answer a question about kinds of prompts, so the check runs three of each.
# **Predict**: do free-text prompts (no repeated structure) have a *higher* or *lower* mean decay exponent (mean over
# layers) than few-shot prompts, or will three prompts of each not tell them apart (`"not distinguishable"`)? Write
# your answer into `prediction_1`. Then compute `free_exponent`, the mean exponent of
# `icl_lens.trajectory(model, other_prompt)` (one free-text prompt, defined in section 5).

# %%
prediction_1 = None  # "higher", "lower" or "not distinguishable"
free_exponent = None

# %% jupyter={"source_hidden": true} tags=["solution"]
if solutions_on():  # runs only in the notebook tests (ICL_LENS_SOLUTIONS=1); read it or copy it up
    free = icl_lens.trajectory(model, "The old lighthouse keeper climbed the stairs every night to light the")
    free_exponent = float(free.decay_fit().exponent.mean())
    prediction_1 = "not distinguishable"

# %%
# Check cell: mean exponent per prompt, three prompts of each kind, with bootstrap intervals over prompts.
few_shot_prompts = [prompt, "hot: cold\nbig: small\nfast: slow\nhappy: sad\nup:",
                    "cat: chat\ndog: chien\nhouse: maison\nwater: eau\nbread:"]
free_prompts = [other_prompt, "She opened the window and the cold morning air filled the",
                "After the long meeting, the engineers went back to their desks and"]
mean_exponent = {p: float(icl_lens.trajectory(model, p).decay_fit().exponent.mean())
                 for p in few_shot_prompts + free_prompts}
free_ci = bootstrap_mean([mean_exponent[p] for p in free_prompts])
few_ci = bootstrap_mean([mean_exponent[p] for p in few_shot_prompts])
check_answer(free_exponent, mean_exponent[other_prompt], "mean decay exponent of the free-text prompt", rel_tol=1e-6)
check_compare(prediction_1, free_ci, few_ci, "free text vs few-shot", names=("free text", "few-shot"),
              why="b > 0 would mean shrinking steps.")
check_sheet({"mean_exponent_free_text": free_ci, "mean_exponent_few_shot": few_ci}, sheet, "the mean exponents")

# %% [markdown]
# ### Exercise 2 · Is every step exact on the free-text prompt too?
#
# Use `icl_lens.verify_trajectory` on `other_prompt` at every step (`steps=range(1, n + 1)`, `n` its number of context
# tokens) and put the returned check into `free_check`.

# %%
free_check = None

# %% jupyter={"source_hidden": true} tags=["solution"]
if solutions_on():
    free_prompt = "The old lighthouse keeper climbed the stairs every night to light the"
    free_traj = icl_lens.trajectory(model, free_prompt)
    free_check = icl_lens.verify_trajectory(model, free_prompt, free_traj, steps=range(1, free_traj.n_context + 1))

# %%
if missing(free_check):
    no_answer("the check of every step on the free-text prompt")
else:
    check_answer(len(free_check.steps), icl_lens.trajectory(model, other_prompt).n_context, "number of steps checked")
    check_below(free_check.relative_error, 1e-4, "worst relative logit error over the steps")
    check_sheet({"free_text_steps": len(free_check.steps), "free_text_worst_error": free_check.relative_error}, sheet,
                "every step on the free-text prompt")

# %% [markdown]
# ### Exercise 3 · Predict, then check: a cosine against its control
#
# **Predict first**: in how many of the layers is the same-prompt cosine of section 5 larger than the control's?
# In `"most"` (over two thirds), `"about half"` (one to two thirds) or `"few"` (under a third)? Write it into
# `prediction_3`; then count them into `answer_3`. Is the implicit update aligned with this prompt's own SGD update
# in a way the control is not?

# %%
prediction_3 = None  # "most", "about half" or "few"
answer_3 = None

# %% jupyter={"source_hidden": true} tags=["solution"]
if solutions_on():
    prediction_3 = "about half"
    answer_3 = int((cosines["same prompt"] > cosines["control"]).sum())

# %%
beats = int((fa.cosine() > fa.cosine_with_explicit_of(fa_other)).sum())
share = beats / len(cosines)
check_choice(prediction_3, "most" if share > 2 / 3 else "few" if share < 1 / 3 else "about half",
             ("most", "about half", "few"), "layers where the same-prompt cosine beats the control",
             why=f"{beats} of {len(cosines)}: half is what two unrelated cosines give.")
check_answer(answer_3, beats,
             "layers where the same-prompt cosine beats the control",
             why=f"Of {len(cosines)} layers; all |cos| ≤ {float(cosines.abs().max().max()):.3f}. One prompt and one "
                 "control decide nothing: the 64-prompt evaluation in the table below is the answer that counts.")
check_sheet({"beats_control": beats, "n_layers": len(cosines), "max_abs_cos": float(cosines.abs().max().max())}, sheet,
            "the cosines against the control")

# %% [markdown]
# ## Paper says / we measure (2 min)
#
# This prompt's numbers are computed above; the 64-prompt numbers are read from
# `reports/eval_finetune_alignment.json` (a checkout without the report says "not measured in this checkout").

# %%
shrinks = bool((fit.exponent > 0).mean() > 0.5)
aligned = bool(cosines["same prompt"].mean() > cosines["control"].mean() + 0.1)
not_above = "Interval not above the control's (or below 0.1)."
step, step_control = (alignment_row(MODEL, c, "absorb", "step") for c in ("sgd", "control"))
cum, cum_control = (alignment_row(MODEL, c, "absorb", "cumulative") for c in ("sgd", "control"))
claims_view([
    claim("Each implicit step Wᵢ is exact", "Dherin et al. 2025", f"worst relative error {check.relative_error:.1e}",
          "float32 tolerance 1e-4", check.relative_error < 1e-4, ""),
    claim("Attention gives smooth, convergent implicit updates: meta-gradients shrink", "Dherin et al. 2025",
          f"b < 0 (steps grow) in {growing} layers (this prompt)", "b = 0: steps of constant size",
          shrinks, "" if shrinks else "The lab's running-average argument (02) does not carry over: real prompt "
                                      "tokens are not i.i.d. examples and most attention sits on BOS."),
    claim("The implicit update aligns with SGD finetuning (this prompt)", "Dherin et al. 2025",
          f"mean cos over layers {cosines['same prompt'].mean():+.4f}",
          f"control (another prompt's SGD) {cosines['control'].mean():+.4f}", aligned,
          "" if aligned else "Tiny, and no larger than pairing with another prompt's SGD update."),
    claim(f"… per step, paper's order, 64 prompts ({MODEL})", "Dherin et al. 2025", mean_ci(step),
          mean_ci(step_control), verdict_above(step, step_control, floor=0.1),
          "" if verdict_above(step, step_control, floor=0.1) else not_above),
    claim(f"… cumulative, paper's order, 64 prompts ({MODEL})", "Dherin et al. 2025", mean_ci(cum),
          mean_ci(cum_control), verdict_above(cum, cum_control, floor=0.1),
          "" if verdict_above(cum, cum_control, floor=0.1) else not_above),
])

# %% [markdown]
# **Before you switch notebooks**: the last cell frees the model; then shut this kernel down (*Kernel → Shut Down
# Kernel*).

# %%
from workshop.cleanup import free

free(globals(), "model", "traj", "fa", "fa_other")
