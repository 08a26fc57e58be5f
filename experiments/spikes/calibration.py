"""Calibrate the spike-flag threshold per model, and measure the flag on held-out answers.

Questions are split by subject into a calibration half and a held-out half (seeded). On
the calibration half, the *answer tokens of correct answers* give ``n`` spike scores. The
threshold is the ``(m+1)``-th largest of them, so ``m`` tokens score above it (a token is
flagged when its score is strictly above the threshold), with ``m`` the largest count whose
one-sided 95% Wilson upper bound on the flag rate is at most ``ρ`` (the target, 5%):

    U(m, n) = (p̂ + z²/2n + z·sqrt(p̂(1 − p̂)/n + z²/4n²)) / (1 + z²/n),   p̂ = m/n, z = 1.645.

Taking ``m = ⌊ρ n⌋`` instead would put the rate *on new tokens* above ``ρ`` about half the
time; the bound keeps it below with ~95% confidence, treating tokens as independent
(tokens of one answer are not quite, so the margin is a little smaller than stated).
With too few tokens for any ``m`` (``n`` below ~55 at 5%), ``m = 0``: the largest score.
On the held-out half the flag is measured:

* correct-token flag rate: flagged tokens of correct answers / all of them (the target
  says ≤ ρ; on held-out data it can land on either side);
* token level, for "this token belongs to an incorrect answer": precision = flagged
  tokens of incorrect answers / flagged tokens, recall = flagged tokens of incorrect
  answers / tokens of incorrect answers;
* answer level, an answer being flagged when any of its tokens is: precision = flagged
  incorrect answers / flagged answers, recall = flagged incorrect answers / incorrect answers.

Precision is NaN when nothing is flagged. Thresholds are computed for each statistic and
window listed, all layers, and written with the command that produced them to
``icl_lens/spikes/data/spike_thresholds.json``, which :mod:`icl_lens.spikes._thresholds` reads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.spikes.answers import Answered
from experiments.spikes.features import token_spike_scores
from icl_lens.stats import wilson_interval


@dataclass(frozen=True)
class FlagCheck:
    """One calibrated threshold and how its flag does on the held-out half."""

    statistic: str
    window: int
    threshold: float
    calibration_tokens: int
    calibration_flag_rate: float
    held_out_correct_tokens: int
    held_out_incorrect_tokens: int
    correct_token_flag_rate: float
    incorrect_token_flag_rate: float
    token_precision: float
    token_recall: float
    answer_precision: float
    answer_recall: float
    flagged_answers: int
    incorrect_answers: int


def calibration_split(groups: np.ndarray, seed: int = 0) -> np.ndarray:
    """True for answers in the calibration half (half of the subjects, chosen with ``seed``)."""
    names = np.unique(groups)
    chosen = set(np.random.default_rng(seed).permutation(names)[: len(names) // 2].tolist())
    return np.array([g in chosen for g in groups])


def wilson_upper(m: int, n: int) -> float:
    """One-sided 95% Wilson upper confidence bound on a rate observed as ``m`` of ``n``
    (the upper end of the two-sided 90% Wilson interval)."""
    return wilson_interval(m, n, level=0.90)[1]


def allowed_flags(n: int, rate: float) -> int:
    """The largest ``m`` with ``wilson_upper(m, n) ≤ rate`` (0 if there is none)."""
    m = int(np.floor(rate * n))
    while m > 0 and wilson_upper(m, n) > rate:
        m -= 1
    return m


def threshold_for_rate(scores: np.ndarray, rate: float) -> float:
    """The ``(m+1)``-th largest score, ``m = allowed_flags(n, rate)``: exactly ``m`` scores lie above it (no ties)."""
    scores = np.sort(np.asarray(scores, dtype=float))[::-1]
    if scores.size == 0 or not np.isfinite(scores).all():
        raise ValueError("calibration needs at least one finite score")
    if not 0 < rate < 1:
        raise ValueError(f"rate must lie in (0, 1), got {rate!r}")
    return float(scores[allowed_flags(scores.size, rate)])


def _ratio(a: int, b: int) -> float:
    return a / b if b else float("nan")


def answer_token_scores(answers: list[Answered], *, window: int, statistic: str) -> list[np.ndarray]:
    """Spike scores of each answer's answer tokens."""
    out = []
    for a in answers:
        p, k = a.prompt_length, a.n_answer
        out.append(token_spike_scores(a, window=window, statistic=statistic)[p:p + k])
    return out


def check_flag(answers: list[Answered], calibrate: np.ndarray, *, window: int, statistic: str,
               rate: float) -> FlagCheck:
    scores = answer_token_scores(answers, window=window, statistic=statistic)
    correct = np.array([a.correct for a in answers])
    cal = [s for s, c, m in zip(scores, correct, calibrate) if c and m]
    cal = np.concatenate(cal) if cal else np.array([])
    threshold = threshold_for_rate(cal, rate)
    held = [(s > threshold, c) for s, c, m in zip(scores, correct, calibrate) if not m]
    tok_correct = np.concatenate([f for f, c in held if c] or [np.array([], bool)])
    tok_wrong = np.concatenate([f for f, c in held if not c] or [np.array([], bool)])
    flagged_wrong, flagged_right = int(tok_wrong.sum()), int(tok_correct.sum())
    ans_flag = np.array([bool(f.any()) for f, _ in held])
    ans_wrong = np.array([not c for _, c in held])
    return FlagCheck(
        statistic=statistic, window=window, threshold=threshold, calibration_tokens=int(cal.size),
        calibration_flag_rate=float((cal > threshold).mean()),
        held_out_correct_tokens=int(tok_correct.size), held_out_incorrect_tokens=int(tok_wrong.size),
        correct_token_flag_rate=_ratio(flagged_right, tok_correct.size),
        incorrect_token_flag_rate=_ratio(flagged_wrong, tok_wrong.size),
        token_precision=_ratio(flagged_wrong, flagged_wrong + flagged_right),
        token_recall=_ratio(flagged_wrong, tok_wrong.size),
        answer_precision=_ratio(int((ans_flag & ans_wrong).sum()), int(ans_flag.sum())),
        answer_recall=_ratio(int((ans_flag & ans_wrong).sum()), int(ans_wrong.sum())),
        flagged_answers=int(ans_flag.sum()), incorrect_answers=int(ans_wrong.sum()),
    )


def write_thresholds(path: Path | str, model_name: str, checks: list[FlagCheck], *, rate: float, command: str,
                     n_questions: int) -> dict:
    """Add (or replace) ``model_name``'s entry in the thresholds file; other models' entries stay."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data["about"] = (f"Spike-flag thresholds per model: the score above which at most {rate:.0%} of the answer tokens "
                     "of correct answers are flagged (one-sided 95% Wilson bound, from a calibration half of the "
                     "questions; held-out precision and recall in EVAL.md). Written by the command below; read by "
                     "icl_lens.spikes.spike_threshold.")
    data = {"about": data["about"], "generated_by": "python -m experiments.spikes",
            **{k: v for k, v in data.items() if k not in ("about", "generated_by")}}
    data["target_correct_token_flag_rate"] = rate
    models = data.setdefault("models", {})
    models[model_name] = {
        "command": command,
        "calibration_questions": n_questions,
        "thresholds": [{"statistic": c.statistic, "window": c.window, "layers": "all", "threshold": c.threshold,
                        "calibration_tokens": c.calibration_tokens, "calibration_flag_rate": c.calibration_flag_rate,
                        "held_out_correct_token_flag_rate": c.correct_token_flag_rate} for c in checks],
    }
    data["models"] = dict(sorted(models.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return data

