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
# # 06 · Open exploration: spike flags
#
# **Learning objective.** Read a spike score (a robust z-score of patch norms within each layer, so layers with
# different scales can be aggregated), see how the window and the aggregation change what is flagged, and know what
# the flags are worth: the evaluation measures whether they spot wrong answers better than the token log-probability.
#
# **Time box: 15 minutes**, open exploration (in a 3-hour session, pick 05 or 06; the other is homework); the
# exercises are a starting point.
#
# **Whose idea.** Dherin et al. 2025 (arXiv 2507.16003) suggest that the exact meta-gradients of a generation could
# serve to monitor a model's health, e.g. to detect hallucinations or mode collapse; they do not test it. The spike
# flag is icl_lens's implementation of that suggestion, and the evaluation below says how well it works: **not well**.
# The model is the embedded SmolLM2-135M (Binder's 2 GB); `MODEL = "gemma-3-270m"` on a laptop with 4 GB free.
#
# Every token `t` gets a *token patch* per layer, the rank-1 update `ΔW[l,t]` that, with the skip correction, makes its context-free input reproduce its contextual output (Dherin et al. 2025, arXiv 2507.16003). Its norm `‖ΔW[l,t]‖_F` says how much the context changes layer `l` at `t`.
#
# A **spike** is a token whose patch norm is unusually large compared with the tokens just before it. `icl_lens.spike_scores` turns each layer's norm series into a robust z-score against a trailing window (median and `1.4826·MAD` of the previous `window` tokens), aggregates the layers (`statistic="mean"`, `"max"`, `"median"` of the per-layer z, or `"norm"`: z of the whole patch's norm), and flags tokens whose score passes `threshold`. Tokens with fewer than `window` predecessors are reported as *not enough context*, never flagged.
#
# **Memory.** In the notebook tests (SmolLM2-135M, solutions on) this kernel peaked at
# <!-- report:memory_06 -->1.14 GB (above the 1 GB Binder guarantees; measured 2026-12-06)<!-- /report -->: run one notebook's kernel at a time (Binder allows up to 2 GB when its machine has it free).

# %%

import pandas as pd
import torch

import icl_lens
from workshop.claims import (answer_sheet, auroc_ci, claims_view, percent_ci, spike_auroc, spike_scored, spike_shipped,
                             spike_unseen_auroc, spike_without_copied_answers, summary_claims)
from workshop.exercise_checks import check_answer, check_compare, check_sheet, missing, no_answer, solutions_on

torch.set_num_threads(1)
MODEL = "smollm2-135m"  # or "gemma-3-270m" (about 2.2 GB of memory)
model = icl_lens.load_model(MODEL)
print(model.cfg.n_layers, "layers")
# the guide's expected answers, measured on MODEL (reports/workshop_answers.json); the checks compare this run with it
sheet = answer_sheet("06_spike_flags", MODEL)

# %% [markdown]
# ## Scores on a prompt

# %%
prompt = ("The cat sat on the mat. The dog sat on the rug. The bird sat on the branch. "
          "The fish swam in the bowl. The horse stood in the field. Meanwhile, the Treaty of Westphalia "
          "was signed in 1648.")
patches = icl_lens.token_patches(model, prompt)
threshold = icl_lens.spike_threshold(MODEL, statistic="mean", window=16)  # calibrated per model (EVAL.md)
print("threshold:", threshold.describe())
spikes = icl_lens.spike_scores(patches, window=16, threshold=threshold.value)
print("flagged:", [(t, spikes.tokens[t]) for t in spikes.flagged_positions])
print("positions without enough context:", int((~spikes.enough_context).sum()))
assert not (spikes.to_frame().flagged & ~spikes.to_frame().enough_context).any()  # never flagged without context
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
# The per-layer scores (`layer_scores`, layer × position) show where in depth a spike happens. Each layer's
# score is a z-score against *that layer's* recent history, which is what makes layers comparable here (raw patch
# norms are not comparable across layers).

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
# ### Exercise 1 · Predict, then check: the window (5 min)
#
# **Predict**: with `window=8` instead of 16, how many positions of `patches` lack enough context? Put the number
# into `answer_1`, then compare the tokens flagged with `statistic="max"` for both windows. (Before you answer 8:
# which positions have a patch at all? Read "informative positions" in `help(icl_lens.spike_scores)`.)

# %%
answer_1 = None

# %% jupyter={"source_hidden": true} tags=["solution"]
if solutions_on():  # runs only in the notebook tests (ICL_LENS_SOLUTIONS=1); read it or copy it up
    for window in (8, 16):
        s = icl_lens.spike_scores(patches, window=window, statistic="max")
        print(f"window {window}: {int((~s.enough_context).sum())} without enough context; flagged",
              [s.tokens[t] for t in s.flagged_positions])
    answer_1 = int((~icl_lens.spike_scores(patches, window=8).enough_context).sum())

# %%
check_answer(answer_1, int((~icl_lens.spike_scores(patches, window=8).enough_context).sum()),
             "positions without enough context at window 8",
             why="A position is scored only once it has `window` informative predecessors to compare with. BOS and "
                 "the token right after it remove no context, so their patches are zero by definition: they are "
                 "never scored and never count as history. Hence 2 + 8: positions 0 and 1, then the first 8 "
                 "informative positions, whose windows are not yet full.")
check_sheet({"without_enough_context_window_8": int((~icl_lens.spike_scores(patches, window=8).enough_context).sum())},
            sheet, "the positions without enough context")

# %% [markdown]
# ### Exercise 2 · Predict, then check: is a spike a sign of a wrong answer? (10 min, open)
#
# **Predict first**: on kinds of question it never saw, does the unsupervised spike score (max over the answer's
# tokens) rank wrong answers *higher* than the answer's −mean log p does, *lower*, or are the two
# `"not distinguishable"` with the evaluation's questions? Write it into `prediction_2`; the check grades it on the
# evaluation's intervals (`reports/eval_spikes.json`).
#
# Then sample three continuations (`greedy=False`, `temperature=1.2`, seeds 0, 1, 2, `statistic="max"`). For each,
# print the text, the number of flagged tokens and the mean log-prob. Are flagged tokens less likely than the others?
# Thirty tokens cannot answer that: the evaluation below does (its first row says how many questions it scored).

# %%
prediction_2 = None  # "higher", "lower" or "not distinguishable"
samples, n_flagged = None, None  # three GenerationPatches, and the number of flagged tokens in each

# %% jupyter={"source_hidden": true} tags=["solution"]
if solutions_on():
    samples, n_flagged = [], []
    for seed in range(3):
        g = icl_lens.generate_with_patches(model, prompt, max_new_tokens=10, greedy=False, temperature=1.2,
                                            seed=seed, statistic="max")
        f = g.to_frame()
        samples.append(g)
        n_flagged.append(int(f.flagged.sum()))
        flagged, other = f[f.flagged].logprob.mean(), f[~f.flagged].logprob.mean()
        print(f"seed {seed}: {g.text!r}: {int(f.flagged.sum())} flagged; mean log-prob {f.logprob.mean():.2f} "
              f"(flagged {flagged:.2f}, others {other:.2f})")
    prediction_2 = "not distinguishable"

# %%
spike_row = spike_unseen_auroc(MODEL, "spike score (mean, window 16), max over answer")
logp_row = spike_unseen_auroc(MODEL, "−mean log p, answer")
if spike_row is None or logp_row is None:
    print("not measured in this checkout (no reports/eval_spikes.json): the prediction cannot be graded")
else:
    check_compare(prediction_2, spike_row, logp_row, "spike score against −mean log p on unseen kinds",
                  names=("spike score AUROC", "−mean log p AUROC"),
                  why="AUROC within a kind of question, averaged over the kinds each was never fitted on.")
check_answer(None if samples is None else len(samples), 3, "number of sampled continuations")
if missing(samples, n_flagged):
    no_answer("flagged tokens per continuation")
else:
    check_answer(n_flagged, [int(g.to_frame().flagged.sum()) for g in samples], "flagged tokens per continuation",
                 why=f"{sum(len(g.to_frame()) for g in samples)} tokens in all: far too few to say whether flagged "
                     "tokens are less likely; the evaluation below uses every question of the labelled set.")

# %% [markdown]
# ## What the flag is worth: the evaluation's numbers
#
# `python -m experiments.spikes` (`reports/eval_spikes.json`) generated answers to the questions of the labelled set
# (`experiments/data/factual_prompts.jsonl`; the first row says how many each model was scored on) and asked: does a flag single out the wrong answers, on kinds
# of question it never saw? Read the rows in this order:
#
# - **the shipped flag** (`generate_with_patches(...).answer_flag`, `icl-lens spikes`): the candidate — patch
#   detector or a baseline a user already has (−log p, entropy, length, a hidden-state probe, sampling agreement) —
#   with the highest AUROC on unseen kinds, by a rule fixed in code; its `p_wrong` and threshold come from the
#   calibration half of the subjects without the kind it is tested on (at most 5% of correct answers flagged there);
# - its **AUROC on unseen kinds** (within kind, averaged over kinds) beside the **−log p** baseline's;
# - its flag on the held-out subjects of unseen kinds: the share of correct and of wrong answers flagged, and the
#   largest correct-answer share in any one kind (pooled rates can hide a flag that only knows the kind);
# - the **unsupervised spike score** (max over the answer, the token marks above) beside the **answer's mean −log p**
#   as rankings *within* a kind of question (AUROC 0.5 = chance): on kinds never seen (neither needs fitting, but
#   the averaging over kinds is the same as the detectors'), and when every kind was seen in training;
# - **do token patches add anything?** The patch features added to −log p and entropy, against −log p and entropy
#   alone, on unseen kinds and leaving out answers that repeat a word of the question.

# %%
evaluation = []
for name in ("gemma-3-270m", "smollm2-135m"):
    shipped = spike_shipped(name)
    det, held = (None, None) if shipped is None else (shipped["detector"], shipped.get("unseen_kinds"))
    without = spike_without_copied_answers(name)
    interval = None if det is None else det.get("auroc_unseen_kinds_interval")
    evaluation.append({
        "model": name,
        "questions scored": spike_scored(name),
        "shipped detector": None if det is None else det["name"],
        "AUROC on unseen kinds": None if interval is None else
        f"{det['auroc_unseen_kinds']:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]",
        "−log p baseline on unseen kinds": None if det is None or det.get("baselines_auroc_unseen_kinds") is None else
        f"{det['baseline']}: {det['baselines_auroc_unseen_kinds'].get(det['baseline'], det['auroc_unseen_kinds']):.3f}",
        "correct answers flagged (unseen kinds)": None if held is None else percent_ci(held, "correct_flagged"),
        "wrong answers flagged (unseen kinds)": None if held is None else percent_ci(held, "wrong_flagged"),
        "largest correct share flagged in one kind": None if held is None else f"{held['max_correct_flagged']:.1%}",
        "spike score AUROC (unseen kinds)":
            auroc_ci(spike_unseen_auroc(name, "spike score (mean, window 16), max over answer")),
        "−mean log p AUROC (unseen kinds)": auroc_ci(spike_unseen_auroc(name, "−mean log p, answer")),
        "spike score AUROC (kinds seen)": auroc_ci(spike_auroc(name, "spike score, max over answer")),
        "log-prob AUROC (kinds seen)": auroc_ci(spike_auroc(name, "−mean log p, answer")),
        "patch adds to −log p, unseen kinds, no copied answers": None if without is None else
        f"{without['difference']:+.3f} [{without['low']:+.3f}, {without['high']:+.3f}]"})
pd.DataFrame(evaluation).set_index("model").T.fillna("not measured in this checkout")

# %% [markdown]
# ## Paper says / we measure
#
# The idea is Dherin et al.'s suggestion; the flag and its test are icl_lens's. The verdicts are EVAL.md's, read
# from `reports/eval_summary.json`; AUROCs are within a kind of question, intervals resample subjects.

# %%
claims_view(summary_claims("spikes"))

# %% [markdown]
# **Before you switch notebooks**: the last cell frees the model; then shut this kernel down (*Kernel → Shut Down
# Kernel*).

# %%
from workshop.cleanup import free

free(globals(), "model", "patches", "gen", "samples")
