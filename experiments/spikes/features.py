"""Per-answer feature matrices and single scores (higher = more likely incorrect).

The label is per answer (is the answer line correct?), so every feature is per answer:
read at the first answer token ``P``, averaged over the answer tokens ``P … P + n − 1``,
and (where named) at the last prompt token ``P − 1`` (positions: :mod:`.answers`). A
per-token detector would weight long answers more and treat the tokens of one answer as
independent examples; averaging keeps one example per question.

Feature sets for the supervised detector (``L`` layers, ``d`` = d_model):

* ``patch``: ``log ‖ΔW[l, t]‖_F`` and ``log ‖attn_C − attn_0‖[l, t]`` for every layer
  (docs/design.md §2), at ``P`` and averaged over the answer: ``4L`` features; with the last
  prompt token: ``6L``. Logs because the norms are positive and spread over decades.
* ``hidden``: the residual stream entering layer ``L // 2`` at the same readouts: ``2d``
  (``3d`` with the last prompt token) — a linear probe on hidden states.
* ``log-prob``: ``−log p`` and entropy of the first answer token and their means over the
  answer (4 features).

Single scores (no fitting): ``−log p`` and entropy (first token, answer mean), the
unsupervised spike score (:func:`icl_lens.spike_scores_from_norms`, its defaults: mean
of per-layer robust z over all layers) at the first answer token and as the max over the
answer, and a string check: does the answer's first word repeat a word of the question
(1) or not (0)? Small models often answer by copying the question's subject ("On which
continent is Peru?" → "Peru"), which is almost always wrong and which the context-driven
patch features may simply be recognising; this baseline measures how far that alone goes.
"""
from __future__ import annotations

import re

import numpy as np
import torch

from experiments.factual_prompts import completion_answer, normalise
from experiments.spikes.answers import Answered
from icl_lens.core.spike_scores import spike_scores_from_norms

TINY = 1e-30  # floor before the log: a zero norm (no finite patch, docs/design.md §2) stays finite


def _log(x: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(x, TINY))


def _patch_at(a: Answered, positions: slice) -> np.ndarray:
    """[2L]: mean over ``positions`` of the per-layer log patch norms and log correction norms."""
    block = np.concatenate([_log(a.norms[:, positions]), _log(a.correction_norms[:, positions])], axis=0)
    return block.mean(axis=1)


def patch_features(a: Answered, *, last_prompt: bool) -> np.ndarray:
    p, k = a.prompt_length, a.n_answer
    parts = [_patch_at(a, slice(p, p + 1)), _patch_at(a, slice(p, p + k))]
    if last_prompt:
        parts.append(_patch_at(a, slice(p - 1, p)))
    return np.concatenate(parts)


def hidden_features(a: Answered, *, last_prompt: bool) -> np.ndarray:
    k = a.n_answer  # hidden[0] is position P - 1, hidden[j] is P - 1 + j
    parts = [a.hidden[1], a.hidden[1:1 + k].mean(0)]
    if last_prompt:
        parts.append(a.hidden[0])
    return np.concatenate(parts).astype(float)


def logprob_features(a: Answered) -> np.ndarray:
    k = a.n_answer
    return np.array([-a.logprobs[0], -a.logprobs[:k].mean(), a.entropies[0], a.entropies[:k].mean()])


def copies_question(a: Answered) -> bool:
    """The answer line's first word (after :func:`normalise`) is one of the question's words."""
    words = re.findall(r"\w+", normalise(completion_answer(a.completion)))
    return bool(words) and words[0] in set(re.findall(r"\w+", normalise(a.item.prompt)))


def feature_sets(answers: list[Answered]) -> dict[str, np.ndarray]:
    """Name → [n_answers, n_features] for the supervised detectors (module docstring)."""
    rows = {
        "patch, answer tokens": [patch_features(a, last_prompt=False) for a in answers],
        "patch, answer + last prompt token": [patch_features(a, last_prompt=True) for a in answers],
        "hidden, answer tokens": [hidden_features(a, last_prompt=False) for a in answers],
        "hidden, answer + last prompt token": [hidden_features(a, last_prompt=True) for a in answers],
        "log-prob and entropy": [logprob_features(a) for a in answers],
    }
    sets = {name: np.stack(v) for name, v in rows.items()}
    sets["patch + log-prob"] = np.concatenate([sets["patch, answer + last prompt token"], sets["log-prob and entropy"]],
                                              axis=1)
    return sets


def token_spike_scores(a: Answered, *, window: int, statistic: str) -> np.ndarray:
    """Spike score of every position of the answer's sequence (NaN without enough context)."""
    flags = spike_scores_from_norms(torch.as_tensor(a.norms), informative=torch.as_tensor(a.informative),
                                    window=window, statistic=statistic)
    return flags.scores.numpy()


def single_scores(answers: list[Answered], *, window: int) -> dict[str, np.ndarray]:
    """Name → one score per answer, used as is (no fitting)."""
    out: dict[str, list[float]] = {}
    for a in answers:
        p, k = a.prompt_length, a.n_answer
        s = token_spike_scores(a, window=window, statistic="mean")
        if not np.isfinite(s[p:p + k]).all():
            raise RuntimeError(f"no spike score (not enough context) at the answer of {a.item.prompt!r}; "
                               "the preamble should be longer than the window")
        values = {
            "−log p, first answer token": -a.logprobs[0],
            "−mean log p, answer": -a.logprobs[:k].mean(),
            "entropy, first answer token": a.entropies[0],
            "mean entropy, answer": a.entropies[:k].mean(),
            "spike score, first answer token": s[p],
            "spike score, max over answer": s[p:p + k].max(),
            "answer repeats a question word": float(copies_question(a)),
        }
        for name, value in values.items():
            out.setdefault(name, []).append(float(value))
    return {name: np.asarray(v) for name, v in out.items()}
