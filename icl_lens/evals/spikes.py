"""Evaluation: do token-patch spike scores predict incorrect factual answers?

    python -m icl_lens.evals.spikes [--models gemma-3-270m smollm2-135m] [--limit N]

For every question of ``icl_lens/data/factual_prompts.jsonl`` (after a few-shot
preamble), the model answers greedily with :func:`icl_lens.generate_with_patches`
(one :class:`PatchSession` per model, so the shared preamble's key/value cache is
reused). The completion is labelled correct/incorrect against the answer key
(:mod:`icl_lens.evals.factual_prompts`). Each question yields features, higher =
"more likely wrong":

* spike scores (:func:`icl_lens.spike_scores_from_norms`, trailing window 16) for several
  aggregations (statistic × layer set), read at the first answer token, as the max over
  the answer tokens, and at the last prompt token (the position that predicts the answer);
* baselines: ``−log p`` and predictive entropy of the first answer token, and their
  means over the answer tokens.

It reports the AUROC of each feature for "incorrect" with percentile-bootstrap 95%
intervals, and, to avoid picking the best of many on the same data, chooses the best
spike feature on a random half of the questions and reports it on the other half.
Writes ``reports/eval_spikes.md``.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from icl_lens.core.spike_scores import spike_scores_from_norms
from icl_lens.evals.auroc import auroc, bootstrap_auroc
from icl_lens.evals.factual_prompts import FactualPrompt, completion_answer, is_correct, load_factual_prompts
from icl_lens.evals.report import command, machine, write_fragment
from icl_lens.model.generation import generate_with_patches
from icl_lens.model.incremental import PatchSession
from icl_lens.model.loading import load_model

STATISTICS = ("mean", "max", "norm")
READOUTS = ("first answer token", "max over answer", "last prompt token")


@dataclass(frozen=True)
class Answered:
    """One question's generation, reduced to what the features need."""

    item: FactualPrompt
    completion: str
    correct: bool
    prompt_length: int
    n_answer: int  # generated tokens before the first newline (at least 1)
    norms: torch.Tensor  # layer pos, whole sequence
    informative: torch.Tensor  # pos
    logprobs: np.ndarray
    entropies: np.ndarray


def answer_all(model_name: str, items: list[FactualPrompt], *, max_new_tokens: int, window: int) -> tuple[list[Answered], float]:
    model = load_model(model_name)
    session = PatchSession(model)
    out = []
    start = time.perf_counter()
    for i, item in enumerate(items):
        if i % 25 == 0:
            print(f"{model_name}: question {i}/{len(items)}, {time.perf_counter() - start:.0f} s", file=sys.stderr)
        gen = generate_with_patches(model, item.text, max_new_tokens=max_new_tokens, stop=("\n",),
                                    session=session, window=window)
        n_answer = next((k for k, tok in enumerate(gen.generated_tokens) if "\n" in tok), gen.n_new)
        out.append(Answered(
            item=item, completion=gen.text, correct=is_correct(gen.text, item.answers),
            prompt_length=gen.prompt_length, n_answer=max(1, n_answer),
            norms=gen.spikes.norms.clone(), informative=gen.spikes.informative.clone(),
            logprobs=gen.logprobs.numpy(), entropies=gen.entropies.numpy(),
        ))
    return out, time.perf_counter() - start


def layer_sets(n_layers: int) -> dict[str, range]:
    half = n_layers // 2
    return {"all": range(n_layers), f"early 0-{half - 1}": range(half), f"late {half}-{n_layers - 1}": range(half, n_layers)}


def features(answers: list[Answered], *, window: int, threshold: float) -> dict[str, np.ndarray]:
    """Feature name → one value per question (higher = more likely incorrect)."""
    n_layers = answers[0].norms.shape[0]
    feats: dict[str, list[float]] = {}
    for a in answers:
        k, p = a.n_answer, a.prompt_length
        base = {
            "baseline: −log p, first token": -a.logprobs[0],
            "baseline: entropy, first token": a.entropies[0],
            "baseline: −mean log p, answer": -a.logprobs[:k].mean(),
            "baseline: mean entropy, answer": a.entropies[:k].mean(),
        }
        for name, value in base.items():
            feats.setdefault(name, []).append(float(value))
        for statistic in STATISTICS:
            for lname, layers in layer_sets(n_layers).items():
                s = spike_scores_from_norms(a.norms, informative=a.informative, window=window, threshold=threshold,
                                            layers=layers, statistic=statistic).scores
                reads = {"first answer token": s[p], "max over answer": s[p:p + k].max(), "last prompt token": s[p - 1]}
                for rname, value in reads.items():
                    if not torch.isfinite(value):
                        raise RuntimeError(f"no spike score (not enough context) for {a.item.prompt!r}; "
                                           f"the preamble should be longer than the window")
                    feats.setdefault(f"spike: {statistic}, {lname} layers, {rname}", []).append(float(value))
    return {name: np.asarray(v) for name, v in feats.items()}


def _fmt(r) -> str:
    return "n/a (one class only)" if r is None else f"{r.auroc:.3f} [{r.low:.3f}, {r.high:.3f}]"


def _boot(x: np.ndarray, positive: np.ndarray, n_boot: int):
    """Bootstrap AUROC, or None when only one class is present."""
    return bootstrap_auroc(x, positive, n_boot=n_boot) if 0 < positive.sum() < positive.size else None


def _point(x: np.ndarray, positive: np.ndarray) -> float:
    return auroc(x, positive) if 0 < positive.sum() < positive.size else float("nan")


def model_section(model_name: str, answers: list[Answered], seconds: float, *, window: int, threshold: float,
                  n_boot: int) -> list[str]:
    wrong = np.array([not a.correct for a in answers])
    real = np.array([a.item.kind != "invented" for a in answers])
    kinds = np.array([a.item.kind for a in answers])
    feats = features(answers, window=window, threshold=threshold)
    # What knowing only the question's kind gives (in-sample error rate of its kind).
    kind_rate = {k: wrong[kinds == k].mean() for k in set(kinds)}
    feats = {"baseline: error rate of the question's kind": np.array([kind_rate[k] for k in kinds]), **feats}
    lines = [f"### {model_name}", ""]
    lines.append(f"{len(answers)} questions, {int((~wrong).sum())} answered correctly "
                 f"({100 * (~wrong).mean():.1f}%); generation + patches took {seconds:.0f} s "
                 f"({seconds / len(answers):.2f} s per question).")
    lines += ["", "| kind | n | correct |", "|---|---:|---:|"]
    for kind in sorted({a.item.kind for a in answers}):
        sel = [a for a in answers if a.item.kind == kind]
        lines.append(f"| {kind} | {len(sel)} | {sum(a.correct for a in sel)} |")
    lines += ["", "AUROC for predicting an **incorrect** completion (95% percentile-bootstrap CI, "
              f"{n_boot} resamples; higher score = predicted incorrect, so AUROC < 0.5 means the score points the "
              "other way). Columns: all questions; real questions only (invented entities left out); within kind "
              "(only pairs of questions of the same kind count, so telling kinds apart earns nothing).", ""]
    lines += ["| feature | AUROC, all | AUROC, real only | AUROC, within kind |", "|---|---|---|---|"]
    results = {}
    for name, x in feats.items():
        r_all, r_real = _boot(x, wrong, n_boot), _boot(x[real], wrong[real], n_boot)
        r_kind = bootstrap_auroc(x, wrong, strata=kinds, n_boot=n_boot) if 0 < wrong.sum() < wrong.size else None
        results[name] = (r_all, r_real, r_kind)
    key = lambda n: results[n][0].auroc if results[n][0] else 0.0  # noqa: E731
    order = sorted(results, key=lambda n: (not n.startswith("baseline"), -key(n)))
    for name in order:
        r_all, r_real, r_kind = results[name]
        lines.append(f"| {name} | {_fmt(r_all)} | {_fmt(r_real)} | {_fmt(r_kind)} |")
    # Selection on one half, evaluation on the other.
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(answers))
    half_a, half_b = np.sort(perm[: len(perm) // 2]), np.sort(perm[len(perm) // 2:])
    spike_names = [n for n in feats if n.startswith("spike")]
    base_names = [n for n in feats if n.startswith("baseline") and "kind" not in n]
    def pick(names):
        return max(names, key=lambda n: np.nan_to_num(_point(feats[n][half_a], wrong[half_a]), nan=0.0))

    best_spike, best_base = pick(spike_names), pick(base_names)
    lines += ["", f"Held-out check: chose the best spike feature and the best baseline on a random half "
              f"({len(half_a)} questions, seed 0) and evaluated them on the other half ({len(half_b)}):", ""]
    lines += ["| chosen on half A | AUROC on half A | AUROC on half B (95% CI) |", "|---|---:|---|"]
    for name in (best_spike, best_base):
        lines.append(f"| {name} | {_point(feats[name][half_a], wrong[half_a]):.3f} | "
                     f"{_fmt(_boot(feats[name][half_b], wrong[half_b], n_boot))} |")
    # Flag rates of the default score (mean over all layers) at the default threshold.
    default_first = feats["spike: mean, all layers, first answer token"]
    default_max = feats["spike: mean, all layers, max over answer"]
    lines += ["", f"Flags with the defaults (statistic mean, all layers, window {window}, threshold {threshold}): "
              f"first answer token flagged in {int((default_first[wrong] > threshold).sum())}/{int(wrong.sum())} "
              f"incorrect and {int((default_first[~wrong] > threshold).sum())}/{int((~wrong).sum())} correct answers; "
              f"some answer token flagged in {int((default_max[wrong] > threshold).sum())}/{int(wrong.sum())} "
              f"incorrect and {int((default_max[~wrong] > threshold).sum())}/{int((~wrong).sum())} correct answers."]
    lines += ["", "First 12 questions:", "", "| kind | question | completion | correct |", "|---|---|---|---|"]
    for a in answers[:12]:
        comp = completion_answer(a.completion).replace("|", "\\|")
        lines.append(f"| {a.item.kind} | {a.item.prompt.replace('|', '/')} | {comp} | {'yes' if a.correct else 'no'} |")
    best_all, best_b_all = max(spike_names, key=key), max(base_names, key=key)
    kind_key = lambda n: results[n][2].auroc if results[n][2] else 0.0  # noqa: E731
    best_kind, best_b_kind = max(spike_names, key=kind_key), max(base_names, key=kind_key)
    lines += ["", f"Best spike aggregation on all questions: **{best_all}** "
              f"(AUROC {_fmt(results[best_all][0])}); best baseline: **{best_b_all}** "
              f"(AUROC {_fmt(results[best_b_all][0])}). Within kind: best spike **{best_kind}** "
              f"({_fmt(results[best_kind][2])}), best baseline **{best_b_kind}** ({_fmt(results[best_b_kind][2])}).", ""]
    r_kind = results[best_kind][2]
    any_flag = bool((feats["spike: mean, all layers, max over answer"] > threshold).any())
    flags = (f"With the defaults (mean over all layers, threshold {threshold}) {'some' if any_flag else 'no'} "
             "answer token is flagged.")
    if r_kind is None:
        lines += [f"Reading: every answer is {'in' if wrong.all() else ''}correct, so no AUROC can be read. {flags}", ""]
        return lines
    verdict = ("includes 0.5: within a kind of question, no spike feature is distinguishable from chance here"
               if r_kind.low <= 0.5 else f"excludes 0.5, but it is the best of {len(spike_names)} spike features "
               "on the same data, so this is weak evidence of signal beyond the question kind")
    kind_only = results["baseline: error rate of the question's kind"][0]
    lines += [f"Reading: knowing only the question's kind gives AUROC {kind_only.auroc:.3f} overall; the best "
              f"within-kind spike feature's 95% CI {verdict}. {flags}", ""]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gemma-3-270m"])
    parser.add_argument("--limit", type=int, default=None, help="use only the first N questions (quick runs)")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--threshold", type=float, default=3.5)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: one-token steps gain little from more, and on "
                             "shared cores a second thread mostly waits)")
    parser.add_argument("--out", default="reports/eval_spikes.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    items = load_factual_prompts()
    if args.limit:
        rng = np.random.default_rng(0)  # a class-mixed subset for quick runs
        items = [items[i] for i in sorted(rng.permutation(len(items))[: args.limit])]
    kinds = sorted({i.kind for i in items})
    n_spike = len(STATISTICS) * len(layer_sets(2)) * len(READOUTS)
    lines = [
        "## Spike flags: do token-patch spikes predict incorrect factual answers?", "",
        f"Command: `{command('python -m icl_lens.evals.spikes', argv)}`  ",
        f"Machine: {machine()} at the start; float32, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
        f"Data: `icl_lens/data/factual_prompts.jsonl`, {len(items)} questions "
        f"({', '.join(f'{k} {sum(i.kind == k for i in items)}' for k in kinds)}); invented entities have no "
        "correct answer. Each question follows a fixed 4-example few-shot preamble; greedy decoding, at most "
        f"{args.max_new_tokens} new tokens, stop at newline. Correct = the answer line starts with an alias of the "
        "stored answer (case-insensitive, word boundary).", "",
        f"Spike score: robust z of the token-patch norm against the trailing {args.window} positions "
        "(median, 1.4826·MAD); statistic `mean`/`max` = mean/max over the layer set of per-layer z, `norm` = z of "
        "the Frobenius norm of the patch over the layer set. Read at the first answer token, as the max over answer "
        "tokens (before the newline), or at the last prompt token (`A:`, which predicts the first answer token).",
        "Baselines use the model's own next-token distribution at the same steps.", "",
        f"Caveats: {n_spike} spike features are compared, so the best of them on the same data is optimistic (the "
        "held-out check picks on one half and scores on the other); where the question kinds differ in accuracy, "
        "a score that only recognises the kind gets a high overall AUROC (the kind-error-rate baseline measures "
        "how high) — the within-kind column removes that. Directions are fixed in advance (higher = more likely wrong).", "",
    ]
    for name in args.models:
        answers, seconds = answer_all(name, items, max_new_tokens=args.max_new_tokens, window=args.window)
        lines += model_section(name, answers, seconds, window=args.window, threshold=args.threshold,
                               n_boot=args.bootstrap)
        write_fragment(args.out, lines)  # after each model: partial runs keep results
    print("\n".join(lines))


if __name__ == "__main__":
    main()
