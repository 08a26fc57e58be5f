"""Spike flags against wrong answers: does anything built on token patches tell a model's wrong answers from its
right ones on kinds of question it never saw, better than what a user already has?

    python -m experiments.spikes --answers-only [--models ...] [--cache DIR]   # generate (resumable, progress bar)
    python -m experiments.spikes [--models ...] [--cache DIR] [--jobs 2]       # evaluate from the cached answers

Each question of ``experiments/data/factual_prompts.jsonl`` (built by
``python -m experiments.build_questions``) is answered once, greedily, after a few-shot
preamble, recording every token's patches (docs/design.md §2; Dherin et al. 2025, arXiv
2507.16003), log-probability, entropy and middle-layer residual, and 5 more answers are
sampled at temperature 1 (:mod:`.answers`; cached per question, so new questions cost only
their own generation). Then (:mod:`.summary` holds the rules, fixed before the run):

* **leave one kind out** (the primary protocol, :mod:`.loko`): every candidate — patch
  detectors and the baselines a user already has (answer length; mean, minimum and first-token
  −log p; first-token entropy; a hidden-state probe, also PCA-reduced; sampling agreement; the
  spike score) — is fitted on the calibration half of the subjects without one kind and scored
  on that kind's held-out half; mean within-kind AUROC with subjects resampled within kinds,
  paired differences, and whether patch features add anything to −log p or to the hidden state;
* **the shipped detector**: the candidate with the highest AUROC on unseen kinds, whatever it
  is, fitted on the calibration half and written to ``icl_lens/spikes/data/spike_detectors.json``
  (read by ``generate_with_patches``, ``icl-lens spikes`` and the dashboard); its flag's rates
  on the held-out half, pooled and within each kind, beside the kind-only flag;
* **within sample** (every kind seen in training): grouped K-fold by subject, as before;
* the token-level spike-flag thresholds (at most 5% of correct answers' tokens flagged on the
  calibration half), written to ``icl_lens/spikes/data/spike_thresholds.json`` (:mod:`.calibration`).

Writes ``reports/eval_spikes.md`` and ``reports/eval_spikes.json``.
"""
