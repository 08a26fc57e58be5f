"""The shipped wrong-answer detector of a model, read from ``icl_lens/spikes/data/spike_detectors.json``.

``python -m experiments.spikes`` measures several detectors of wrong answers on labelled
questions and ships, per model, the one that wins by a rule fixed in code before the run
(EVAL.md, "Spike flags"), with its measured within-kind AUROC and its baselines'. This
module reads that file and applies the detector to one generated answer.

Features (docs/design.md §2; Dherin et al. 2025, arXiv 2507.16003), for a sequence whose
prompt has ``P`` tokens and whose answer is the ``n ≥ 1`` generated tokens before the first
newline (positions ``P … P + n − 1``; ``P − 1`` is the last prompt token):

* readout ``answer``: per layer ``l``, ``log ‖ΔW[l, P]‖_F`` and ``log ‖attn_C − attn_0‖[l, P]``
  at the first answer token and their means over the answer tokens (``4L`` features);
* ``answer+last``: the same plus the last prompt token (``6L``);
* ``prompt``: the same two logs at each of the last :data:`PROMPT_TAIL` prompt positions
  (``8L``): known before a word of the answer exists;
* ``spike``: one feature, the maximum over the answer tokens of the unsupervised spike score
  (:func:`icl_lens.spike_scores_from_norms` with the stored statistic and window).

A logistic detector scores ``s = w · (x − μ)/σ + b`` (fitted on a calibration half of the
subjects); a ``spike`` detector scores ``s = x``. The probability of a wrong answer is
Platt-calibrated on held-out subjects, ``p_wrong = 1 / (1 + exp(−(α s + β)))``, and the answer
is flagged when ``p_wrong`` exceeds the stored threshold (at most 5% of correct answers
flagged on the calibration half, one-sided 95% bound). The file says whether the detector
beats its baselines within a kind of question; where it does not, the flag is reported
with that caveat and the dashboard shows patch norms as exploration only.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from icl_lens.spikes._thresholds import cached_json

DETECTORS_FILE = Path(__file__).resolve().parent / "data" / "spike_detectors.json"
PROMPT_TAIL = 4
READOUTS = ("answer", "answer+last", "prompt", "spike")
TINY = 1e-30  # floor before the log: a zero norm (no finite patch, docs/design.md §2) stays finite


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
class SpikeDetector:
    """One model's shipped detector (module docstring); built from the detectors file."""

    model_name: str
    name: str
    readout: str
    weights: tuple[float, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    bias: float
    platt: tuple[float, float]
    threshold: float
    auroc_within_kind: float
    baseline_name: str
    baseline_auroc_within_kind: float
    beats_baseline: bool
    statistic: str = "mean"
    window: int = 16
    question_format: str = "{question}"
    max_new_tokens: int = 8
    generator: str = ""
    held_out: dict | None = None

    def score(self, norms, correction_norms, informative, prompt_length: int, n_answer: int) -> float:
        if self.readout == "spike":
            return spike_readout(norms, informative, prompt_length, n_answer, statistic=self.statistic,
                                 window=self.window)
        x = patch_readout(norms, correction_norms, prompt_length, n_answer, self.readout)
        if x.shape[0] != len(self.weights):
            raise ValueError(f"{self.name} expects {len(self.weights)} features, got {x.shape[0]} "
                             f"(another model's detector?)")
        return float(((x - np.asarray(self.mean)) / np.asarray(self.scale)) @ np.asarray(self.weights) + self.bias)

    def p_wrong(self, score: float) -> float:
        """Platt-calibrated probability that the answer is wrong (NaN for a NaN score)."""
        a, c = self.platt
        return float(1.0 / (1.0 + np.exp(-(a * score + c)))) if np.isfinite(score) else float("nan")

    def summary(self) -> dict:
        """``name``, ``auroc_within_kind``, ``baseline_auroc_within_kind`` (and its name), ``beats_baseline``."""
        return {"name": self.name, "auroc_within_kind": self.auroc_within_kind,
                "baseline": self.baseline_name, "baseline_auroc_within_kind": self.baseline_auroc_within_kind,
                "beats_baseline": self.beats_baseline, "threshold": self.threshold}

    def describe(self) -> str:
        """One line: what the detector is and whether it beats its baselines, with the numbers."""
        verdict = "beats" if self.beats_baseline else "does not beat"
        return (f"wrong-answer detector for {self.model_name}: {self.name}, within-kind AUROC "
                f"{self.auroc_within_kind:.3f}; it {verdict} the best baseline ({self.baseline_name}, "
                f"{self.baseline_auroc_within_kind:.3f})"
                + ("" if self.beats_baseline else ", so its flag is exploration, not an error detector"))


@dataclass(frozen=True)
class AnswerFlag:
    """A detector's reading of one generated answer."""

    answer: str
    p_wrong: float
    flagged: bool
    detector: SpikeDetector

    def to_dict(self) -> dict:
        """The JSON of ``icl-lens spikes --json``."""
        p = self.p_wrong if np.isfinite(self.p_wrong) else None
        return {"answer": self.answer, "p_wrong": p, "flagged": self.flagged, "detector": self.detector.summary()}


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
    return SpikeDetector(
        model_name=model_name, name=d["name"], readout=d["readout"], weights=tuple(d.get("weights", ())),
        mean=tuple(d.get("mean", ())), scale=tuple(d.get("scale", ())), bias=float(d.get("bias", 0.0)),
        platt=(float(d["platt"][0]), float(d["platt"][1])), threshold=float(d["threshold"]),
        auroc_within_kind=float(d["auroc_within_kind"]), baseline_name=d["baseline"],
        baseline_auroc_within_kind=float(d["baseline_auroc_within_kind"]), beats_baseline=bool(d["beats_baseline"]),
        statistic=d.get("statistic", "mean"), window=int(d.get("window", 16)),
        question_format=data.get("question_format", "{question}"), max_new_tokens=int(data.get("max_new_tokens", 8)),
        generator=data.get("generated_by", ""), held_out=entry.get("held_out"),
    )


def read_answer(detector: SpikeDetector, norms, correction_norms, informative, prompt_length: int,
                generated_tokens) -> AnswerFlag:
    """Score the answer (the generated tokens before the first newline) of one sequence."""
    tokens = list(generated_tokens)
    k = answer_length(tokens)
    p = detector.p_wrong(detector.score(norms, correction_norms, informative, prompt_length, k))
    text = "".join(tokens[:k]).strip()
    return AnswerFlag(answer=text, p_wrong=p, flagged=bool(np.isfinite(p) and p > detector.threshold),
                      detector=detector)
