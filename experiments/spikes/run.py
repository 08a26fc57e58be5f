"""``python -m experiments.spikes``: the spike-flag evaluation (see the package docstring)."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from experiments.factual_prompts import FEW_SHOT, FactualPrompt, load_factual_prompts
from experiments.report import command, machine, write_fragment
from experiments.spikes.answers import AnswerSet, answer_all
from experiments.spikes.calibration import calibration_split, check_flag, write_thresholds
from experiments.spikes.detector import held_out_scores
from experiments.spikes.features import copies_question, feature_sets, single_scores
from experiments.spikes.sections import flags_summary, model_section, overall_sentence, verdict_sentence
from icl_lens.stats.logistic import LAMBDAS, NEWTON_MAX_FEATURES
from experiments.spikes.summary import (
    COLUMNS,
    HIDDEN,
    LOGPROB_CANDIDATES,
    PATCH,
    per_kind,
    subset,
    summarise,
    to_json,
)
from icl_lens.model.loading import load_model
from icl_lens.model.spike_thresholds import THRESHOLDS_FILE

FLAG_STATISTICS = ("mean", "median", "max", "norm")
FLAG_WINDOWS = (16, 8)
DEFAULT_FLAG = ("mean", 16)  # generate_with_patches' and the dashboard's statistic and window
RATE = 0.05
QUICK_LAMBDAS = (1e-2, 1.0)


def quick_subset(items: list[FactualPrompt], per_kind: int) -> list[FactualPrompt]:
    """The first ``per_kind`` questions of every kind, in file order."""
    seen: dict[str, int] = {}
    out = []
    for item in items:
        if seen.get(item.kind, 0) < per_kind:
            seen[item.kind] = seen.get(item.kind, 0) + 1
            out.append(item)
    return out


def evaluate_model(answer_set: AnswerSet, *, window: int, folds: int, inner_folds: int, n_boot: int,
                   seed: int, lambdas=LAMBDAS) -> dict:
    """Everything one model's section and JSON entry need."""
    start, cpu_start = time.perf_counter(), time.process_time()
    answers = list(answer_set.answers)
    wrong = np.array([not a.correct for a in answers])
    kinds = np.array([a.item.kind for a in answers])
    groups = np.array([a.item.subject for a in answers])
    sets = feature_sets(answers)
    single = single_scores(answers, window=window)
    held = held_out_scores(sets, single, wrong, groups, kinds, k=folds, inner_k=inner_folds, lambdas=lambdas,
                           seed=seed)
    n_features = {name: x.shape[1] for name, x in sets.items()}
    table, comparisons, v = summarise(held, n_features, wrong, kinds, n_boot)
    kind_names = [PATCH, HIDDEN, "log-prob and entropy", "−mean log p, answer", "spike score, max over answer"]
    by_name = {h.name: h for h in held}
    kind_rows = per_kind(by_name, kind_names, wrong, kinds)
    copies = np.array([copies_question(a) for a in answers])
    for row in kind_rows:
        sel = kinds == row["kind"]
        row["incorrect, repeating a question word"] = int((copies & wrong & sel).sum())
    no_copies = subset(by_name, [PATCH, HIDDEN, "patch + log-prob", "log-prob and entropy", v.baseline], v.baseline,
                       wrong, kinds, ~copies, "answers whose first word does not repeat a word of the question", n_boot)
    calibrate = calibration_split(groups, seed)
    checks = [check_flag(answers, calibrate, window=w, statistic=s, rate=RATE)
              for w in FLAG_WINDOWS for s in FLAG_STATISTICS]
    default_check = next(c for c in checks if (c.statistic, c.window) == DEFAULT_FLAG)
    return {"table": table, "comparisons": comparisons, "v": v, "kind_rows": kind_rows, "kind_names": kind_names,
            "no_copies": no_copies,
            "checks": checks, "default_check": default_check, "fit_seconds": time.perf_counter() - start,
            "fit_cpu_seconds": time.process_time() - cpu_start,
            "n_calibration_questions": int(calibrate.sum()),
            "lambdas": {h.name: h.lambdas for h in held if h.lambdas}}


def header(items: list[FactualPrompt], args, argv, lambdas) -> list[str]:
    kinds = sorted({i.kind for i in items})
    return [
        "## Spike flags: do token patches tell correct answers from wrong ones?", "",
        f"Command: `{command('python -m experiments.spikes', argv)}`  ",
        f"Machine: {machine()} at the start; float32, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
        f"Data: `experiments/data/factual_prompts.jsonl` (built by `python -m experiments.build_questions` from facts "
        f"written in that script), {len(items)} questions of {len(kinds)} kinds "
        f"({', '.join(f'{k} {sum(i.kind == k for i in items)}' for k in kinds)}) about "
        f"{len({i.subject for i in items})} subjects; `invented` questions ask about entities that do not exist, so "
        f"every answer to them is wrong. Each question follows a fixed {FEW_SHOT.count('Q:')}-example few-shot "
        f"preamble; greedy decoding, at most {args.max_new_tokens} new tokens, stop at newline. Correct = the answer "
        "line starts with an alias of the stored answer (case- and accent-insensitive, leading article dropped, word "
        "boundary).", "",
        "Detectors: one example per answer, since the label is per answer (averaging over the answer tokens keeps "
        "one example per question instead of weighting long answers more; features in "
        "`experiments/spikes/features.py`). L2 logistic regression (`icl_lens/stats/logistic.py`, a small "
        f"torch fit, Newton's method up to {NEWTON_MAX_FEATURES} features and L-BFGS above, checked against ∇L = 0, rather than a new "
        "scikit-learn dependency) "
        "on *patch* features (per layer, log patch norm and log correction norm at the first answer token and averaged "
        "over the answer tokens, optionally at the last prompt token `:`), on *hidden* states (the residual stream "
        "entering the middle layer, same readouts: a linear probe), on *log-prob and entropy* (4 features), and on "
        "patch + log-prob features together; λ chosen by an inner grouped "
        f"{args.inner_folds}-fold on the training folds only, from λ ∈ {{{', '.join(f'{x:g}' for x in lambdas)}}} "
        "(standardised features, mean log-loss + λ/2‖w‖²). Single scores used as they are: −log p, entropy, and "
        f"the unsupervised spike score (mean over layers of the robust z against the trailing {args.window} "
        "positions). *Kind only*: the training folds' error rate of the answer's kind.", "",
        f"Verdict rule (`experiments/spikes/summary.py`, fixed before the run): the patch detector is the regression "
        f"on `{PATCH}`; the log-probability baseline is the best, by within-kind AUROC, of "
        f"{', '.join(f'`{c}`' for c in LOGPROB_CANDIDATES)}; the detector *beats* it when the paired bootstrap 95% "
        "interval of their within-kind AUROC difference (grouped K-fold) lies above 0.", "",
        f"Flag calibration: half of the subjects (seed {args.seed}) calibrate, per statistic and window over all "
        f"layers, the threshold above which at most {RATE:.0%} of the answer tokens of correct answers score (with a "
        "one-sided 95% Wilson bound, so that new correct tokens stay under the target too); the other half measures "
        "the flag (precision and recall for incorrect answers). Thresholds go to "
        "`icl_lens/data/spike_thresholds.json`, which `generate_with_patches` and the dashboard read.", "",
        "Caveats: intervals come from resampling questions with the held-out scores fixed, so they leave out the "
        "variation of refitting; the within-kind AUROC of the kind-held-out scheme is the measure that a detector "
        "cannot earn by recognising the kind of question. *Kind only* scores below 0.5 within kind under the grouped "
        "K-fold by construction: holding out a fold lowers its kind's training error rate exactly when the fold "
        "holds that kind's wrong answers.", "",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Spike flags vs wrong answers: supervised detectors, baselines, "
                                                 "calibrated thresholds.")
    parser.add_argument("--models", nargs="+", default=["gemma-3-270m", "smollm2-135m"])
    parser.add_argument("--quick", action="store_true",
                        help="2 questions per kind, at most 4 new tokens, 3 folds, 2 inner folds, 2 values of λ, "
                             "200 bootstrap resamples (tests; the numbers mean nothing)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 8 (4 with --quick)")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--inner-folds", type=int, default=5)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: one-token steps gain little from more on shared cores)")
    parser.add_argument("--cache", default=None,
                        help="folder for the generated answers (one safetensors file per model, e.g. .cache/spikes), "
                             "reused when it matches")
    parser.add_argument("--answers-only", action="store_true",
                        help="only generate the answers into --cache (one model after another), no evaluation")
    parser.add_argument("--out", default="reports/eval_spikes.md")
    parser.add_argument("--thresholds-out", default=None,
                        help=f"where to write calibrated thresholds (default: {THRESHOLDS_FILE} for a full run, "
                             "nowhere with --quick)")
    args = parser.parse_args(argv)
    lambdas = QUICK_LAMBDAS if args.quick else LAMBDAS
    if args.max_new_tokens is None:
        args.max_new_tokens = 4 if args.quick else 8
    if args.quick:
        args.folds, args.inner_folds, args.bootstrap = 3, 2, 200
    torch.set_num_threads(max(1, args.threads))
    items = load_factual_prompts()
    if args.quick:
        items = quick_subset(items, 2)
    thresholds_out = args.thresholds_out or (None if args.quick else str(THRESHOLDS_FILE))
    head = header(items, args, argv, lambdas)
    lines: list[str] = []
    record: dict = {"command": command("python -m experiments.spikes", argv), "models": {}}
    verdicts: dict = {}
    default_flags: dict = {}
    spike_within: dict = {}
    for name in args.models:
        model = load_model(name)
        cache = None if args.cache is None else Path(args.cache) / f"{name}.safetensors"
        answer_set = answer_all(model, items, max_new_tokens=args.max_new_tokens, window=args.window, cache=cache)
        del model
        if args.answers_only:
            print(f"{name}: {len(answer_set.answers)} answers in {answer_set.seconds:.0f} s "
                  f"({answer_set.seconds / len(answer_set.answers):.2f} s per question, "
                  f"{answer_set.cpu_seconds:.0f} s CPU) -> {cache}", flush=True)
            continue
        result = evaluate_model(answer_set, window=args.window, folds=args.folds, inner_folds=args.inner_folds,
                                n_boot=args.bootstrap, seed=args.seed, lambdas=lambdas)
        verdicts[name] = (result["v"], result["no_copies"], result["comparisons"]["patch vs hidden"])
        default_flags[name] = result["default_check"]
        spike_within[name] = result["table"]["spike score, max over answer"].aurocs[COLUMNS[1]]
        lines += model_section(answer_set, table=result["table"], comparisons=result["comparisons"], v=result["v"],
                               kind_rows=result["kind_rows"], kind_names=result["kind_names"],
                               no_copies=result["no_copies"],
                               checks=result["checks"], default_check=result["default_check"], rate=RATE,
                               fit_seconds=(result["fit_seconds"], result["fit_cpu_seconds"]), folds=args.folds)
        record["models"][name] = to_json({
            "questions": len(items), "correct": sum(a.correct for a in answer_set.answers),
            "generation_seconds": answer_set.seconds, "generation_cpu_seconds": getattr(answer_set, "cpu_seconds", None),
            "fit_seconds": result["fit_seconds"], "fit_cpu_seconds": result["fit_cpu_seconds"],
            "aurocs": result["table"], "comparisons": result["comparisons"], "verdict": result["v"],
            "per_kind": result["kind_rows"], "flags": result["checks"], "lambdas": result["lambdas"],
            "without_copied_answers": result["no_copies"],
            "readme_sentence": verdict_sentence(name, result["table"], result["comparisons"], result["v"],
                                                result["no_copies"]),
        })
        if thresholds_out:
            write_thresholds(thresholds_out, name, result["checks"], rate=RATE,
                             command=record["command"], n_questions=result["n_calibration_questions"])
        summary = ["### Summary", "", overall_sentence(verdicts), "", flags_summary(default_flags, RATE, spike_within), ""]
        write_fragment(args.out, head + summary + lines)  # after each model: partial runs keep results
        record["summary"] = overall_sentence(verdicts)
        record["flags_summary"] = flags_summary(default_flags, RATE, spike_within)
        Path(args.out).with_suffix(".json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n",
                                                       encoding="utf-8")
    print("\n".join(head + summary + lines))


if __name__ == "__main__":
    main()
