"""The shipped wrong-answer detector of a model, read from ``icl_lens/spikes/data/spike_detectors.json``.

``python -m experiments.spikes`` measures detectors of wrong answers and the baselines a user
already has (−log p, entropy, answer length, a hidden-state probe, sampling agreement) on
labelled questions, each fitted without a kind of question and scored on that kind
(leave one kind out), and ships per model the one with the highest AUROC on unseen kinds —
**whatever it is**, baselines included — by a rule fixed in code before the run (EVAL.md,
"Spike flags"). This module reads that file and applies the detector to one generated answer.

Every detector is linear in a vector of named feature blocks of the answer
(:data:`FEATURE_BLOCKS`, :func:`feature_vector`), for a sequence whose prompt has ``P`` tokens
and whose answer is the ``n ≥ 1`` generated tokens before the first newline (positions
``P … P + n − 1``; ``P − 1`` is the last prompt token):

* ``patch:answer``: per layer ``l``, ``log ‖ΔW[l, P]‖_F`` and ``log ‖attn_C − attn_0‖[l, P]``
  at the first answer token and their means over the answer tokens (``4L`` features;
  docs/design.md §2; Dherin et al. 2025, arXiv 2507.16003); ``patch:answer+last``: the same
  plus the last prompt token (``6L``); ``patch:prompt``: the two logs at each of the last
  :data:`PROMPT_TAIL` prompt positions (``8L``);
* ``logprob``: ``−log p`` and entropy of the first answer token and their means over the
  answer (4); ``hidden``: the residual stream entering layer ``L // 2`` at the first answer
  token, its mean over the answer and at the last prompt token (``3d``);
* single numbers: ``neglogp`` (the answer's mean −log p), ``neglogp_min`` (its least likely token),
  ``neglogp_first``, ``entropy_first``, ``length`` (answer tokens), ``spike`` (the largest
  unsupervised spike score over the answer, :func:`icl_lens.spike_scores_from_norms` with the
  stored statistic and window) and ``sampling_disagreement``: 1 − the share of answers
  sampled at temperature 1 whose answer line agrees with the greedy one (:func:`same_answer`).

The score is ``s = w · (x − μ)/σ + b`` (a single-number detector: ``w = 1, μ = 0, σ = 1,
b = 0``, so ``s = x``; a PCA-reduced probe is stored with its projection folded into ``w``).
Platt scaling, fitted on the calibration half's **out-of-fold** scores (the models that
scored a row never saw it), gives ``p_wrong = 1 / (1 + exp(−(α s + β)))``; the answer is
flagged when ``p_wrong`` exceeds the stored threshold (at most 5% of the calibration half's
correct answers above it, one-sided 95% bound). The file also carries the detector's AUROC
on unseen kinds, its baselines', and what token patches add beyond −log p and the hidden
state (:meth:`SpikeDetector.describe`: one line).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from icl_lens.spikes._answer_match import same_answer
from icl_lens.spikes._thresholds import cached_json

DETECTORS_FILE = Path(__file__).resolve().parent / "data" / "spike_detectors.json"
PROMPT_TAIL = 4
READOUTS = ("answer", "answer+last", "prompt", "spike")
PATCH_BLOCKS = {"patch:answer": "answer", "patch:answer+last": "answer+last", "patch:prompt": "prompt"}
SINGLE_BLOCKS = ("neglogp", "neglogp_min", "neglogp_first", "entropy_first", "length", "spike",
                 "sampling_disagreement")
FEATURE_BLOCKS = (*PATCH_BLOCKS, "logprob", "hidden", *SINGLE_BLOCKS)
BASELINES = ("neglogp", "neglogp_min", "neglogp_first", "entropy_first", "length")  # cheap: every answer has them
TINY = 1e-30  # floor before the log: a zero norm (no finite patch, docs/design.md §2) stays finite


def probe_layer(n_layers: int) -> int:
    """The layer whose incoming residual stream the ``hidden`` block reads: the middle one."""
    return n_layers // 2










def _log(x: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(np.asarray(x, dtype=float), TINY))


def answer_length(generated_tokens) -> int:
    """Generated tokens before the first one holding a newline (at least 1)."""
    tokens = list(generated_tokens)
    return max(1, next((k for k, tok in enumerate(tokens) if "\n" in tok), len(tokens)))


def patch_readout(norms, correction_norms, prompt_length: int, n_answer: int, readout: str) -> np.ndarray:
    """Feature vector of one answer from ``[layer, pos]`` patch and correction norms (module docstring)."""
    norms, corr = np.asarray(norms, dtype=float), np.asarray(correction_norms, dtype=float)
    p, k = int(prompt_length), int(n_answer)
    if norms.shape != corr.shape or norms.ndim != 2:
        raise ValueError(f"norms and correction norms must be [layer, pos] of one shape, got {norms.shape}, {corr.shape}")
    if readout not in READOUTS[:3]:
        raise ValueError(f"readout must be one of {READOUTS[:3]}, got {readout!r}")
    if not (PROMPT_TAIL <= p and k >= 1 and p + k <= norms.shape[1]):
        raise ValueError(f"need {PROMPT_TAIL} prompt tokens and an answer inside the {norms.shape[1]} positions "
                         f"(prompt {p}, answer {k})")

    def at(positions: slice) -> np.ndarray:
        return np.concatenate([_log(norms[:, positions]), _log(corr[:, positions])], axis=0).mean(axis=1)

    if readout == "prompt":
        return np.concatenate([at(slice(t, t + 1)) for t in range(p - PROMPT_TAIL, p)])
    parts = [at(slice(p, p + 1)), at(slice(p, p + k))]
    if readout == "answer+last":
        parts.append(at(slice(p - 1, p)))
    return np.concatenate(parts)


def spike_readout(norms, informative, prompt_length: int, n_answer: int, *, statistic: str, window: int) -> float:
    """Maximum over the answer tokens of the spike score (NaN without enough context)."""
    import torch

    from icl_lens.spikes._scores import spike_scores_from_norms

    flags = spike_scores_from_norms(torch.as_tensor(np.asarray(norms, dtype=float)),
                                    informative=torch.as_tensor(np.asarray(informative, dtype=bool)),
                                    window=window, statistic=statistic)
    s = flags.scores.numpy()[prompt_length:prompt_length + n_answer]
    return float(s.max()) if np.isfinite(s).all() else float("nan")


@dataclass(frozen=True)
class AnswerReading:
    """What a detector can read of one generated answer (module docstring).

    ``hidden``: the probe layer's residual at positions ``P − 1 … P + n − 1`` (``[n + 1, d]``),
    None where it was not recorded; ``samples``: completions sampled at temperature 1 after
    the same prompt (empty where none were drawn); ``completion``: the greedy completion's text.
    """

    norms: np.ndarray  # layer pos
    correction_norms: np.ndarray  # layer pos
    informative: np.ndarray  # pos
    prompt_length: int
    n_answer: int
    logprobs: np.ndarray  # per generated token
    entropies: np.ndarray  # per generated token
    hidden: np.ndarray | None = None
    samples: tuple[str, ...] = ()
    completion: str = ""


def feature_block(r: AnswerReading, name: str, *, statistic: str = "mean", window: int = 16) -> np.ndarray:
    """One named block of features of an answer (:data:`FEATURE_BLOCKS`, module docstring)."""
    k = int(r.n_answer)
    lp, ent = np.asarray(r.logprobs, dtype=float), np.asarray(r.entropies, dtype=float)
    if name in PATCH_BLOCKS:
        return patch_readout(r.norms, r.correction_norms, r.prompt_length, k, PATCH_BLOCKS[name])
    if name == "logprob":
        return np.array([-lp[0], -lp[:k].mean(), ent[0], ent[:k].mean()])
    if name == "hidden":
        if r.hidden is None:
            raise ValueError("this detector reads the hidden state; record the probe layer's residual "
                             "(generate_with_patches does when the detector needs it)")
        h = np.asarray(r.hidden, dtype=float)
        if h.shape[0] < k + 1:
            raise ValueError(f"hidden rows must cover the last prompt token and the {k} answer tokens, got {h.shape[0]}")
        return np.concatenate([h[1], h[1:k + 1].mean(0), h[0]])
    single = {
        "neglogp": lambda: -lp[:k].mean(), "neglogp_min": lambda: -lp[:k].min(),
        "neglogp_first": lambda: -lp[0], "entropy_first": lambda: ent[0], "length": lambda: float(k),
        "spike": lambda: spike_readout(r.norms, r.informative, r.prompt_length, k, statistic=statistic, window=window),
        "sampling_disagreement": lambda: sampling_disagreement(r.completion, r.samples),
    }
    if name not in single:
        raise ValueError(f"unknown feature block {name!r}; known: {', '.join(FEATURE_BLOCKS)}")
    return np.array([float(single[name]())])


def feature_vector(r: AnswerReading, blocks, *, statistic: str = "mean", window: int = 16) -> np.ndarray:
    """The blocks of :func:`feature_block`, concatenated in order."""
    return np.concatenate([feature_block(r, b, statistic=statistic, window=window) for b in blocks])


def sampling_disagreement(completion: str, samples) -> float:
    """1 − the share of ``samples`` whose answer agrees with ``completion``'s (:func:`same_answer`); NaN without
    samples."""
    samples = tuple(samples)
    if not samples:
        return float("nan")
    return 1.0 - float(np.mean([same_answer(s, completion) for s in samples]))


@dataclass(frozen=True)
class SpikeDetector:
    """One model's shipped detector (module docstring); built from the detectors file."""

    model_name: str
    name: str
    features: tuple[str, ...]
    weights: tuple[float, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    bias: float
    platt: tuple[float, float]
    threshold: float
    auroc_unseen_kinds: float | None
    baseline_name: str
    baseline_auroc_unseen_kinds: float | None
    ranks_as_well_as_neglogp: bool
    line: str
    statistic: str = "mean"
    window: int = 16
    samples: int = 5
    question_format: str = "{question}"
    max_new_tokens: int = 8
    generator: str = ""
    patch_adds: dict = field(default_factory=dict)
    held_out: dict | None = None
    unseen_kinds: dict | None = None

    @property
    def needs_hidden(self) -> bool:
        return "hidden" in self.features

    @property
    def needs_samples(self) -> bool:
        return "sampling_disagreement" in self.features

    @property
    def reads_patches(self) -> bool:
        """Whether the detector reads token patches (or only what every generation already has)."""
        return any(b in PATCH_BLOCKS or b == "spike" for b in self.features)

    def score(self, reading: AnswerReading) -> float:
        x = feature_vector(reading, self.features, statistic=self.statistic, window=self.window)
        if x.shape[0] != len(self.weights):
            raise ValueError(f"{self.name} expects {len(self.weights)} features, got {x.shape[0]} "
                             f"(another model's detector?)")
        return float(((x - np.asarray(self.mean)) / np.asarray(self.scale)) @ np.asarray(self.weights) + self.bias)

    def p_wrong(self, score: float) -> float:
        """Platt-calibrated probability that the answer is wrong (NaN for a NaN score)."""
        a, c = self.platt
        return float(1.0 / (1.0 + np.exp(-(a * score + c)))) if np.isfinite(score) else float("nan")

    def summary(self) -> dict:
        """``name``, its AUROC on unseen kinds, the −log p baseline's, the line, and what patches add."""
        return {"name": self.name, "features": list(self.features), "auroc_unseen_kinds": self.auroc_unseen_kinds,
                "baseline": self.baseline_name, "baseline_auroc_unseen_kinds": self.baseline_auroc_unseen_kinds,
                "ranks_as_well_as_neglogp": self.ranks_as_well_as_neglogp, "reads_patches": self.reads_patches,
                "patch_adds": self.patch_adds, "threshold": self.threshold, "line": self.line}

    def describe(self) -> str:
        """One line: what the flag is computed from and what token patches add, with the numbers."""
        return self.line


@dataclass(frozen=True)
class AnswerFlag:
    """A detector's reading of one generated answer, and the baselines' values for the same answer."""

    answer: str
    p_wrong: float
    flagged: bool
    detector: SpikeDetector
    baselines: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON of ``icl-lens spikes --json``."""
        def clean(x):
            return x if np.isfinite(x) else None
        return {"answer": self.answer, "p_wrong": clean(self.p_wrong), "flagged": self.flagged,
                "detector": self.detector.summary(), "baselines": {k: clean(v) for k, v in self.baselines.items()}}


def shipped_detectors(path: Path | str | None = None) -> dict:
    """The detectors file's content (default :data:`DETECTORS_FILE`; empty if there is none)."""
    return cached_json(DETECTORS_FILE if path is None else path)


def spike_detector(model_name: str, *, path: Path | str | None = None) -> SpikeDetector | None:
    """The shipped detector of ``model_name``, or None where none was measured for it."""
    data = shipped_detectors(path)
    entry = data.get("models", {}).get(model_name)
    if entry is None:
        return None
    d = entry["detector"]
    features = tuple(d["features"])
    unknown = [b for b in features if b not in FEATURE_BLOCKS]
    if unknown:
        raise ValueError(f"the detectors file names unknown feature blocks {unknown} for {model_name}")
    single = features[0] in SINGLE_BLOCKS
    return SpikeDetector(
        model_name=model_name, name=d["name"], features=features,
        weights=tuple(d.get("weights", (1.0,) if single else ())), mean=tuple(d.get("mean", (0.0,) if single else ())),
        scale=tuple(d.get("scale", (1.0,) if single else ())), bias=float(d.get("bias", 0.0)),
        platt=(float(d["platt"][0]), float(d["platt"][1])), threshold=float(d["threshold"]),
        auroc_unseen_kinds=d.get("auroc_unseen_kinds"), baseline_name=d.get("baseline", ""),
        baseline_auroc_unseen_kinds=(d.get("baselines_auroc_unseen_kinds") or {}).get(d.get("baseline", "")),
        ranks_as_well_as_neglogp=bool(d.get("ranks_as_well_as_neglogp", False)), line=d.get("line", d["name"]),
        statistic=d.get("statistic", "mean"), window=int(d.get("window", 16)), samples=int(data.get("samples", 5)),
        question_format=data.get("question_format", "{question}"), max_new_tokens=int(data.get("max_new_tokens", 8)),
        generator=data.get("generated_by", ""), patch_adds=d.get("patch_adds", {}), held_out=entry.get("held_out"),
        unseen_kinds=entry.get("unseen_kinds"),
    )


def answer_baselines(reading: AnswerReading) -> dict[str, float]:
    """The baselines' values for one answer (higher = more likely wrong): :data:`BASELINES`, and
    ``sampling_disagreement`` where samples were drawn."""
    out = {b: float(feature_block(reading, b)[0]) for b in BASELINES}
    if reading.samples:
        out["sampling_disagreement"] = sampling_disagreement(reading.completion, reading.samples)
    return out


def read_answer(detector: SpikeDetector, reading: AnswerReading, generated_tokens) -> AnswerFlag:
    """Score the answer (the generated tokens before the first newline) of one sequence."""
    tokens = list(generated_tokens)
    p = detector.p_wrong(detector.score(reading))
    text = "".join(tokens[:reading.n_answer]).strip()
    return AnswerFlag(answer=text, p_wrong=p, flagged=bool(np.isfinite(p) and p > detector.threshold),
                      detector=detector, baselines=answer_baselines(reading))
