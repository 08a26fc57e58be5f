"""``python -m experiments.spikes``: the spike-flag evaluation (see the package docstring)."""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from experiments.factual_prompts import (
    FEW_SHOT,
    FactualPrompt,
    declines,
    is_correct_answer,
    load_factual_prompts,
    question_templates,
    stratum,
)
from experiments.report import command, machine, write_fragment
from experiments.spikes.answers import N_SAMPLES, AnswerSet, answer_all
from experiments.spikes.calibration import calibration_split, check_flag, write_thresholds
from experiments.spikes.detector import averaged_model, held_out_scores
from experiments.spikes.features import PROMPT_SETS, READOUT, copies_question, feature_sets, single_scores, spike_name
from experiments.spikes.sections import flag_sentence, model_section, model_tables, table_sentence
from experiments.spikes.summary import (
    choose_on_calibration,
    has_within,
    measure_flag,
    point_within,
    shipped_entry,
    tables,
    to_json,
)
from icl_lens.model import load_model
from icl_lens.spikes import DETECTORS_FILE, SpikeSettings
from icl_lens.spikes import THRESHOLDS_FILE
from icl_lens.stats import bootstrap_auroc_difference
from icl_lens.stats import LAMBDAS, NEWTON_MAX_FEATURES

FLAG_STATISTICS = ("mean", "median", "max", "norm")
FLAG_WINDOWS = (16, 8)
DEFAULT_FLAG = (SpikeSettings().statistic, SpikeSettings().window)  # generation's and the dashboard's flag
RATE = 0.05
QUICK_LAMBDAS = (1e-2, 1.0)
COPY_CHECK = "patch, answer + last prompt token"  # compared with −log p on answers that do not copy the question
STRATUM_NAMES = ("patch, answer + last prompt token", "patch, prompt tail", "hidden, answer + last prompt token",
                 "−mean log p, answer", "answer length in tokens")


def quick_subset(items: list[FactualPrompt], per_kind: int) -> list[FactualPrompt]:
    """The first ``per_kind`` questions of every kind, in file order."""
    seen: dict[str, int] = {}
    out = []
    for item in items:
        if seen.get(item.kind, 0) < per_kind:
            seen[item.kind] = seen.get(item.kind, 0) + 1
            out.append(item)
    return out


def relabel(answer_set: AnswerSet) -> AnswerSet:
    """Labels from the stored completions by the current rule (declining is correct for invented subjects)."""
    return replace(answer_set, answers=tuple(replace(a, correct=is_correct_answer(a.item, a.completion))
                                             for a in answer_set.answers))


def evaluate_model(answer_set: AnswerSet, *, folds: int, inner_folds: int, n_boot: int, seed: int,
                   lambdas=LAMBDAS, command_line: str = "") -> dict:
    """Everything one model's section, JSON entry and shipped detector need."""
    start, cpu_start = time.perf_counter(), time.process_time()
    answers = list(answer_set.answers)
    items = [a.item for a in answers]
    templates = question_templates(items)
    wrong = np.array([not a.correct for a in answers])
    strata = np.array([stratum(i, templates) for i in items])
    groups = np.array([i.subject for i in items])
    sets = feature_sets(answers)
    single = single_scores(answers, statistics=FLAG_STATISTICS, windows=FLAG_WINDOWS)
    held = held_out_scores(sets, single, wrong, groups, k=folds, inner_k=inner_folds, lambdas=lambdas, seed=seed)
    n_features = {name: x.shape[1] for name, x in sets.items()}
    answer_table, prompt_table = tables(held, n_features, wrong, strata, groups, n_boot)
    # a second look kept from the first evaluation: only answers whose first word does not repeat a question word
    keep = ~np.array([copies_question(a) for a in answers])
    base = answer_table.baselines["−log p"]
    no_copies = (bootstrap_auroc_difference(held[COPY_CHECK].grouped[keep], held[base].grouped[keep], wrong[keep],
                                            strata=strata[keep], groups=groups[keep], n_boot=n_boot)
                 if has_within(wrong[keep], strata[keep]) else None)
    stratum_rows = []
    for s in sorted(np.unique(strata)):
        sel = strata == s
        row = {"stratum": s, "n": int(sel.sum()), "incorrect": int(wrong[sel].sum()),
               "invented": int(sum(i.kind == "invented" for i, m in zip(items, sel) if m))}
        for name in STRATUM_NAMES:
            row[name] = point_within(held[name].grouped[sel], wrong[sel], strata[sel]) if 0 < wrong[sel].sum() < sel.sum() else None
        stratum_rows.append(row)
    # the pre-registered rule (experiments/spikes/summary.py): choose on the calibration half, measure on the other
    calibrate = calibration_split(groups, seed)
    spike_names = [spike_name(s, w) for w in FLAG_WINDOWS for s in FLAG_STATISTICS]
    winner, cal_aurocs, oof = choose_on_calibration(sets, single, spike_names, wrong, strata, groups, calibrate,
                                                    folds=folds, inner_folds=inner_folds, seed=seed, lambdas=lambdas)
    if winner in READOUT:
        fitted = averaged_model(oof[winner].models)
        all_scores = fitted.decision(sets[winner])
        readout, statistic, window = READOUT[winner], "mean", 16
    else:
        fitted, all_scores = None, single[winner]
        statistic, window = next((s, w) for w in FLAG_WINDOWS for s in FLAG_STATISTICS if spike_name(s, w) == winner)
        readout = "spike"
    measure = measure_flag(winner, oof[winner].grouped, all_scores, wrong, strata, groups, calibrate,
                           calibration_aurocs=cal_aurocs, readout=readout, statistic=statistic, window=window,
                           n_boot=n_boot)
    table = prompt_table if winner in PROMPT_SETS else answer_table
    if winner not in table.rows:  # a spike score: measured against the answer-token baselines
        table = replace(answer_table, rows={**answer_table.rows, **tables_row(winner, held, n_features, wrong, strata,
                                                                               groups, n_boot, answer_table)})
    entry = shipped_entry(measure, table, fitted, command_line)
    checks = [check_flag(answers, calibrate, window=w, statistic=s, rate=RATE)
              for w in FLAG_WINDOWS for s in FLAG_STATISTICS]
    return {"answer_table": answer_table, "prompt_table": prompt_table, "stratum_rows": stratum_rows,
            "no_copies": no_copies, "n_no_copies": int(keep.sum()),
            "measure": measure, "entry": entry, "checks": checks, "shipped_scores": all_scores,
            "default_check": next(c for c in checks if (c.statistic, c.window) == DEFAULT_FLAG),
            "fit_seconds": time.perf_counter() - start, "fit_cpu_seconds": time.process_time() - cpu_start,
            "n_calibration_questions": int(calibrate.sum()),
            "n_declined": sum(a.item.kind == "invented" and declines(a.completion) for a in answers),
            "lambdas": {n: h.lambdas for n, h in held.items() if h.lambdas}}


def compat(result: dict) -> dict:
    """The keys the workshop notebook reads (``notebooks/workshop/claims.py``): within-kind AUROCs by detector,
    the patch detector against the −log p baseline, and the token-level flags."""
    rows = {**result["answer_table"].rows, **result["prompt_table"].rows}
    aurocs = {name: {"aurocs": {"within kind, grouped": row.auroc}} for name, row in rows.items()}
    spike = spike_name(*DEFAULT_FLAG)
    if spike in rows:
        aurocs["spike score, max over answer"] = aurocs[spike]
    patch = result["answer_table"].rows["patch, answer + last prompt token"]
    return {"aurocs": aurocs, "flags": result["checks"],
            "without_copied_answers": {"n": result["n_no_copies"], "patch_vs_baseline": result["no_copies"]},
            "comparisons": {"patch vs baseline": {"within_grouped": patch.versus.get("−log p")}}}


def tables_row(name, held, n_features, wrong, strata, groups, n_boot, answer_table):
    from experiments.spikes.summary import build_table
    return build_table("", (name,), answer_table.baselines, held, n_features, wrong, strata, groups, n_boot).rows


def header(items: list[FactualPrompt], args, argv, lambdas) -> list[str]:
    kinds = sorted({i.kind for i in items})
    return [
        "### How it was measured", "",
        f"Machine (last run): {machine()} at the start; float32, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        f"Data: `experiments/data/factual_prompts.jsonl` (built by `python -m experiments.build_questions`), "
        f"{len(items)} questions of {len(kinds)} kinds "
        f"({', '.join(f'{k} {sum(i.kind == k for i in items)}' for k in kinds)}) about "
        f"{len({i.subject for i in items})} subjects. Each question follows a fixed "
        f"{FEW_SHOT.count('Q:')}-example few-shot preamble; greedy decoding, at most {args.max_new_tokens} new "
        "tokens, stop at newline. Correct = the answer line starts with an alias of the stored answer (case- and "
        "accent-insensitive, leading article dropped, word boundary); for the `invented` questions (entities that "
        "do not exist) an answer that declines (\"no such country\", \"I don't know\", \"does not exist\", …: "
        "`experiments.factual_prompts.declines`) is correct and any other is wrong. Invented questions are kept in "
        "the within-kind AUROCs by stratifying within template: the invented \"capital of X\" questions share the "
        "`capital` stratum with the real ones.", "",
        "Detectors: one example per answer. L2 logistic regression (`icl_lens/stats/_logistic.py`; Newton up to "
        f"{NEWTON_MAX_FEATURES} features, L-BFGS above; λ by an inner grouped {args.inner_folds}-fold on the training "
        f"folds from {{{', '.join(f'{x:g}' for x in lambdas)}}}) on patch features (log patch and correction norms "
        "per layer, `icl_lens/spikes/_detector.py`), on hidden states (the residual entering the middle layer: "
        "a linear probe), on log-prob and entropy, and on the bag of answer tokens; single scores as they are "
        "(−log p, entropy, answer length, the unsupervised spike score, whether the answer repeats a question "
        f"word). Held-out scores from a grouped {args.folds}-fold by subject; intervals from a cluster bootstrap "
        f"over subjects ({args.bootstrap} resamples). Rules (baselines, *beats*, the shipped detector, the flag's "
        "target): `experiments/spikes/summary.py`, fixed before the run.", "",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Spike flags vs wrong answers: detectors against baselines within "
                                                 "kind, the shipped detector, calibrated thresholds.")
    parser.add_argument("--models", nargs="+", default=["gemma-3-270m", "smollm2-135m"])
    parser.add_argument("--quick", action="store_true",
                        help="2 questions per kind, at most 4 new tokens, 3 folds, 2 inner folds, 2 values of λ, "
                             "200 bootstrap resamples (tests; the numbers mean nothing)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 8 (4 with --quick)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--inner-folds", type=int, default=5)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: one-token steps gain little from more on shared cores)")
    parser.add_argument("--cache", default=".cache/spikes",
                        help="folder for the generated answers (default .cache/spikes; '' for none): a subfolder per "
                             "model, written every 25 questions, so an interrupted run resumes and only questions "
                             "not yet answered are generated")
    parser.add_argument("--samples", type=int, default=N_SAMPLES,
                        help=f"answers sampled at temperature 1 per question (default {N_SAMPLES})")
    parser.add_argument("--answers-only", action="store_true",
                        help="only generate the answers into --cache (one model after another), no evaluation")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other models' results already in --out's JSON (their sections too), so the "
                             "models can be evaluated one run at a time")
    parser.add_argument("--out", default="reports/eval_spikes.md")
    parser.add_argument("--thresholds-out", default=None,
                        help=f"where to write calibrated thresholds (default: {THRESHOLDS_FILE} for a full run, "
                             "nowhere with --quick)")
    parser.add_argument("--detectors-out", default=None,
                        help=f"where to write the shipped detectors (default: {DETECTORS_FILE} for a full run, "
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
        items = quick_subset(items, 3)
    thresholds_out = args.thresholds_out or (None if args.quick else str(THRESHOLDS_FILE))
    detectors_out = args.detectors_out or (None if args.quick else str(DETECTORS_FILE))
    head = head_lines = header(items, args, argv, lambdas)  # noqa: F841
    cmd = command("python -m experiments.spikes", argv)
    record: dict = {"command": cmd, "models": {}}
    old = Path(args.out).with_suffix(".json")
    if args.merge and old.exists():
        kept = json.loads(old.read_text(encoding="utf-8")).get("models", {})
        record["models"] = {m: e for m, e in kept.items() if m not in args.models and "section" in e}
    summary: list[str] = [x for e in record["models"].values() for x in e["readme_sentences"]]
    lines = [x for e in record["models"].values() for x in e["section"]]
    opening = [x for e in record["models"].values() for x in e["tables"]]
    for name in args.models:
        model = load_model(name)
        cache = None if args.cache in (None, "") else Path(args.cache)
        answer_set = answer_all(model, items, max_new_tokens=args.max_new_tokens, cache=cache,
                                n_samples=args.samples, seed=args.seed)
        del model
        if args.answers_only:
            print(f"{name}: {len(answer_set.answers)} answers with {args.samples} samples each, "
                  f"{answer_set.seconds:.0f} s of generation ({answer_set.seconds / len(answer_set.answers):.2f} s "
                  f"per question, {answer_set.cpu_seconds:.0f} s CPU) -> {cache}", flush=True)
            continue
        answer_set = relabel(answer_set)
        result = evaluate_model(answer_set, folds=args.folds, inner_folds=args.inner_folds, n_boot=args.bootstrap,
                                seed=args.seed, lambdas=lambdas, command_line=cmd)
        section = model_section(answer_set, answer_table=result["answer_table"], prompt_table=result["prompt_table"],
                                stratum_rows=result["stratum_rows"], stratum_names=list(STRATUM_NAMES),
                                measure=result["measure"], checks=result["checks"], rate=RATE,
                                fit_seconds=(result["fit_seconds"], result["fit_cpu_seconds"]), folds=args.folds,
                                n_declined=result["n_declined"], no_copies=result["no_copies"],
                                n_no_copies=result["n_no_copies"])
        section[2:2] = [f"Command: `{cmd}`", ""]
        lines += section
        tables_md = model_tables(name, result["answer_table"], result["prompt_table"], args.folds)
        opening += tables_md
        sentences = [table_sentence(name, result["answer_table"], ("patch, answer tokens",
                                                                   "patch, answer + last prompt token")),
                     table_sentence(name, result["prompt_table"], ("patch, prompt tail",)),
                     flag_sentence(name, result["measure"])]
        summary += sentences
        record["models"][name] = to_json({
            "questions": len(items), "correct": sum(a.correct for a in answer_set.answers),
            "generation_seconds": answer_set.seconds, "generation_cpu_seconds": answer_set.cpu_seconds,
            "evaluation_seconds": result["fit_seconds"], "evaluation_cpu_seconds": result["fit_cpu_seconds"],
            "answer_table": result["answer_table"], "prompt_table": result["prompt_table"],
            "per_stratum": result["stratum_rows"], "shipped": result["entry"], "token_flags": result["checks"],
            "lambdas": result["lambdas"], "readme_sentences": sentences, "section": section,
            "tables": tables_md,
            "command": cmd,
            **compat(result),
        })
        if thresholds_out:
            write_thresholds(thresholds_out, name, result["checks"], rate=RATE, command=cmd,
                             n_questions=result["n_calibration_questions"])
        if detectors_out:
            write_detector(detectors_out, name, result["entry"], command=cmd, max_new_tokens=args.max_new_tokens)
        commands = [f"`{e['command']}`" for e in record["models"].values()]
        text = (["## Spike flags: do token patches tell correct answers from wrong ones?", "",
                 f"Commands: {'; '.join(commands)} (reruns from the cached answers in `.cache/spikes`).", "",
                 "### Within-kind AUROC per model", ""] + opening
                + ["### Summary", ""] + [f"- {x}" for x in summary] + [""] + head_lines + lines)
        write_fragment(args.out, text)  # after each model: partial runs keep results
        record["summary"] = summary
        Path(args.out).with_suffix(".json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n",
                                                       encoding="utf-8")
    if not args.answers_only:
        print("\n".join(["### Summary", ""] + summary))


def write_detector(path: Path | str, model_name: str, entry: dict, *, command: str, max_new_tokens: int) -> dict:
    """Add (or replace) ``model_name``'s detector in the detectors file; other models' entries stay."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data = {"about": "Per-model wrong-answer detectors, chosen by the rule in experiments/spikes/summary.py on a "
                     "calibration half of the subjects and measured on the other half (EVAL.md, 'Spike flags'). "
                     "Read by icl_lens.spikes.spike_detector.",
            "generated_by": "python -m experiments.spikes",
            "question_format": FEW_SHOT + "Q: {question}\nA:", "max_new_tokens": max_new_tokens,
            "models": data.get("models", {})}
    data["models"][model_name] = entry
    data["models"] = dict(sorted(data["models"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return data


if __name__ == "__main__":
    main()
