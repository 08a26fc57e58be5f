"""The thought-patch fit's kinds and documented defaults (:mod:`icl_lens.thought.fit`, Algorithm 1
of Mazzawi, Dherin et al. 2025, arXiv 2510.08734), without importing torch: the command line
builds its ``thought-eval`` options from them before anything heavy is imported.
"""
from __future__ import annotations

#: evaluate_thought's conditions: the query alone, the full prompt, then the query alone under each edit.
CONDITIONS = ("none", "full", "patched", "distilled", "steering", "control")
EDITS = ("patched", "distilled", "steering", "control")  # conditions that edit the model: locality is measured for these

#: What each ``kind`` fits: the paper's parts (``matrix``, ``vector``) and the down-projection map.
KIND_PARTS = {
    "vector": ("vector",),
    "matrix": ("matrix",),
    "both": ("matrix", "vector"),
    "both+down": ("matrix", "vector", "down"),
}
KINDS = tuple(KIND_PARTS)
# The documented default (reports/eval_thought.md: chosen on the shipped tasks' train
# queries of both embedded models, the same for every task and model; kind, ridge and
# prefix by KL at the last query token, then the answer tokens by KL at the answer's positions).
DEFAULT_KIND = "both+down"
DEFAULT_RIDGE = 8.0
DEFAULT_QUERY_PREFIX = "\n"
DEFAULT_ANSWER_TOKENS = 8
# The locality term's strength (thought_patch(preserve_strength=...)): the preserved keys' covariance weighs
# preserve_strength × the calibration rows' in every fit. Chosen by experiments/thought/settings.py's rule
# (choose_strength over PRESERVE_STRENGTHS, PRESERVE_TOLERANCE) on held-out train queries and held-out preserve
# texts (reports/eval_thought.md, "Preserve strength"); measured so far on SmolLM2-135M's capitals only (the first
# selection task; the other three and Gemma 3 were not run for time). thought_patch applies it only to the
# preserve texts it is given; evaluate_thought gives it the model's own samples (icl_lens.thought.preserve).
DEFAULT_PRESERVE_STRENGTH = 10.0
# Context distillation (icl_lens.thought.distill): Adam steps, peak learning rate, queries per step, warm-up share
# (linear warm-up, then cosine decay to 0).
DISTILL_STEPS, DISTILL_LR, DISTILL_BATCH, DISTILL_WARMUP = 100, 1e-3, 8, 0.1
