"""``python -m experiments.spikes``: the spike-flag evaluation (see the package docstring)."""
from __future__ import annotations

import argparse
from collections import Counter
import json
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from experiments.factual_prompts import (
    FEW_SHOT,
    FactualPrompt,
    declines,
    load_factual_prompts,
    question_templates,
    stratum,
)
from experiments.report import command, machine, write_fragment
from experiments.spikes.answers import N_SAMPLES, TEMPERATURE, AnswerSet, answer_all, cached_answers
from experiments.spikes.calibration import calibration_split, check_flag, write_thresholds
from experiments.spikes.detector import HeldOut, held_out_scores
from experiments.spikes.features import LIBRARY_FEATURES, copies_question, feature_sets, single_scores
from experiments.spikes.loko import Candidate, fit_candidate, leave_one_kind_out
from experiments.spikes.sections import model_section, model_tables, summary_sentences, within_tables
from experiments.spikes.summary import (
    HIDDEN_ANSWER,
    HIDDEN_PCA,
    KIND_ONLY,
    LOKO_SINGLE,
    LOKO_SUPERVISED,
    PATCH_LAST,
    SAMPLING,
    flag_rates,
    kind_only_flag,
    kind_prior,
    loko_table,
    patch_adds,
    ship_rule,
    shipped_entry,
    tables,
    to_json,
)
from icl_lens.model import load_model
from icl_lens.spikes import DETECTORS_FILE, THRESHOLDS_FILE, SpikeSettings
from icl_lens.stats import LAMBDAS, NEWTON_MAX_FEATURES, bootstrap_auroc_difference, grouped_folds

FLAG_STATISTICS = ("mean", "median", "max", "norm")
FLAG_WINDOWS = (16, 8)
DEFAULT_FLAG = (SpikeSettings().statistic, SpikeSettings().window)  # generation's and the dashboard's flag
RATE = 0.05
QUICK_LAMBDAS = (1e-2, 1.0)
LOKO_INNER_FOLDS = 3  # inner folds by kind inside each leave-one-kind-out fit (λ, Platt and threshold)


def first_per_kind(items: list[FactualPrompt], per_kind: int) -> list[FactualPrompt]:
    """The first ``per_kind`` questions of every kind, in file order."""
    seen: dict[str, int] = {}
    out = []
    for item in items:
        if seen.get(item.kind, 0) < per_kind:
            seen[item.kind] = seen.get(item.kind, 0) + 1
            out.append(item)
    return out


def by_rounds(items: list[FactualPrompt]) -> list[FactualPrompt]:
    """``items`` in rounds: the first question of every kind (kinds in file order), then the second, …; generation in
    this order, written to the cache a round at a time, leaves a stratified set (the first N of every kind) wherever
    it stops."""
    rank: dict[str, int] = {}
    keyed = []
    for n, item in enumerate(items):
        keyed.append((rank.get(item.kind, 0), n, item))
        rank[item.kind] = rank.get(item.kind, 0) + 1
    return [item for *_, item in sorted(keyed, key=lambda x: x[:2])]


def kind_only_scores(wrong: np.ndarray, strata: np.ndarray, groups: np.ndarray, *, k: int, seed: int) -> np.ndarray:
    """The kind-only prior under the within-sample table's grouped K-fold: each answer's stratum error rate over
    the other folds."""
    folds = grouped_folds(groups, k, seed)
    out = np.empty(len(wrong))
    for f in np.unique(folds):
        test = folds == f
        out[test] = kind_prior(wrong, strata, ~test)[test]
    return out


def evaluate_model(answer_set: AnswerSet, *, folds: int, inner_folds: int, n_boot: int, seed: int,
                   lambdas=LAMBDAS, command_line: str = "", progress: bool = True,
                   kind_folds: int = LOKO_INNER_FOLDS) -> dict:
    """Everything one model's section, JSON entry and shipped detector need (rules: :mod:`.summary`)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    answers = list(answer_set.answers)
    if any(not a.samples for a in answers):
        raise ValueError("every answer needs its temperature-1 samples (regenerate the cache with --samples > 0)")
    items = [a.item for a in answers]
    templates = question_templates(items)
    wrong = np.array([not a.correct for a in answers])
    strata = np.array([stratum(i, templates) for i in items])
    groups = np.array([i.subject for i in items])
    no_copy = ~np.array([copies_question(a) for a in answers])
    sets = feature_sets(answers)
    single = single_scores(answers, statistics=FLAG_STATISTICS, windows=FLAG_WINDOWS)
    n_pca = sets[PATCH_LAST].shape[1]  # the patch detector's feature count
    n_features = {name: x.shape[1] for name, x in sets.items()} | {HIDDEN_PCA: n_pca}

    phases: dict[str, float] = {}
    tick = [time.process_time()]

    def phase(name: str) -> None:  # CPU seconds of each step, reported beside the wall clock
        now = time.process_time()
        phases[name], tick[0] = now - tick[0], now

    phase("features")
    # within sample: grouped K-fold by subject over all answers (every kind seen in training)
    held = held_out_scores(sets, single, wrong, groups, k=folds, inner_k=inner_folds, lambdas=lambdas, seed=seed,
                           pca={HIDDEN_PCA: (HIDDEN_ANSWER, n_pca)})
    held[KIND_ONLY] = HeldOut(KIND_ONLY, "kind prior", kind_only_scores(wrong, strata, groups, k=folds, seed=seed))
    phase("within-sample fits")
    answer_table, prompt_table = tables(held, n_features, wrong, strata, groups, n_boot)
    phase("within-sample bootstraps")

    # leave one kind out (the primary protocol) on the held-out half of the subjects
    calibrate = calibration_split(groups, seed)
    out_half = ~calibrate
    candidates = ([Candidate(n, sets[n], True) for n in LOKO_SUPERVISED if n != HIDDEN_PCA]
                  + [Candidate(HIDDEN_PCA, sets[HIDDEN_ANSWER], True, pca=n_pca)]
                  + [Candidate(n, single[n], False) for n in LOKO_SINGLE])
    x_of = {c.name: c for c in candidates}
    families = {c.name: "logistic regression" if c.supervised else "single score" for c in candidates}
    kinds = leave_one_kind_out(candidates, wrong, strata, calibrate, inner_k=kind_folds, lambdas=lambdas, seed=seed,
                               rate=RATE, progress=progress)
    phase("leave-one-kind-out fits")
    loko = loko_table(kinds.scores, n_features | {n: 1 for n in LOKO_SINGLE}, families, wrong, strata, groups,
                      out_half, n_boot)
    adds = patch_adds(kinds.scores, wrong, strata, groups, out_half, no_copy, n_boot)
    phase("leave-one-kind-out bootstraps")

    # the shipping rule, then the winner fitted on the whole calibration half
    winner = ship_rule(loko)
    c = x_of[winner]
    fitted = fit_candidate(winner, c.x, calibrate, wrong, strata, supervised=c.supervised, inner_k=kind_folds,
                           lambdas=lambdas, seed=seed, pca=c.pca, rate=RATE)
    shipped_scores = fitted.decision(c.x)
    shipped_flags = fitted.p_wrong(shipped_scores) > fitted.threshold

    def rates(name, protocol, flags):
        return flag_rates(name, protocol, flags[out_half], wrong[out_half], strata[out_half], groups[out_half],
                          n_boot=n_boot, rate=RATE, seed=seed)

    loko_flags = {n: rates(n, "leave one kind out", kinds.flagged[n]) for n in
                  dict.fromkeys([winner, loko.baselines["−log p"], HIDDEN_ANSWER, SAMPLING, PATCH_LAST])}
    within_flag = rates(winner, "within sample", shipped_flags)
    kind_flag = rates(KIND_ONLY, "within sample", kind_only_flag(wrong, strata, calibrate, RATE))
    entry = shipped_entry(fitted, LIBRARY_FEATURES[winner], loko, answer_table, adds, loko_flags[winner],
                          within_flag, command_line)
    phase("shipped detector and flags")
    checks = [check_flag(answers, calibrate, window=w, statistic=s, rate=RATE)
              for w in FLAG_WINDOWS for s in FLAG_STATISTICS]
    phase("token flags")
    return {"cpu_seconds_by_step": phases, "answer_table": answer_table, "prompt_table": prompt_table, "loko_table": loko, "patch_adds": adds,
            "kinds": kinds, "winner": winner, "fitted": fitted, "shipped_scores": shipped_scores,
            "loko_flags": loko_flags, "within_flag": within_flag, "kind_flag": kind_flag, "entry": entry,
            "checks": checks, "default_check": next(c for c in checks if (c.statistic, c.window) == DEFAULT_FLAG),
            "strata": strata, "wrong": wrong, "held_out": out_half, "n_no_copies": int((no_copy & out_half).sum()),
            "fit_seconds": time.perf_counter() - start, "fit_cpu_seconds": time.process_time() - cpu_start,
            "n_calibration_questions": int(calibrate.sum()),
            "n_declined": sum(a.item.kind == "invented" and declines(a.completion) for a in answers),
            "lambdas": {n: h.lambdas for n, h in held.items() if h.lambdas} | {
                f"{n}, leave one kind out": tuple(v.values()) for n, v in kinds.lambdas.items() if v}}


def compat(result: dict) -> dict:
    """The keys the workshop notebook reads (``notebooks/workshop/claims.py``): within-sample AUROCs by detector,
    the nested patch comparison on answers that do not copy the question, and the token-level flags."""
    rows = {**result["answer_table"].rows, **result["prompt_table"].rows}
    aurocs = {name: {"aurocs": {"within kind, grouped": row.auroc}} for name, row in rows.items()}
    aurocs["spike score, max over answer"] = aurocs["spike score (mean, window 16), max over answer"]
    return {"aurocs": aurocs, "flags": result["checks"],
            "without_copied_answers": {"n": result["n_no_copies"],
                                       "patch_vs_baseline": result["patch_adds"]["beyond −log p"]["no copied answer"]}}


def header(items: list[FactualPrompt], args, argv, lambdas) -> list[str]:
    kinds = sorted({i.kind for i in items})
    return [
        "### How it was measured", "",
        f"Machine (last run): {machine()} at the start; float32, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        f"Data: `experiments/data/factual_prompts.jsonl` (built by `python -m experiments.build_questions`), "
        f"{len(items)} questions of {len(kinds)} kinds "
        f"({', '.join(f'{k} {sum(i.kind == k for i in items)}' for k in kinds)}) about "
        f"{len({i.subject for i in items})} subjects. "
        + ("**Not every question was scored** (`--answered-only`): each model is scored on the questions it had "
           "answered when its generation stopped (the machine's shared CPUs did not allow all of them before the "
           "deadline). Generation ran in file order, then in rounds (`--per-kind`: the r-th question of every kind "
           "not yet complete in round r, stopped after a complete round), so a model's set is the first N "
           "questions of every kind with N per kind fixed by that rule and the clock, never by a result; the counts "
           "per kind are in each model's label-balance table and the JSON's `questions_per_kind`. "
           if args.answered_only else "")
        + f"Each question follows a fixed "
        f"{FEW_SHOT.count('Q:')}-example few-shot preamble; greedy decoding, at most {args.max_new_tokens} new "
        "tokens, stop at newline. Correct = the answer line starts with an alias of the stored answer (case- and "
        "accent-insensitive, leading article dropped, word boundary); for the `invented` questions (entities that "
        "do not exist) an answer that declines (\"no such country\", \"I don't know\", \"does not exist\", …: "
        "`experiments.factual_prompts.declines`) is correct and any other is wrong. Invented questions are kept in "
        "the within-kind AUROCs by stratifying within template: the invented \"capital of X\" questions share the "
        "`capital` stratum with the real ones.", "",
        "Detectors: one example per answer. L2 logistic regression (`icl_lens/stats/_logistic.py`; Newton up to "
        f"{NEWTON_MAX_FEATURES} features, L-BFGS above; λ from {{{', '.join(f'{x:g}' for x in lambdas)}}}) on patch "
        "features (log patch and correction norms per layer, `experiments/spikes/features.py` through the library's "
        "readouts), on hidden states (the residual entering the middle layer: a linear probe, also reduced by PCA "
        "on the rows it is fitted on to the feature count of `patch, answer + last prompt token`), on log-prob and "
        "entropy, on their unions with the patch features, and on the bag of answer tokens; single scores as they "
        "are (mean, minimum and first-token −log p, entropy, answer length, sampling disagreement, the "
        "unsupervised spike score, whether the answer repeats a question word). Sampling agreement: "
        f"{args.samples} answers sampled at temperature 1 per question; the share whose answer line agrees with "
        "the greedy one after the correctness rule's normalisation (`experiments.factual_prompts.same_answer`). "
        "Leave one kind out: subjects split into a calibration and a held-out half (seeded); per kind, fits on "
        f"the calibration half without it, λ by an inner {args.kind_folds}-fold grouped by kind and chosen by "
        "within-kind AUROC; the average of the fold models scores the kind's held-out half; Platt scaling and "
        "the flag threshold (≤ 5% of correct answers, one-sided 95% Wilson bound) from the same out-of-fold "
        f"scores. Within sample: held-out scores from a grouped {args.folds}-fold by subject over all answers, λ "
        f"by an inner grouped {args.inner_folds}-fold by subject. Intervals: cluster bootstrap over subjects "
        f"({args.bootstrap} resamples; within kinds for the leave-one-kind-out means). Rules (baselines, the "
        "shipping rule, the verdicts): `experiments/spikes/summary.py`, fixed before the run.", "",
    ]


def answer_and_evaluate(job) -> tuple[AnswerSet, dict | None]:
    """One model's answers (from the cache where there) and, unless ``--answers-only``, its evaluation."""
    name, items, args, lambdas, cmd = job
    torch.set_num_threads(max(1, args.threads))
    model = load_model(name)
    cache = None if args.cache in (None, "") else Path(args.cache)
    if args.answered_only:
        done = cached_answers(cache / name, name, args.max_new_tokens, args.samples, TEMPERATURE)
        items = [item for item in items if item.text in done]
        if not items:
            raise SystemExit(f"{name}: no answered questions in {cache / name} (--answered-only)")
    answer_set = answer_all(model, items, max_new_tokens=args.max_new_tokens, cache=cache, n_samples=args.samples,
                            seed=args.seed, chunk=args.chunk)
    del model
    if args.answers_only:
        print(f"{name}: {len(answer_set.answers)} answers with {args.samples} samples each, "
              f"{answer_set.seconds:.0f} s of generation ({answer_set.seconds / len(answer_set.answers):.2f} s "
              f"per question, {answer_set.cpu_seconds:.0f} s CPU) -> {cache}", flush=True)
        return answer_set, None
    return answer_set, evaluate_model(answer_set, folds=args.folds, inner_folds=args.inner_folds, n_boot=args.bootstrap,
                                      seed=args.seed, lambdas=lambdas, command_line=cmd, kind_folds=args.kind_folds)


def finished(jobs: list, workers: int):
    """``(model name, (answers, result))`` of every job as it finishes: one model after another, or with
    ``workers > 1`` one process per model, each yielded as soon as it is done (a slow model does not hold back the
    others' reports)."""
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(answer_and_evaluate, job): job[0] for job in jobs}
            for future in as_completed(futures):
                yield futures[future], future.result()
    else:
        for job in jobs:
            yield job[0], answer_and_evaluate(job)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Spike flags vs wrong answers: detectors against baselines within "
                                                 "kind, the shipped detector, calibrated thresholds.")
    parser.add_argument("--models", nargs="+", default=["gemma-3-270m", "smollm2-135m"])
    parser.add_argument("--quick", action="store_true",
                        help="2 questions per kind, at most 4 new tokens, 3 folds, 2 inner folds, 2 values of λ, "
                             "200 bootstrap resamples (tests; the numbers mean nothing)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 8 (4 with --quick)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--inner-folds", type=int, default=5, help="inner folds by subject (within-sample table)")
    parser.add_argument("--kind-folds", type=int, default=LOKO_INNER_FOLDS,
                        help=f"inner folds by kind inside each leave-one-kind-out fit (default {LOKO_INNER_FOLDS})")
    parser.add_argument("--jobs", type=int, default=1,
                        help="models evaluated at once, one process each (default 1); generation stays sequential")
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
    parser.add_argument("--per-kind", type=int, default=None, metavar="N",
                        help="only the first N questions of every kind (file order); with --answers-only they are "
                             "answered in rounds (the first of every kind, then the second, …), so a generation "
                             "stopped early leaves the first M of every kind")
    parser.add_argument("--chunk", type=int, default=25,
                        help="answers written to the cache every CHUNK questions (default 25; the number of kinds "
                             "with --per-kind writes one round at a time)")
    parser.add_argument("--answered-only", action="store_true",
                        help="evaluate only the questions already answered in --cache (per model; the report and "
                             "JSON say how many per kind), for a model whose generation could not finish")
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="with --answers-only: answer only every N-th question starting at I (0-based), so N "
                             "processes can share one model's generation; the cache keys answers by question")
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
        args.folds, args.inner_folds, args.kind_folds, args.bootstrap = 3, 2, 2, 200
    torch.set_num_threads(max(1, args.threads))
    items = load_factual_prompts()
    if args.quick:
        items = first_per_kind(items, 3)
    if args.per_kind is not None:
        if args.per_kind < 1:
            parser.error(f"--per-kind must be at least 1, got {args.per_kind}")
        items = first_per_kind(items, args.per_kind)
        if args.answers_only:
            items = by_rounds(items)
    if args.chunk < 1:
        parser.error(f"--chunk must be at least 1, got {args.chunk}")
    if args.answered_only and (args.answers_only or args.cache in (None, "")):
        parser.error("--answered-only evaluates cached answers: it needs --cache and no --answers-only")
    if args.shard is not None:
        try:
            index, count = (int(x) for x in args.shard.split("/"))
        except ValueError:
            parser.error(f"--shard must be I/N with integers, got {args.shard!r}")
        if not (args.answers_only and 0 <= index < count):
            parser.error("--shard I/N needs --answers-only and 0 <= I < N")
        items = items[index::count]
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
    within = [x for e in record["models"].values() for x in e.get("within_tables", [])]
    jobs = [(name, items, args, lambdas, cmd) for name in args.models]
    for name, (answer_set, result) in finished(jobs, args.jobs):  # the report is written as each model finishes
        if result is None:
            continue
        section = model_section(answer_set, result, rate=RATE)
        section[2:2] = [f"Command: `{cmd}`", ""]
        lines += section
        tables_md = model_tables(name, result)
        opening += tables_md
        within_md = within_tables(name, result, args.folds)
        within += within_md
        sentences = summary_sentences(name, result)
        summary += sentences
        record["models"][name] = to_json({
            "questions": len(answer_set.answers), "correct": sum(a.correct for a in answer_set.answers),
            "kinds": len({a.item.kind for a in answer_set.answers}),
            "questions_per_kind": dict(Counter(a.item.kind for a in answer_set.answers)),
            "answered_only": args.answered_only, "strata": sorted(set(result["strata"].tolist())),
            "generation_seconds": answer_set.seconds, "generation_cpu_seconds": answer_set.cpu_seconds,
            "evaluation_seconds": result["fit_seconds"], "evaluation_cpu_seconds": result["fit_cpu_seconds"],
            "evaluation_cpu_seconds_by_step": result["cpu_seconds_by_step"],
            "loko_table": result["loko_table"], "patch_adds": result["patch_adds"],
            "shipping_rule_winner": result["winner"],
            "flags_unseen_kinds": result["loko_flags"], "flag_within_sample": result["within_flag"],
            "kind_only_flag": result["kind_flag"],
            "answer_table": result["answer_table"], "prompt_table": result["prompt_table"],
            "shipped": result["entry"], "token_flags": result["checks"],
            "lambdas": result["lambdas"], "readme_sentences": sentences, "section": section,
            "tables": tables_md, "within_tables": within_md,
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
                 f"Commands: {'; '.join(commands)} (reruns from the cached answers in the `--cache` folder).", "",
                 "### On kinds of question the detector never saw (leave one kind out)", "",
                 "Each kind of question in turn is left out: every detector and baseline is fitted, calibrated and "
                 "thresholded on the calibration half of the subjects without that kind and scored on the kind's "
                 "held-out half. AUROC for predicting an **incorrect** answer: the mean over kinds of the within-kind "
                 "AUROC (kinds whose held-out half holds both correct and wrong answers), 95% bootstrap resampling "
                 "subjects within kinds. The shipped detector is the row with the highest AUROC here, whatever it "
                 "is (`experiments/spikes/summary.py`, fixed before the run).", ""] + opening
                + ["### Summary", ""] + [f"- {x}" for x in summary] + [""]
                + ["### Within sample (every kind seen in training)", ""] + within + head_lines + lines)
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
    data = {"about": "Per-model wrong-answer detectors: the candidate (patch detectors and baselines alike) with the "
                     "highest AUROC on kinds of question it never saw, by the rule in experiments/spikes/summary.py; "
                     "fitted on a calibration half of the subjects, measured on the other half (EVAL.md, 'Spike "
                     "flags'). Read by icl_lens.spikes.spike_detector.",
            "generated_by": "python -m experiments.spikes",
            "question_format": FEW_SHOT + "Q: {question}\nA:", "max_new_tokens": max_new_tokens,
            "samples": N_SAMPLES, "temperature": TEMPERATURE,
            "models": data.get("models", {})}
    data["models"][model_name] = entry
    data["models"] = dict(sorted(data["models"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return data


if __name__ == "__main__":
    main()
