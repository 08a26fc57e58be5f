"""The figures the teacher says, rendered from the reports: docs/workshop.md and the notebooks' markdown.

A figure in the guide or in a notebook's markdown that comes from an evaluation is written between two markers,

    <!-- report:thought_locality -->a median 69% (…)<!-- /report -->

and the text between them is exactly what :data:`FIGURES` renders from ``reports/*.json`` (with the readers of
:mod:`workshop.claims`). ``make reports`` rewrites them after an evaluation is rerun
(``python notebooks/workshop/figures.py --write``); ``tests/test_workshop_figures.py`` fails while a marked text
differs from its rendering, so a figure typed by hand, or one left behind by a rerun, cannot reach the room.
A figure whose report is missing renders as :data:`~workshop.claims.NOT_MEASURED`.
"""
from __future__ import annotations

import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python notebooks/workshop/figures.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from icl_lens.stats import wilson_interval
from workshop.claims import (NOT_MEASURED, accuracy_ci, answer_sheet, lookup, mean_ci, notebook_run, rate, read_report,
                             spike_shipped, spike_unseen_auroc, summary_verdicts, thought_locality, thought_rows)
from workshop.exercise_checks import compare_intervals

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- report:(\w+) -->(.*?)<!-- /report -->")
MODELS = {"gemma-3-270m": "Gemma 3 270M", "smollm2-135m": "SmolLM2"}
SPIKE_SCORE = "spike score (mean, window 16), max over answer"
LOG_P = "−mean log p, answer"


def _workshop_sentence(report: str, key: str) -> Callable[[Path | None], str | None]:
    """The sentence an evaluation stored for the guide (``workshop`` in its JSON)."""
    return lambda root: lookup(read_report(report, root), "workshop", key)


def thought_locality_figure(root: Path | None = None) -> str | None:
    """``"a median 69% of its queries (Gemma 3 270M 94%, SmolLM2 50%; 24 (model, task) pairs)"``."""
    kept = thought_locality(tuple(MODELS), root=root)
    if kept is None:
        return None
    per_model = [f"{MODELS[m]} {statistics.median(v for (mm, _), v in kept.items() if mm == m):.0%}"
                 for m in MODELS if any(mm == m for mm, _ in kept)]
    return (f"a median {statistics.median(kept.values()):.0%} of its queries ({', '.join(per_model)}; "
            f"{len(kept)} (model, task) pairs)")


def thought_distillation_figure(root: Path | None = None) -> str | None:
    """Context distillation beside the patch on the fresh queries: accuracy, unrelated-text KL, fit time."""
    rows = [r for r in thought_rows("fresh", tuple(MODELS), root=root) if "distilled" in r["accuracy"]]
    if not rows:
        return None
    parts = []
    for r in rows:
        acc, kl, sec = r["accuracy"], r["locality_kl"], r["seconds"]
        parts.append(f"{MODELS[r['model']]} {r['task']}: patched {acc['patched']:.2f}, distilled "
                     f"{acc['distilled']:.2f}; KL on unrelated text {kl['patched']:.3f} vs {kl['distilled']:.3f}; "
                     f"{sec['distilled'] / sec['patched']:.1f}× the patch's fit time ({r['n_test']} queries)")
    return "; ".join(parts)


def spike_flag_figure(root: Path | None = None) -> str | None:
    """What the shipped flag catches on kinds of question it never saw, per model."""
    parts = []
    for model, name in MODELS.items():
        held = lookup(spike_shipped(model, root=root), "unseen_kinds")
        if held is None:
            return None
        parts.append(f"{held['wrong_flagged']:.1%} of {name}'s wrong answers ({held['correct_flagged']:.1%} of its "
                     f"correct ones)")
    return " and ".join(parts)


def spike_score_figure(root: Path | None = None) -> str | None:
    """The unsupervised spike score's AUROC beside −mean log p's, on kinds never seen, per model."""
    parts = []
    for model, name in MODELS.items():
        score, logp = spike_unseen_auroc(model, SPIKE_SCORE, root=root), spike_unseen_auroc(model, LOG_P, root=root)
        if score is None or logp is None:
            return None
        parts.append(f"AUROC {score['auroc']:.2f} [{score['low']:.2f}, {score['high']:.2f}] on {name} "
                     f"(−mean log p {logp['auroc']:.2f})")
    return ", ".join(parts)


def summary_figure(claim_start: str) -> Callable[[Path | None], str | None]:
    """EVAL.md's summary row whose claim starts with ``claim_start``: ``"<verdict>: <number>"``."""
    def render(root: Path | None = None) -> str | None:
        row = next((r for r in summary_verdicts(root=root) or () if r["claim"].startswith(claim_start)), None)
        return None if row is None else f"{row['verdict']}: {row['number']}"
    return render


WORKSHOP_MODEL = "smollm2-135m"


def _sheet_04(root: Path | None):
    return answer_sheet("04_thought_patches", WORKSHOP_MODEL, root)


def _sci(x: float, digits: int = 1) -> str:
    """``1.9e-6`` (an identity's error, as the guide writes it)."""
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _ci(row: dict) -> str:
    """``0.49 [0.12, 1.1]``: a stored mean with its interval, two significant digits."""
    return f"{row['mean']:.2g} [{row['low']:.2g}, {row['high']:.2g}]"


def sheet_answer(notebook: str, render: Callable[[dict], str], model: str = WORKSHOP_MODEL
                 ) -> Callable[[Path | None], str | None]:
    """An expected answer of ``notebook``'s exercises, rendered from its entry on the answer sheet (written by
    ``python notebooks/workshop/answer_sheet.py``; the notebook's check cells compare their run with it)."""
    return lambda root: None if (s := answer_sheet(notebook, model, root)) is None else render(s)


def _correction(s: dict) -> str:
    errors = s["errors_without_correction"]
    holds = [e < 1e-4 for e in errors]  # the check's rule: the identity holds below 1e-4
    verdict = "yes" if all(holds) else "no" if not any(holds) else "depends on the prompt"
    shown = ", ".join(f"{e:.2f}" for e in errors[:-1]) + f" and {errors[-1]:.2f}"
    return (f'"{verdict}": without it the relative logit error is {shown} on the three prompts '
            f'({_sci(s["error_with_correction"], 0)} with it)')


def _largest_layer(s: dict) -> str:
    thirds = ("early", "middle", "late")
    return f'"{thirds[min(2, 3 * s["largest_norm_layer"] // s["n_layers"])]}": layer {s["largest_norm_layer"]}'


def _patch_parts(s: dict) -> str:
    gap = s["unexplained"]
    return (f'"{compare_intervals(gap["w_in"], gap["correction"], ("w_in", "correction"))}": W_in patches alone leave '
            f'{_ci(gap["w_in"])} unexplained, corrections alone {_ci(gap["correction"])}')


def _gru(s: dict) -> str:
    per_prompt = s["gru_alpha_per_prompt"]
    return (f'exponent {s["gru_alpha_beyond_train"]:+.2f} (per prompt {mean_ci(per_prompt, 2)}) → '
            f'"{compare_intervals(per_prompt, (0.5, 0.5, 0.5), ("1", "0"))}"')


def _free_vs_few(s: dict) -> str:
    free, few = s["mean_exponent_free_text"], s["mean_exponent_few_shot"]
    both = " (both negative: the steps grow)" if max(free["high"], few["high"]) < 0 else ""
    return f'"{compare_intervals(free, few)}": free text {mean_ci(free, 2)}, few-shot {mean_ci(few, 2)}{both}'


def _control(s: dict) -> str:
    share = s["beats_control"] / s["n_layers"]
    verdict = "most" if share > 2 / 3 else "few" if share < 1 / 3 else "about half"
    return f'"{verdict}": {s["beats_control"]} of {s["n_layers"]} layers; every \\|cos\\| ≤ {s["max_abs_cos"]:.3f}'


def _shrink(s: dict) -> str:
    k, n = s["shrinking"], s["prompt_layer_pairs"]
    low, high = wilson_interval(k, n)
    verdict = compare_intervals((k / n, low, high), (0.5, 0.5, 0.5), ("shrink", "grow"))
    return f'"{verdict}": α > 0 in {k} of {n} (prompt, layer) pairs, {k / n:.2f} [{low:.2f}, {high:.2f}]'


def answers_04_section_2(root: Path | None = None) -> str | None:
    """Notebook 04's four conditions on the answer sheet (``reports/workshop_answers.json``)."""
    sheet = _sheet_04(root)
    if sheet is None:
        return None
    names = {"none": "none", "full": "full prompt", "patched": "patched", "control": "random control"}
    return ", ".join(f"{names[c]} {sheet['correct'][c]}/{sheet['n_test']}" for c in names)


def answers_04_by_kind(root: Path | None = None) -> str | None:
    """Notebook 04 exercise 1's expected answer: the verdict of the sheet's two intervals, and the counts."""
    sheet = _sheet_04(root)
    if sheet is None:
        return None
    n, k = sheet["n_test"], sheet["correct_by_kind"]
    verdict = compare_intervals(accuracy_ci(k["vector"], n), accuracy_ci(k["matrix"], n), ("vector", "matrix"))
    return (f'"{verdict}": vector alone {rate(k["vector"], n)}, matrix alone {rate(k["matrix"], n)}; both together '
            f'{sheet["correct"]["patched"]}/{n}')


def answers_04_one_query(root: Path | None = None) -> str | None:
    """Notebook 04 exercise 2's expected answer: one calibration query against eight, on the sheet."""
    sheet = _sheet_04(root)
    if sheet is None:
        return None
    n, one, eight = sheet["n_test"], sheet["correct_one_query"], sheet["correct"]["patched"]
    verdict = compare_intervals(accuracy_ci(one, n), accuracy_ci(eight, n), ("higher", "lower"))
    return f'"{verdict}": {one}/{n} with one query, {eight}/{n} with eight'


def answers_06_prediction(root: Path | None = None) -> str | None:
    """Notebook 06 exercise 2's expected answer: SmolLM2's spike score against −mean log p on unseen kinds."""
    score, logp = (spike_unseen_auroc("smollm2-135m", d, root=root) for d in (SPIKE_SCORE, LOG_P))
    if score is None or logp is None:
        return None
    return (f'"{compare_intervals(score, logp)}": spike score {score["auroc"]:.2f} '
            f'[{score["low"]:.2f}, {score["high"]:.2f}], −mean log p {logp["auroc"]:.2f} [{logp["low"]:.2f}, {logp["high"]:.2f}]')


NOTEBOOKS = {p.name[:2]: p.stem for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
BINDER_GB, SAY_PEAK_ABOVE_GB = 1.0, 1.5


def _run(number: str, root: Path | None) -> dict | None:
    return notebook_run(NOTEBOOKS[number], root)


def run_seconds(number: str) -> Callable[[Path | None], str | None]:
    """The notebook test's wall time for one notebook (solutions on, its checks also run as opened)."""
    return lambda root: None if (r := _run(number, root)) is None else f"{r['seconds']:.0f} s"


def run_peak(number: str) -> Callable[[Path | None], str | None]:
    """The kernel's peak resident memory in the notebook test."""
    return lambda root: None if (r := _run(number, root)) is None else f"{r['peak_gb']:.2f} GB"


def run_memory(number: str) -> Callable[[Path | None], str | None]:
    """The peak with what it means on Binder, for a notebook's top."""
    def render(root: Path | None = None) -> str | None:
        run = _run(number, root)
        if run is None:
            return None
        peak = run["peak_gb"]
        binder = "above" if peak > BINDER_GB else "within"
        laptop = f"; above {SAY_PEAK_ABOVE_GB} GB" if peak > SAY_PEAK_ABOVE_GB else ""
        return f"{peak:.2f} GB ({binder} the {BINDER_GB:g} GB Binder guarantees{laptop}; measured {run['date']})"
    return render


def peak_range(root: Path | None = None) -> str | None:
    """The lowest and highest peak over the notebooks measured."""
    runs = [r for n in NOTEBOOKS if (r := _run(n, root)) is not None]
    if not runs:
        return None
    peaks = [r["peak_gb"] for r in runs]
    return f"{min(peaks):.2f}–{max(peaks):.2f} GB ({len(runs)} of {len(NOTEBOOKS)} notebooks measured)"


FIGURES: dict[str, Callable[[Path | None], str | None]] = {
    "alignment_seeds": _workshop_sentence("finetune_alignment", "alignment"),
    "convergence": _workshop_sentence("lab", "convergence"),
    "alignment_verdict": summary_figure("Implicit updates align with SGD"),
    "thought_locality": thought_locality_figure,
    "thought_distillation": thought_distillation_figure,
    "thought_distillation_equal": summary_figure("A thought patch is as accurate and as local as context distillation"),
    "spike_flag": spike_flag_figure,
    "spike_score": spike_score_figure,
    "spike_patch_adds": summary_figure("Token patches add to the answer's −log p"),
    "answers_04_section_2": answers_04_section_2,
    "answers_04_by_kind": answers_04_by_kind,
    "answers_04_one_query": answers_04_one_query,
    "answers_06_prediction": answers_06_prediction,
    "answers_01_correction": sheet_answer("01_quickstart", _correction),
    "answers_01_remove": sheet_answer("01_quickstart",
                                      lambda s: f"error {_sci(s['error_first_sentence_removed'])} ≤ 1e-4"),
    "answers_01_layer": sheet_answer("01_quickstart", _largest_layer),
    "answers_02_parts": sheet_answer("02_regression_lab", _patch_parts, "lab"),
    "answers_02_gru": sheet_answer("02_regression_lab", _gru, "lab"),
    "answers_02_beta": sheet_answer("02_regression_lab", lambda s: f"mean β of layer 0 = {s['mean_beta_layer_0']:.2f}",
                                    "lab"),
    "answers_03_free_vs_few": sheet_answer("03_implicit_dynamics", _free_vs_few),
    "answers_03_steps": sheet_answer("03_implicit_dynamics", lambda s: f"{s['free_text_steps']} steps, worst error "
                                                                     f"{_sci(s['free_text_worst_error'])}"),
    "answers_03_control": sheet_answer("03_implicit_dynamics", _control),
    "answers_05_token": sheet_answer("05_live_dashboard", lambda s: f'"{s["largest_last_layer_token"]}"'),
    "answers_05_shrink": sheet_answer("05_live_dashboard", _shrink),
    "answers_06_window": sheet_answer("06_spike_flags", lambda s: f"{s['without_enough_context_window_8']} positions"),
    "peak_range": peak_range,
    **{f"seconds_{n}": run_seconds(n) for n in NOTEBOOKS},
    **{f"peak_{n}": run_peak(n) for n in NOTEBOOKS},
    **{f"memory_{n}": run_memory(n) for n in NOTEBOOKS},
}


def render(name: str, root: Path | None = None) -> str:
    """The text of figure ``name`` from this checkout's reports (or ``root``'s)."""
    if name not in FIGURES:
        raise KeyError(f"no figure {name!r}; known: {sorted(FIGURES)}")
    return FIGURES[name](root) or NOT_MEASURED


def rendered(text: str, root: Path | None = None) -> str:
    """``text`` with every marked figure rewritten from the reports."""
    return MARKER.sub(lambda m: f"<!-- report:{m.group(1)} -->{render(m.group(1), root)}<!-- /report -->", text)


def stale(text: str, root: Path | None = None) -> list[tuple[str, str, str]]:
    """``(name, written, rendered)`` for each marked figure whose text is not its rendering."""
    return [(m.group(1), m.group(2), render(m.group(1), root)) for m in MARKER.finditer(text)
            if m.group(2) != render(m.group(1), root)]


def documents(root: Path = ROOT) -> list[Path]:
    """The texts that carry marked figures: the guide and each notebook's .py twin (its .ipynb follows it)."""
    return [root / "docs" / "workshop.md", *sorted((root / "notebooks").glob("[0-9][0-9]_*.py"))]


def _write_twin(py: Path) -> None:
    """Rewrite a notebook's .ipynb from its .py twin; the figures change text, not cells, so its cells keep their
    ids (jupytext would give every cell a new one)."""
    import jupytext
    import nbformat

    new, ipynb = jupytext.read(py), py.with_suffix(".ipynb")
    if ipynb.exists():
        old = nbformat.read(ipynb, as_version=4).cells
        if [c.cell_type for c in old] == [c.cell_type for c in new.cells]:
            for cell, kept in zip(new.cells, old):
                cell.id = kept.id
    jupytext.write(new, ipynb)


def write(root: Path = ROOT) -> list[Path]:
    """Rewrite every marked figure from the reports; a notebook's .ipynb is rewritten from its .py twin."""
    changed = []
    for path in documents(root):
        text = path.read_text(encoding="utf-8")
        new = rendered(text, root / "reports")
        if new != text:
            path.write_text(new, encoding="utf-8")
            if path.suffix == ".py":
                _write_twin(path)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the marked figures (default: only list stale)")
    args = parser.parse_args(argv)
    if args.write:
        for path in write():
            print(f"rewrote the figures of {path.relative_to(ROOT)}")
        return 0
    bad = [(p, s) for p in documents() for s in stale(p.read_text(encoding="utf-8"))]
    for path, (name, was, now) in bad:
        print(f"{path.relative_to(ROOT)}: {name}: {was!r} -> {now!r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
