"""The thought-patch fit's kinds and documented defaults (:mod:`icl_lens.thought._fit`, Algorithm 1
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
# (choose_strength over PRESERVE_STRENGTHS, PRESERVE_SLACK) on held-out train queries and held-out preserve texts,
# both embedded models × the four selection tasks (reports/eval_thought.md, "Preserve strength"). The texts are
# icl_lens.thought._preserve.preserve_texts(model): the model's own samples from BOS and the shipped few-shot prompts
# (thought_patch's preserve=None).
DEFAULT_PRESERVE_STRENGTH = 10.0
# Context distillation (icl_lens.thought._distill): Adam steps, peak learning rate, queries per step, warm-up share
# (linear warm-up, then cosine decay to 0). The rate is experiments/thought/settings.py's choose_lr over DISTILL_LRS
# on held-out train queries of both embedded models (reports/eval_thought.md, "Distillation's learning rate"); the
# earlier 1e-3 had not been selected by any rule.
DISTILL_STEPS, DISTILL_LR, DISTILL_BATCH, DISTILL_WARMUP = 100, 3e-05, 8, 0.1
