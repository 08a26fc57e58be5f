"""Spike flags against wrong answers: do token patches tell a model's correct answers from its wrong ones?

    python -m experiments.spikes [--models gemma-3-270m smollm2-135m] [--quick] [--cache DIR]

Each question of ``experiments/data/factual_prompts.jsonl`` (built by
``python -m experiments.build_questions``) is answered once, greedily, after a few-shot
preamble, recording every token's patches (docs/design.md §2; Dherin et al. 2025, arXiv
2507.16003), log-probability, entropy and middle-layer residual (:mod:`.answers`). Then:

* a supervised detector, L2 logistic regression on per-layer patch and correction norms
  at the answer tokens (and the last prompt token), is scored out of fold, grouped by
  subject and with each kind of question held out (:mod:`.features`, :mod:`.detector`);
  against a linear probe on the residual stream, ``−log p``, entropy, the unsupervised
  spike score and the question's kind alone; AUROC with bootstrap intervals, overall and
  within kind, and paired differences (:mod:`.summary`);
* the spike-flag threshold is calibrated per model so that at most 5% of correct answers'
  tokens are flagged on one half of the subjects, its precision and recall measured on the
  other half, and the thresholds written to ``icl_lens/spikes/data/spike_thresholds.json``
  (:mod:`.calibration`), which ``generate_with_patches`` and the dashboard read.

Writes ``reports/eval_spikes.md`` and ``reports/eval_spikes.json``.
"""
