"""Markdown of one model's results; every sentence that reads a number is built from it (rules: :mod:`.summary`)."""
from __future__ import annotations

from experiments.factual_prompts import completion_answer
from experiments.spikes.answers import AnswerSet
from experiments.spikes.calibration import FlagCheck
from experiments.spikes.summary import TARGET_RATE, FlagMeasure, Table
from icl_lens.stats import AurocDifference, AurocResult


def fmt(r: AurocResult | AurocDifference | None) -> str:
    if r is None:
        return "n/a"
    value = r.auroc if isinstance(r, AurocResult) else r.difference
    sign = "+" if isinstance(r, AurocDifference) else ""
    return f"{value:{sign}.3f} [{r.low:{sign}.3f}, {r.high:{sign}.3f}]"


def pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def pct_ci(x: float, ci) -> str:
    return pct(x) + ("" if ci is None else f" [{pct(ci[0])}, {pct(ci[1])}]")


def balance_table(answer_set: AnswerSet, strata: dict[str, str]) -> list[str]:
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
    labels = list(table.baselines)
    head = "| detector | features | within-kind AUROC [cluster 95%] | " + " | ".join(f"beats {lab}?" for lab in labels)
    lines = [head + " |", "|---|---:|---|" + "---|" * len(labels)]
    for row in table.rows.values():
        cells = " | ".join(_beats(row, lab) for lab in labels)
        lines.append(f"| {row.name} | {row.n_features} | {fmt(row.auroc)} | {cells} |")
    names = ", ".join(f"{lab} = `{name}`" for lab, name in table.baselines.items())
    return lines + ["", f"Baselines: {names}. Cells: beats? (AUROC difference detector − baseline, paired cluster "
                        "95% interval; yes when it lies above 0)."]


def per_stratum_table(rows: list[dict], names: list[str]) -> list[str]:
    lines = ["| stratum | n | incorrect | of which invented | " + " | ".join(names) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(names)]
    for row in rows:
        cells = " | ".join("—" if row[n] is None else f"{row[n]:.3f}" for n in names)
        lines.append(f"| {row['stratum']} | {row['n']} | {row['incorrect']} | {row['invented']} | {cells} |")
    return lines


def flag_table(checks: list[FlagCheck], rate: float) -> list[str]:
    lines = [f"| statistic | window | threshold | correct tokens flagged (target ≤ {pct(rate)}) | incorrect tokens "
             "flagged | answer precision | answer recall |", "|---|---:|---:|---:|---:|---:|---:|"]
    for c in checks:
        lines.append(f"| {c.statistic} | {c.window} | {c.threshold:.3f} | "
                     f"{pct(c.correct_token_flag_rate)} of {c.held_out_correct_tokens} | "
                     f"{pct(c.incorrect_token_flag_rate)} of {c.held_out_incorrect_tokens} | "
                     f"{pct(c.answer_precision)} | {pct(c.answer_recall)} |")
    return lines


def table_sentence(model_name: str, table: Table, names) -> str:
    """Which patch detectors of a table beat every baseline, from the numbers."""
    winners = [n for n in names if n in table.rows and all(table.rows[n].beats(lab) for lab in table.baselines)]
    if winners:
        return f"{model_name}, {table.title}: {', '.join(winners)} beat every baseline of the table."
    best = max((n for n in names if n in table.rows), key=lambda n: -1 if table.rows[n].auroc is None
               else table.rows[n].auroc.auroc)
    row = table.rows[best]
    lost = [lab for lab in table.baselines if row.beats(lab) is False]
    return (f"{model_name}, {table.title}: no patch detector beats every baseline; the best, {best} "
            f"({fmt(row.auroc)}), does not beat {', '.join(lost)}.")


def flag_sentence(model_name: str, m: FlagMeasure) -> str:
    verdict = ("meets the target" if m.meets_target else "does not meet the target")
    return (f"{model_name}: the rule picks `{m.detector}` on the calibration half; at p_wrong > {m.threshold:.3f} it "
            f"flags {pct_ci(m.correct_flagged, m.correct_flagged_interval)} of held-out correct answers and "
            f"{pct_ci(m.wrong_flagged, m.wrong_flagged_interval)} of wrong ones; precision "
            f"{pct_ci(m.precision, m.precision_interval)} against a base rate of {pct(m.base_rate)} wrong "
            f"({m.held_out_answers} held-out answers): it {verdict} (≤ {pct(TARGET_RATE)} of correct answers "
            f"flagged, wrong-answer rate interval above {pct(TARGET_RATE)}).")


def model_tables(name: str, answer_table: Table, prompt_table: Table, folds: int) -> list[str]:
    """The two tables the spike section opens with, for one model."""
    lines = [f"#### {name}", "",
             f"Answer-token features (within-kind AUROC for predicting an **incorrect** answer; held-out scores of a "
             f"grouped {folds}-fold by subject; pairs within a template stratum; 95% cluster bootstrap over subjects):",
             ""]
    lines += detector_table(answer_table)
    lines += ["", "Prompt-only features (read before a word of the answer exists):", ""]
    lines += detector_table(prompt_table)
    return lines + ["", table_sentence(name, answer_table, ("patch, answer tokens", "patch, answer + last prompt token")),
                    table_sentence(name, prompt_table, ("patch, prompt tail",)), ""]


def model_section(answer_set: AnswerSet, *, answer_table: Table, prompt_table: Table, stratum_rows, stratum_names,
                  measure: FlagMeasure, checks: list[FlagCheck], rate: float, fit_seconds: tuple[float, float],
                  folds: int, n_declined: int, no_copies=None, n_no_copies: int = 0) -> list[str]:
    answers = answer_set.answers
    n, right = len(answers), sum(a.correct for a in answers)
    cpu = answer_set.cpu_seconds
    fit_wall, fit_cpu = fit_seconds
    name = answer_set.model_name
    lines = [f"### {name}", "",
             f"{n} questions, {right} answered correctly ({pct(right / n)}; {n_declined} of them invented questions "
             f"answered by declining). Generating the answers (greedy, cached), then one patch pass per question "
             f"with log-probs and the layer-{answer_set.probe_layer} residual, took {answer_set.seconds:.0f} s wall "
             f"clock ({answer_set.seconds / n:.2f} s per question, {cpu:.0f} s CPU); the evaluation from the cached "
             f"answers (fits, calibration, bootstraps) {fit_wall:.0f} s wall clock, {fit_cpu:.0f} s CPU.", ""]
    lines += ["Label balance per kind (first question of each kind as an example):", ""]
    lines += balance_table(answer_set, {})
    lines += ["", "AUROC inside each template stratum (grouped K-fold scores; — where the stratum has one class only):",
              ""]
    lines += per_stratum_table(stratum_rows, stratum_names)
    if no_copies is not None:
        lines += ["", f"Only the {n_no_copies} answers whose first word does not repeat a word of the question: "
                  f"patch, answer + last prompt token − {answer_table.baselines['−log p']}, within kind: "
                  f"{fmt(no_copies)}."]
    cal = ", ".join(f"{k} {v:.3f}" for k, v in measure.calibration_aurocs.items())
    lines += ["", f"**The shipped flag.** Candidates' within-kind AUROC on the calibration half (out of fold): {cal}. "
              + flag_sentence(name, measure)
              + f" Within-kind AUROC of the shipped detector on the held-out half: {fmt(measure.held_out_auroc)}.", ""]
    lines += [f"Token-level spike flags (`generate_with_patches`' marks; threshold: ≤ {pct(rate)} of correct answers' "
              "tokens above it on the calibration half, one-sided 95% Wilson bound; measured on the held-out half):",
              ""]
    lines += flag_table(checks, rate)
    return lines + [""]
