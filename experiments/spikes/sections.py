"""Markdown of one model's results; every sentence that reads a number is built from it (rules: :mod:`.summary`)."""
from __future__ import annotations

from experiments.factual_prompts import completion_answer
from experiments.spikes.answers import AnswerSet
from experiments.spikes.calibration import FlagCheck
from experiments.spikes.summary import (
    NESTED,
    TARGET_RATE,
    FlagRates,
    Table,
    adds_something,
    ranks_as_well,
)
from icl_lens.stats import AurocDifference, AurocResult, MeanAuroc


def fmt(r: AurocResult | MeanAuroc | AurocDifference | None) -> str:
    if r is None:
        return "n/a"
    value = r.difference if isinstance(r, AurocDifference) else r.auroc
    sign = "+" if isinstance(r, AurocDifference) else ""
    return f"{value:{sign}.3f} [{r.low:{sign}.3f}, {r.high:{sign}.3f}]"


def pct(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


def pct_ci(x: float, ci) -> str:
    return pct(x) + ("" if ci is None else f" [{pct(ci[0])}, {pct(ci[1])}]")


def signed_pct_ci(x: float, ci) -> str:
    if x != x:
        return "n/a"
    return f"{100 * x:+.1f} pts" + ("" if ci is None else f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]")


def balance_table(answer_set: AnswerSet) -> list[str]:
    kinds = sorted({a.item.kind for a in answer_set.answers})
    lines = ["| kind | questions | correct | share correct | example (completion) |", "|---|---:|---:|---:|---|"]
    for kind in kinds:
        sel = [a for a in answer_set.answers if a.item.kind == kind]
        right = sum(a.correct for a in sel)
        ex = sel[0]
        comp = completion_answer(ex.completion).replace("|", "\\|")
        lines.append(f"| {kind} | {len(sel)} | {right} | {pct(right / len(sel))} | "
                     f"{ex.item.prompt.replace('|', '/')} → {comp} ({'right' if ex.correct else 'wrong'}) |")
    return lines


def _beats(row, label: str) -> str:
    d = row.versus.get(label)
    if d is None:
        return "—"
    return f"{'**yes**' if d.low > 0 else 'no'} ({fmt(d)})"


def detector_table(table: Table) -> list[str]:
    """The within-sample table: AUROC, pooled AUROC and *beats* against each baseline."""
    labels = list(table.baselines)
    head = ("| detector | features | within-kind AUROC [cluster 95%] | pooled AUROC | "
            + " | ".join(f"beats {lab}?" for lab in labels))
    lines = [head + " |", "|---|---:|---|---:|" + "---|" * len(labels)]
    for row in table.rows.values():
        cells = " | ".join(_beats(row, lab) for lab in labels)
        pooled = "n/a" if row.pooled != row.pooled else f"{row.pooled:.3f}"
        lines.append(f"| {row.name} | {row.n_features} | {fmt(row.auroc)} | {pooled} | {cells} |")
    names = ", ".join(f"{lab} = `{name}`" for lab, name in table.baselines.items())
    return lines + ["", f"Baselines: {names}. Cells: beats? (AUROC difference detector − baseline, paired cluster "
                        "95% interval; yes when it lies above 0). Pooled AUROC mixes kinds: the kind-only prior's "
                        "within-kind AUROC is 0.5 by construction."]


def loko_detector_table(table: Table, shipped: str) -> list[str]:
    """The leave-one-kind-out table: detector × AUROC [interval] and the differences against three baselines."""
    labels = list(table.baselines)
    lines = ["| detector | features | AUROC on unseen kinds [95%] | kinds | "
             + " | ".join(f"− {lab}" for lab in labels) + " |", "|---|---:|---|---:|" + "---|" * len(labels)]
    for row in table.rows.values():
        cells = " | ".join("—" if row.versus.get(lab) is None else fmt(row.versus[lab]) for lab in labels)
        name = f"**{row.name}** (shipped)" if row.name == shipped else row.name
        kinds = row.auroc.n_strata if row.auroc is not None else 0
        lines.append(f"| {name} | {row.n_features} | {fmt(row.auroc)} | {kinds} | {cells} |")
    names = ", ".join(f"{lab} = `{name}`" for lab, name in table.baselines.items())
    return lines + ["", f"Baselines: {names}. Differences: detector − baseline, paired, subjects resampled within "
                        "kinds (95%)."]


def adds_sentence(model_name: str, adds: dict) -> str:
    """The summary row: do token patches add anything beyond −log p and the hidden state (with intervals)?"""
    parts = []
    for label, (a, b) in NESTED.items():
        d, nc = adds[label]["all answers"], adds[label]["no copied answer"]
        verdict = {True: "**yes**", False: "no", None: "not measured"}[adds_something(d)]
        parts.append(f"{label}: {verdict}, `{a}` − `{b}` = {fmt(d)} (answers that do not repeat a question word: "
                     f"{fmt(nc)})")
    return f"{model_name}: do token patches add anything on unseen kinds? " + "; ".join(parts) + "."


def flag_sentence(model_name: str, r: FlagRates) -> str:
    """The shipped flag's within-stratum verdict (and the pooled rates beside it)."""
    verdict = "meets" if r.meets_within else "does not meet"
    return (f"{model_name}: on unseen kinds the flag of `{r.detector}` flags at most {pct(r.max_correct_flagged)} of "
            f"correct answers in any stratum ({r.strata_correct_ok} of {r.strata_with_correct} strata at or below "
            f"{pct(TARGET_RATE)}); its wrong-answer rate's interval lies above {pct(TARGET_RATE)} in "
            f"{r.strata_wrong_ok} of {r.strata_with_wrong} strata; within-stratum detection (wrong − correct rate, "
            f"mean over strata with both) {signed_pct_ci(r.within_detection, r.within_detection_interval)}; pooled: "
            f"{pct_ci(r.correct_flagged, r.correct_flagged_interval)} of correct, "
            f"{pct_ci(r.wrong_flagged, r.wrong_flagged_interval)} of wrong answers flagged: it {verdict} the "
            f"within-stratum target.")


def ship_sentence(model_name: str, table: Table, shipped: str, line: str) -> str:
    row = table.rows[shipped]
    base = table.baselines["−log p"]
    d = row.versus.get("−log p")
    versus = ("it is the −log p baseline itself" if d is None else
              f"against `{base}` {fmt(d)}: it {'ranks' if ranks_as_well(table, shipped) else 'does not rank'} at "
              "least as well as −log p")
    return (f"{model_name}: the shipping rule picks `{shipped}` (AUROC on unseen kinds {fmt(row.auroc)}, "
            f"{row.auroc.n_strata if row.auroc else 0} kinds; {versus}). Its line: \"{line}\".")


def summary_sentences(model_name: str, result: dict) -> list[str]:
    line = result["entry"]["detector"]["line"]
    return [adds_sentence(model_name, result["patch_adds"]),
            ship_sentence(model_name, result["loko_table"], result["winner"], line),
            flag_sentence(model_name, result["loko_flags"][result["winner"]])]


def flag_summary_table(rows: list[FlagRates]) -> list[str]:
    lines = ["| flag | protocol | correct flagged (pooled) | wrong flagged (pooled) | precision / base rate | "
             f"largest correct rate in a stratum | strata ≤ {pct(TARGET_RATE)} correct | strata with wrong-rate "
             f"interval > {pct(TARGET_RATE)} | within-stratum detection |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.detector} | {r.protocol} | {pct_ci(r.correct_flagged, r.correct_flagged_interval)} | "
                     f"{pct_ci(r.wrong_flagged, r.wrong_flagged_interval)} | {pct(r.precision)} / {pct(r.base_rate)} | "
                     f"{pct(r.max_correct_flagged)} | {r.strata_correct_ok} of {r.strata_with_correct} | "
                     f"{r.strata_wrong_ok} of {r.strata_with_wrong} | "
                     f"{signed_pct_ci(r.within_detection, r.within_detection_interval)} |")
    return lines


def stratum_flag_table(shipped: FlagRates, kind_only: FlagRates, aurocs: dict[str, MeanAuroc | None]) -> list[str]:
    """Per stratum: the shipped flag on unseen kinds beside the kind-only flag, and per-kind AUROCs."""
    names = [n for n in aurocs]
    lines = ["| stratum | correct | wrong | shipped: correct flagged | shipped: wrong flagged | kind-only: correct / "
             "wrong flagged | " + " | ".join(f"AUROC {n}" for n in names) + " |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * len(names)]
    kind = {r.stratum: r for r in kind_only.strata}
    for r in shipped.strata:
        k = kind.get(r.stratum)
        cells = " | ".join("—" if aurocs[n] is None or r.stratum not in aurocs[n].per_stratum
                           else f"{aurocs[n].per_stratum[r.stratum]:.3f}" for n in names)
        lines.append(f"| {r.stratum} | {r.correct} | {r.wrong} | {pct_ci(r.correct_flagged, r.correct_flagged_interval)}"
                     f" | {pct_ci(r.wrong_flagged, r.wrong_flagged_interval)} | "
                     f"{'n/a' if k is None else pct(k.correct_flagged) + ' / ' + pct(k.wrong_flagged)} | {cells} |")
    return lines


def token_flag_table(checks: list[FlagCheck], rate: float) -> list[str]:
    lines = [f"| statistic | window | threshold | correct tokens flagged (target ≤ {pct(rate)}) | incorrect tokens "
             "flagged | answer precision | answer recall |", "|---|---:|---:|---:|---:|---:|---:|"]
    for c in checks:
        lines.append(f"| {c.statistic} | {c.window} | {c.threshold:.3f} | "
                     f"{pct(c.correct_token_flag_rate)} of {c.held_out_correct_tokens} | "
                     f"{pct(c.incorrect_token_flag_rate)} of {c.held_out_incorrect_tokens} | "
                     f"{pct(c.answer_precision)} | {pct(c.answer_recall)} |")
    return lines


def model_tables(name: str, result: dict) -> list[str]:
    """The leave-one-kind-out table the spike section opens with, for one model, and its summary row."""
    return ([f"#### {name}", ""] + loko_detector_table(result["loko_table"], result["winner"])
            + ["", f"**Summary.** {adds_sentence(name, result['patch_adds'])}", ""])


def within_tables(name: str, result: dict, folds: int) -> list[str]:
    """Today's within-sample tables (every kind seen in training), for one model."""
    return ([f"#### {name}", "",
             f"Answer-token features (held-out scores of a grouped {folds}-fold by subject over all answers; pairs "
             "within a template stratum; 95% cluster bootstrap over subjects):", ""]
            + detector_table(result["answer_table"])
            + ["", "Prompt-only features (read before a word of the answer exists):", ""]
            + detector_table(result["prompt_table"]) + [""])


def model_section(answer_set: AnswerSet, result: dict, *, rate: float) -> list[str]:
    answers = answer_set.answers
    n, right = len(answers), sum(a.correct for a in answers)
    name = answer_set.model_name
    held = result["held_out"]
    loko, winner = result["loko_table"], result["winner"]
    per_kind = {n_: loko.rows[n_].auroc for n_ in dict.fromkeys([winner, loko.baselines["−log p"],
                                                                 loko.baselines["hidden probe"],
                                                                 loko.baselines["sampling agreement"]])}
    lines = [f"### {name}", "",
             f"{n} questions, {right} answered correctly ({pct(right / n)}; {result['n_declined']} of them invented "
             f"questions answered by declining). Generating the answers (greedy, one patch pass with log-probs and "
             f"the layer-{answer_set.probe_layer} residual, and {answer_set.n_samples} samples at temperature "
             f"{answer_set.temperature:g}; cached) took {answer_set.seconds:.0f} s wall clock "
             f"({answer_set.seconds / n:.2f} s per question, {answer_set.cpu_seconds:.0f} s CPU); the evaluation "
             f"from the cached answers (fits, leave one kind out, calibration, bootstraps) "
             f"{result['fit_seconds']:.0f} s wall clock, {result['fit_cpu_seconds']:.0f} s CPU.", ""]
    lines += ["Label balance per kind (first question of each kind as an example):", ""]
    lines += balance_table(answer_set)
    lines += ["", f"**The shipped flag.** {ship_sentence(name, loko, winner, result['entry']['detector']['line'])} "
              f"Fitted on the calibration half ({result['n_calibration_questions']} answers) and measured on the "
              f"other ({int(held.sum())} answers), pooled and within stratum; on unseen kinds (each held-out answer "
              "flagged by the detector fitted, calibrated and thresholded without its kind) beside the baselines' "
              "flags; within sample beside the kind-only flag:", ""]
    lines += flag_summary_table([*result["loko_flags"].values(), result["within_flag"], result["kind_flag"]])
    lines += ["", "Per stratum (held-out half): the shipped flag on unseen kinds, the kind-only flag, and the "
              "within-kind AUROC of each kind scored without it:", ""]
    lines += stratum_flag_table(result["loko_flags"][winner], result["kind_flag"], per_kind)
    lines += ["", f"Token-level spike flags (`generate_with_patches`' marks; threshold: ≤ {pct(rate)} of correct "
              "answers' tokens above it on the calibration half, one-sided 95% Wilson bound; measured on the "
              "held-out half):", ""]
    lines += token_flag_table(result["checks"], rate)
    return lines + [""]


__all__ = ["fmt", "model_section", "model_tables", "within_tables", "summary_sentences", "adds_sentence",
           "flag_sentence", "ship_sentence"]
