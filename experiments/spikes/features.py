"""Per-answer feature matrices and single scores (higher = more likely incorrect).

The label is per answer (is the answer line correct?), so every feature is per answer
(positions: :mod:`.answers`). A per-token detector would weight long answers more and treat
the tokens of one answer as independent examples; one row per question avoids both.

Feature sets for the supervised detectors (``L`` layers, ``d`` = d_model); the patch
readouts are the library's (:func:`icl_lens.spikes._detector.patch_readout`), so the
shipped detector computes exactly what was evaluated:

* answer-token features:
  ``patch, answer tokens`` (``4L``: log patch and correction norms per layer at the first
  answer token and averaged over the answer), ``patch, answer + last prompt token`` (``6L``),
  ``hidden, answer + last prompt token`` (the residual stream entering layer ``L // 2`` at the
  same three readouts, ``3d``: a linear probe), ``log-prob and entropy`` (``−log p`` and
  entropy of the first answer token and their means over the answer), ``patch + log-prob``
  and ``hidden + patch`` (the nested pairs that ask whether patches add anything to what a
  user already has), and ``bag of answer tokens`` (how often each token id occurs in the
  answer: a detector that can only learn the answer's words);
* prompt-only features, known before a word of the answer exists:
  ``patch, prompt tail`` (the two logs per layer at each of the last ``PROMPT_TAIL`` prompt
  positions, ``8L``) and ``hidden, prompt tail`` (the residual at the last prompt token and
  its mean over the tail, ``2d``).

Single scores (no fitting): ``−log p`` (first token, answer mean, and the answer's largest,
i.e. its least likely token) and entropy (first token, answer mean; the first token's are
prompt-only too: they come from the distribution after the prompt), the answer length in
tokens, **sampling disagreement** (1 − the share of the question's temperature-1 samples whose
answer agrees with the greedy one, :func:`experiments.factual_prompts.same_answer`), the
unsupervised spike score (max over the answer) for each statistic and window, and a string
check: does the answer's first word repeat a word of the question?
"""
from __future__ import annotations

import re

import numpy as np

from experiments.factual_prompts import completion_answer, normalise
from experiments.spikes.answers import PROMPT_TAIL, Answered
from icl_lens.spikes import AnswerReading, feature_block, feature_vector

ANSWER_SETS = ("patch, answer tokens", "patch, answer + last prompt token", "hidden, answer + last prompt token",
               "log-prob and entropy", "patch + log-prob", "hidden + patch", "bag of answer tokens")
PROMPT_SETS = ("patch, prompt tail", "hidden, prompt tail")
SAMPLING = "sampling disagreement"
SPIKE = "spike score (mean, window 16), max over answer"
# The library's feature blocks each shippable candidate reads, in order: the shipped detector computes the same
# vector from a generation (icl_lens.spikes.feature_vector)
LIBRARY_FEATURES = {
    "patch, answer tokens": ("patch:answer",),
    "patch, answer + last prompt token": ("patch:answer+last",),
    "patch, prompt tail": ("patch:prompt",),
    "patch + log-prob": ("patch:answer+last", "logprob"),
    "hidden + patch": ("hidden", "patch:answer+last"),
    "hidden, answer + last prompt token": ("hidden",),
    "hidden, PCA": ("hidden",),
    "log-prob and entropy": ("logprob",),
    "−mean log p, answer": ("neglogp",),
    "−min log p, answer": ("neglogp_min",),
    "−log p, first answer token": ("neglogp_first",),
    "entropy, first answer token": ("entropy_first",),
    "answer length in tokens": ("length",),
    SAMPLING: ("sampling_disagreement",),
    SPIKE: ("spike",),
}


def reading(a: Answered) -> AnswerReading:
    """What the library's detector reads of a cached answer (hidden rows from the last prompt token on)."""
    return AnswerReading(a.norms, a.correction_norms, a.informative, a.prompt_length, a.n_answer, a.logprobs,
                         a.entropies, a.hidden[PROMPT_TAIL - 1:], a.samples, a.completion)


def hidden_prompt_features(a: Answered) -> np.ndarray:
    """The residual at the last prompt token and its mean over the prompt tail (the prompt-only probe)."""
    p = a.prompt_length
    tail = np.stack([a.hidden_at(t) for t in range(p - PROMPT_TAIL, p)]).mean(0)
    return np.concatenate([a.hidden_at(p - 1), tail]).astype(float)


def bag_of_tokens(answers: list[Answered]) -> np.ndarray:
    """[n_answers, n_ids]: counts of each token id among the answer tokens; columns are the ids that
    occur in at least two answers (chosen without the labels)."""
    ids = [np.asarray(a.generated_ids[:a.n_answer], dtype=np.int64) for a in answers]
    seen: dict[int, int] = {}
    for row in ids:
        for t in set(row.tolist()):
            seen[t] = seen.get(t, 0) + 1
    vocab = sorted(t for t, c in seen.items() if c >= 2)
    col = {t: j for j, t in enumerate(vocab)}
    x = np.zeros((len(answers), max(1, len(vocab))))
    for i, row in enumerate(ids):
        for t in row.tolist():
            if t in col:
                x[i, col[t]] += 1
    return x


def copies_question(a: Answered) -> bool:
    """The answer line's first word (after :func:`normalise`) is one of the question's words."""
    words = re.findall(r"\w+", normalise(completion_answer(a.completion)))
    return bool(words) and words[0] in set(re.findall(r"\w+", normalise(a.item.prompt)))


def feature_sets(answers: list[Answered]) -> dict[str, np.ndarray]:
    """Name → [n_answers, n_features] for the supervised detectors (module docstring)."""
    readings = [reading(a) for a in answers]
    sets = {name: np.stack([feature_vector(r, LIBRARY_FEATURES[name]) for r in readings])
            for name in ("patch, answer tokens", "patch, answer + last prompt token", "patch, prompt tail",
                         "hidden, answer + last prompt token", "log-prob and entropy", "patch + log-prob",
                         "hidden + patch")}
    sets["hidden, prompt tail"] = np.stack([hidden_prompt_features(a) for a in answers])
    sets["bag of answer tokens"] = bag_of_tokens(answers)
    return sets


def spike_name(statistic: str, window: int) -> str:
    return f"spike score ({statistic}, window {window}), max over answer"


SINGLE = {"−log p, first answer token": "neglogp_first", "−mean log p, answer": "neglogp",
          "−min log p, answer": "neglogp_min", "entropy, first answer token": "entropy_first",
          "answer length in tokens": "length", SAMPLING: "sampling_disagreement"}


def single_scores(answers: list[Answered], *, statistics, windows) -> dict[str, np.ndarray]:
    """Name → one score per answer, used as is (no fitting)."""
    out: dict[str, list[float]] = {}
    for a in answers:
        r = reading(a)
        values = {name: feature_block(r, block)[0] for name, block in SINGLE.items()}
        values["mean entropy, answer"] = a.entropies[:a.n_answer].mean()
        values["answer repeats a question word"] = float(copies_question(a))
        for w in windows:
            for s in statistics:
                v = feature_block(r, "spike", statistic=s, window=w)[0]
                if not np.isfinite(v):
                    raise RuntimeError(f"no spike score (not enough context) at the answer of {a.item.prompt!r}; "
                                       "the preamble should be longer than the window")
                values[spike_name(s, w)] = v
        for name, value in values.items():
            out.setdefault(name, []).append(float(value))
    return {name: np.asarray(v) for name, v in out.items()}


def token_spike_scores(a: Answered, *, window: int, statistic: str) -> np.ndarray:
    """Spike score of every position of the answer's sequence (NaN without enough context)."""
    import torch

    from icl_lens.spikes import spike_scores_from_norms

    flags = spike_scores_from_norms(torch.as_tensor(a.norms), informative=torch.as_tensor(a.informative),
                                    window=window, statistic=statistic)
    return flags.scores.numpy()

