"""Markdown of one model's results; every sentence that reads a number is built from it."""
from __future__ import annotations

from experiments.factual_prompts import completion_answer
from experiments.spikes.answers import AnswerSet
from experiments.spikes.calibration import FlagCheck
from experiments.spikes.summary import COLUMNS, HIDDEN, PATCH, Comparison, DetectorAurocs, Subset, Verdict
from icl_lens.stats.auroc import AurocDifference, AurocResult


def fmt(r: AurocResult | AurocDifference | None) -> str:
    if r is None:
        return "n/a"
    value = r.auroc if isinstance(r, AurocResult) else r.difference
    sign = "+" if isinstance(r, AurocDifference) else ""
    return f"{value:{sign}.3f} [{r.low:{sign}.3f}, {r.high:{sign}.3f}]"


def pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


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


def auroc_table(table: dict[str, DetectorAurocs]) -> list[str]:
    lines = ["| detector | kind of score | features | " + " | ".join(f"AUROC, {c}" for c in COLUMNS) + " |",
             "|---|---|---:|" + "---|" * len(COLUMNS)]
    for row in table.values():
        cells = " | ".join(fmt(row.aurocs[c]) for c in COLUMNS)
        lines.append(f"| {row.name} | {row.family} | {row.n_features} | {cells} |")
    return lines


def comparison_table(comparisons: dict[str, Comparison]) -> list[str]:
    lines = ["| A − B | AUROC difference, within kind, grouped | within kind, kind held out | all, grouped |",
             "|---|---|---|---|"]
    for c in comparisons.values():
        lines.append(f"| {c.a} − {c.b} | {fmt(c.within_grouped)} | {fmt(c.within_held_out)} | {fmt(c.all_grouped)} |")
    return lines


def per_kind_table(rows: list[dict], names: list[str]) -> list[str]:
    lines = ["| kind | n | incorrect | of which repeat a question word | " + " | ".join(names) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(names)]
    for row in rows:
        cells = " | ".join("—" if row[n] is None else f"{row[n]:.3f}" for n in names)
        lines.append(f"| {row['kind']} | {row['n']} | {row['incorrect']} | "
                     f"{row['incorrect, repeating a question word']} | {cells} |")
    return lines


def subset_table(sub: Subset) -> list[str]:
    lines = [f"Only {sub.description} ({sub.n} answers, {sub.incorrect} incorrect), same held-out scores:", "",
             f"| detector | AUROC, {COLUMNS[1]} | AUROC, {COLUMNS[2]} |", "|---|---|---|"]
    for name, row in sub.aurocs.items():
        lines.append(f"| {name} | {fmt(row[COLUMNS[1]])} | {fmt(row[COLUMNS[2]])} |")
    lines += ["", f"Patch detector − log-probability baseline on this subset, within kind, grouped: "
              f"{fmt(sub.patch_vs_baseline)}."]
    return lines


def flag_table(checks: list[FlagCheck], rate: float) -> list[str]:
    lines = [f"| statistic | window | threshold | calibration tokens (flagged) | correct tokens flagged (target ≤ "
             f"{pct(rate)}) | incorrect tokens flagged | token precision | token recall | answer precision | "
             "answer recall |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in checks:
        lines.append(f"| {c.statistic} | {c.window} | {c.threshold:.3f} | {c.calibration_tokens} "
                     f"({pct(c.calibration_flag_rate)}) | "
                     f"{pct(c.correct_token_flag_rate)} of {c.held_out_correct_tokens} | "
                     f"{pct(c.incorrect_token_flag_rate)} of {c.held_out_incorrect_tokens} | {pct(c.token_precision)} | "
                     f"{pct(c.token_recall)} | {pct(c.answer_precision)} | "
                     f"{pct(c.answer_recall)} ({c.flagged_answers} flagged, {c.incorrect_answers} incorrect) |")
    return lines


def verdict_sentence(model_name: str, table: dict[str, DetectorAurocs], comparisons: dict[str, Comparison],
                     v: Verdict, no_copies: Subset) -> str:
    """The README's sentence for this model (rule: :mod:`.summary`)."""
    within = COLUMNS[1]
    patch, base = table[PATCH].aurocs[within], table[v.baseline].aurocs[within]
    c = comparisons["patch vs baseline"].within_grouped
    if patch is None or base is None or c is None:
        return f"{model_name}: no question kind has both correct and incorrect answers, so nothing can be compared."
    outcome = ("patch features beat the log-probability baseline" if v.patch_beats_baseline
               else "patch features do not beat the log-probability baseline")
    adds = comparisons["patch + log-prob vs log-prob"].within_grouped
    return (f"{model_name}: within a kind of question, the patch-feature detector reaches AUROC {fmt(patch)} and the "
            f"log-probability baseline ({v.baseline}) {fmt(base)}, a difference of {fmt(c)}: {outcome}; added to "
            f"log-probabilities they {'do' if v.patch_adds_to_logprob else 'do not'} improve on them "
            f"(difference {fmt(adds)}); leaving out answers that repeat a word of the question, the difference is "
            f"{fmt(no_copies.patch_vs_baseline)}.")


def hidden_sentence(table: dict[str, DetectorAurocs], comparisons: dict[str, Comparison], v: Verdict) -> str:
    within = COLUMNS[1]
    h = table[HIDDEN].aurocs[within]
    c = comparisons["patch vs hidden"].within_grouped
    if h is None or c is None:
        return ""
    return (f"The hidden-state probe reaches {fmt(h)} within kind; patch detector minus probe: {fmt(c)}; the probe "
            f"{'beats' if v.hidden_beats_baseline else 'does not beat'} the log-probability baseline by the same rule.")


def flag_sentence(default: FlagCheck, rate: float) -> str:
    side = "within" if default.correct_token_flag_rate <= rate else "above"
    return (f"Calibrated default (statistic {default.statistic}, window {default.window}): threshold "
            f"{default.threshold:.3f}. On the held-out half it flags {pct(default.correct_token_flag_rate)} of the "
            f"answer tokens of correct answers ({side} the {pct(rate)} target) and "
            f"{pct(default.incorrect_token_flag_rate)} of those of incorrect answers; an answer with a flagged token "
            f"is incorrect {pct(default.answer_precision)} of the time (precision) and "
            f"{pct(default.answer_recall)} of incorrect answers are flagged (recall).")


def model_section(answer_set: AnswerSet, *, table, comparisons, v: Verdict, kind_rows, kind_names, no_copies: Subset,
                  checks, default_check: FlagCheck, rate: float, fit_seconds: tuple[float, float],
                  folds: int) -> list[str]:
    answers = answer_set.answers
    n, right = len(answers), sum(a.correct for a in answers)
    lines = [f"### {answer_set.model_name}", ""]
    cpu = getattr(answer_set, "cpu_seconds", float("nan"))  # answer caches written before it was recorded lack it
    fit_wall, fit_cpu = fit_seconds
    gen_cpu = "" if cpu != cpu else f", {cpu:.0f} s of CPU time ({cpu / n:.2f} s per question)"
    lines.append(f"{n} questions, {right} answered correctly ({pct(right / n)}). Generation with patches, "
                 f"log-probs and the layer-{answer_set.probe_layer} residual took {answer_set.seconds:.0f} s wall clock "
                 f"({answer_set.seconds / n:.2f} s per question){gen_cpu}; cross-validated fits, calibration and "
                 f"bootstraps {fit_wall:.0f} s wall clock, {fit_cpu:.0f} s CPU. Wall clock on shared cores depends on "
                 "the other jobs (load average in the Machine line); CPU time is this process's own work.")
    lines += ["", "Label balance per kind (first question of each kind as an example):", ""]
    lines += balance_table(answer_set)
    lines += ["", f"AUROC for predicting an **incorrect** answer, 95% bootstrap intervals. *grouped*: held-out scores "
              f"from a grouped {folds}-fold by subject; *kind held out*: each kind scored by a model trained on the "
              "other kinds. Single scores are used as they are in both schemes.", ""]
    lines += auroc_table(table)
    lines += ["", "Paired differences (same bootstrap resamples for both):", ""]
    lines += comparison_table(comparisons)
    lines += ["", "AUROC inside each kind (grouped K-fold scores; — where the kind has one class only):", ""]
    lines += per_kind_table(kind_rows, kind_names)
    lines += [""] + subset_table(no_copies)
    lines += ["", f"Spike flag, calibrated on half of the subjects and measured on the other half (threshold: the "
              f"one-sided 95% Wilson bound on the share of correct answers' tokens above it is at most {pct(rate)} on "
              "the calibration half; the columns from *correct tokens flagged* on are measured on the held-out half):", ""]
    lines += flag_table(checks, rate)
    lines += ["", "Reading (rule in `experiments/spikes/summary.py`): "
              + verdict_sentence(answer_set.model_name, table, comparisons, v, no_copies) + " "
              + hidden_sentence(table, comparisons, v), "", flag_sentence(default_check, rate), ""]
    return lines


def _names(names: list[str]) -> str:
    return ", ".join(names) if names else "none"


def overall_sentence(results: dict[str, tuple[Verdict, Subset, Comparison]]) -> str:
    """The summary over models, by the rules of :mod:`.summary` (``results``: model → verdict, no-copy subset,
    patch-vs-hidden comparison)."""
    beats = [m for m, (v, _, _) in results.items() if v.patch_beats_baseline]
    beats_clean = [m for m, (_, sub, _) in results.items()
                   if sub.patch_vs_baseline is not None and sub.patch_vs_baseline.low > 0]
    probe_better = [m for m, (_, _, c) in results.items() if c.within_grouped is not None and c.within_grouped.high < 0]
    patch_better = [m for m, (_, _, c) in results.items() if c.within_grouped is not None and c.within_grouped.low > 0]
    first = ("Patch features never beat the log-probability baseline within a kind of question"
             if not beats else f"Patch features beat the log-probability baseline within a kind of question on "
             f"{_names(beats)} and not on {_names([m for m in results if m not in beats])}")
    clean = ("leaving out answers that repeat a word of the question, they beat it on none"
             if not beats_clean else f"leaving out answers that repeat a word of the question, they beat it on "
             f"{_names(beats_clean)}")
    return (f"{first}; {clean}. The hidden-state probe is better than the patch detector within kind on "
            f"{_names(probe_better)}, worse on {_names(patch_better)} (paired 95% intervals).")


def flags_summary(checks: dict[str, FlagCheck], rate: float, spike_within: dict[str, AurocResult | None]) -> str:
    """The calibrated default flag on the held-out half, and the unsupervised score's within-kind AUROC, per model."""
    parts = [f"{m}: threshold {c.threshold:.3f}, {pct(c.correct_token_flag_rate)} of correct answers' tokens flagged "
             f"(target ≤ {pct(rate)}), answer precision {pct(c.answer_precision)}, recall {pct(c.answer_recall)}"
             for m, c in checks.items()]
    first = next(iter(checks.values()))
    within = "; ".join(f"{m} {fmt(r)}" for m, r in spike_within.items())
    return (f"Calibrated default flag (statistic {first.statistic}, window {first.window}; held-out half): "
            + "; ".join(parts) + f". The unsupervised spike score (max over the answer) reaches within-kind AUROC "
            f"{within}.")
