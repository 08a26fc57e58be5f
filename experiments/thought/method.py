"""Issue 38's method rows: the null-space edit's stage, the untouched locality set, distillation on equal terms.

- **Null-space stage** (``--select``): the default with AlphaEdit's projection (Fang et al. 2025, arXiv 2410.02355;
  ``ThoughtFit.null_space``) at each :data:`NULL_SPACE_GRID` entry, fitted on the selection split and scored like the
  strength stage (held-out train answer KL, held-out preserve-text KL). Rule (:func:`choose_null_space`, fixed before
  any run): per model, the lowest mean text KL among the entries, the default included, whose mean answer KL is at
  most the default's + ``PRESERVE_SLACK`` nats (the preserve strength's rule, with the default as its reference).
  The default changes only where a run shows the rule prefers the projection on both models.
- **Locality nobody tuned on** (``--method``): the default patch on ``experiments/data/locality_untouched.json``
  (``python -m experiments.build_locality``), beside random controls over :data:`CONTROL_SEEDS` and the anchor (the
  instruction prepended, unedited); :func:`untouched_lines`.
- **Distillation on equal terms** (``--method``): :data:`DISTILL_PRESERVE_WEIGHTS`, :func:`equal_distill_lines`.
"""
from __future__ import annotations

import numpy as np

from experiments.thought.cache import row_key
from experiments.thought.rule import in_range, locality_rule, target_rule
from experiments.thought.settings import (LOCALITY_KEPT, LOCALITY_KL, PRESERVE_SLACK, SELECT_FIT, SELECT_VALIDATE,
                                         default_fit)

# The projection's ε (share of the preserved keys' trace left outside the removed directions) with the default's
# penalty, and AlphaEdit's own form (the projection alone, no penalty) at the middle ε.
# The first entry, the default itself, is the strength stage's row at the default strength (one fit, whichever stage
# runs first).
NULL_SPACE_GRID = ({}, {"null_space": 0.1}, {"null_space": 0.01}, {"null_space": 0.001},
                   {"null_space": 0.01, "preserve_strength": 0.0})
DEFAULT_LABEL = "default (no projection)"
# --quick: one projection, without the default's own row (its strength is not among --quick's strengths).
QUICK_NULL_SPACE_GRID = NULL_SPACE_GRID[2:3]


def null_space_label(setting: dict) -> str:
    if not setting:
        return DEFAULT_LABEL
    strength = setting.get("preserve_strength", default_fit().preserve_strength)
    return f"ε {setting['null_space']:g}, preserve {strength:g}"


def null_space_scores(res: dict, select_tasks, grid=NULL_SPACE_GRID) -> dict[str, tuple[list, list]]:
    """One model's ``{label: (answer KLs, text KLs)}`` over the selection tasks: the default's strength-stage rows and
    the null-space stage's; a label whose rows do not cover every task is left out."""
    from icl_lens.thought import PRESERVE_SET

    fit = default_fit()
    fits = {DEFAULT_LABEL: ("strength", fit),
            **{null_space_label(s): ("null_space", fit.replace(**s)) for s in grid if s}}
    out = {}
    for label, (job, f) in fits.items():
        rows = [res.get(row_key(job, f, PRESERVE_SET, t)) for t in select_tasks]
        if all(r is not None for r in rows):
            out[label] = ([r["validation_kl"] for r in rows], [r["text_kl"] for r in rows])
    return out


def choose_null_space(scores: dict[str, tuple[float, float]], slack: float = PRESERVE_SLACK) -> str:
    """The rule: ``scores[label] = (mean answer KL, mean held-out text KL)``; the lowest text KL among the labels whose
    answer KL is at most the default's ``+ slack`` nats (the default always qualifies; ties: the default first)."""
    if DEFAULT_LABEL not in scores:
        raise ValueError("the null-space rule needs the default's scores")
    limit = scores[DEFAULT_LABEL][0] + slack
    allowed = [label for label, (answer, _) in scores.items() if answer <= limit]
    return min(allowed, key=lambda label: (scores[label][1], label != DEFAULT_LABEL))


def null_space_lines(caches: dict, select_tasks) -> list[str]:
    """The null-space stage's table and the rule's choice per model."""
    lines = []
    for model, res in caches.items():
        got = null_space_scores(res, select_tasks)
        if len(got) < 2 or DEFAULT_LABEL not in got:
            continue
        if not lines:
            lines += ["", "**Null-space edit** (issue 38; AlphaEdit, Fang et al. 2025: each layer's matrix and down "
                      "updates projected off the top eigenvectors of the preserved keys' covariance, the fewest "
                      "holding 1 − ε of its trace, and off the BOS key; `ThoughtFit.null_space`): the default fitted "
                      f"on the first {SELECT_FIT} train queries of each selection task, scored by the answer KL of the "
                      f"next {SELECT_VALIDATE} and the KL on the held-out preserve texts. Rule (fixed before the run, "
                      "`experiments/thought/method.py`): per model, the lowest mean text KL among the settings whose "
                      f"mean answer KL is at most the default's + {PRESERVE_SLACK:g} nats.", "",
                      "| model | setting | mean answer KL | mean held-out text KL | tasks |", "|---|---|---|---|---|"]
        means = {label: (float(np.mean(a)), float(np.mean(t))) for label, (a, t) in got.items()}
        for label, (a, t) in means.items():
            lines.append(f"| {model} | {label} | {a:.4f} | {t:.4f} | {len(got[label][0])} |")
        lines.append(f"| {model} | **by the rule** | {choose_null_space(means)} | | |")
    return lines


# Distillation on equal terms (``equal_distill`` job): the preserve term's weights the patch's strength rule chooses
# from (weight 0 is its reference), and how often the held-out objective is read for early stopping (at most
# DISTILL_STEPS steps, the documented learning rate; patience 3 checkpoints).
DISTILL_PRESERVE_WEIGHTS, EVAL_EVERY = (0.0, 1.0, 10.0), 10
# The tasks it runs on (issue 38, :func:`equal_distill_plan`): every task the default patch misses, then tasks it
# meets, at least DISTILL_MET of them and DISTILL_MIN_TASKS tasks in all.
DISTILL_MET, DISTILL_MIN_TASKS = 2, 6

# ---- Locality nobody tuned on (issue 38): experiments/data/locality_untouched.json, written by
# `python -m experiments.build_locality`, read here only (never by a selection stage or the preserve texts).
CONTROL_SEEDS = (0, 1, 2, 3, 4)


def untouched_probe(model):
    """The untouched locality set tokenised for ``model`` (``icl_lens.thought.locality_set_probe``)."""
    from experiments.build_locality import LOCALITY_SET
    from icl_lens.thought import load_locality_set, locality_set_probe

    return locality_set_probe(model, load_locality_set(LOCALITY_SET))


def locality_met(loc: dict) -> bool:
    """:func:`~experiments.thought.rule.locality_rule` on one measure of the untouched set: the lowest share of a
    task's answers kept and the pooled text KL."""
    return locality_rule(min(loc["kept"].values()), loc["kl_all"])


def accuracy_verdict(caches: dict, model: str, task: str) -> str | None:
    """:func:`~experiments.thought.rule.target_rule`'s verdict on the default patch's fresh in-range queries of the
    task (met, missed or not eligible; the verdict's split: the untouched job fits the same patch as that row); None
    where that row is not cached or holds no in-range query."""
    from experiments.thought.cache import current_row
    from experiments.thought.targets import split_key

    row = current_row(caches[model], split_key("fresh", task))
    part = in_range(row) if row is not None else None
    return None if part is None else target_rule(part).verdict


def accuracy_held(caches: dict, model: str, task: str) -> bool | None:
    """Whether :func:`accuracy_verdict` is met; None where it is unknown."""
    verdict = accuracy_verdict(caches, model, task)
    return None if verdict is None else verdict == "met"


def equal_distill_plan(caches: dict, model: str, tasks) -> list[str]:
    """The tasks distillation on equal terms runs on, in order (issue 38): every task in ``tasks`` where the default
    patch misses the accuracy target (:func:`accuracy_verdict`), then tasks where it meets it, in ``tasks`` order, at
    least ``DISTILL_MET`` of them and as many as make ``DISTILL_MIN_TASKS`` in all."""
    verdicts = {t: accuracy_verdict(caches, model, t) for t in tasks}
    missed = [t for t in tasks if verdicts[t] == "missed"]
    met = [t for t in tasks if verdicts[t] == "met"]
    return missed + met[:max(DISTILL_MET, DISTILL_MIN_TASKS - len(missed))]


def _spread(values, fmt: str = ".3f") -> str:
    return f"{np.mean(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def untouched_lines(caches: dict, models, tasks) -> list[str]:
    """The untouched locality rows: the default patch (and distillation on equal terms where it ran), the random
    controls over the seeds (mean [range]) and the instruction prepended, with the target's count per model."""
    from experiments.build_locality import LOCALITY_SET
    from icl_lens.thought import load_locality_set

    from icl_lens.thought import PRESERVE_SET

    fit, data = default_fit(), load_locality_set(LOCALITY_SET)
    rows = {m: {t: r for t in tasks if (r := caches[m].get(row_key("untouched", fit, t))) is not None} for m in models}
    distilled = {m: {t: r["untouched"] for t in tasks
                     if (r := caches[m].get(row_key("equal_distill", fit, PRESERVE_SET, t))) is not None}
                 for m in models}
    if not any(rows.values()):
        return []
    lines = ["", "**Locality nobody tuned on** (issue 38; `experiments/data/locality_untouched.json`, written once by "
             f"`python -m experiments.build_locality`: {sum(map(len, data.formats.values()))} texts in "
             f"{len(data.formats)} formats ({', '.join(data.formats)}) and {len(data.tasks)} few-shot tasks "
             f"({', '.join(data.tasks)}) in templates the preserve texts do not use; read by no selection stage and "
             "by no fit). KL: mean next-token KL(unpatched ‖ edited) in nats over every position of the texts, per "
             "format and pooled; kept: the lowest share of a task's answers (its first line) the edited model keeps. "
             f"Controls: random patches of the same per-layer norms, seeds {', '.join(map(str, CONTROL_SEEDS))}, "
             "mean [range] (seeds are few). Anchor: the instruction itself prepended to the same inputs, unedited. "
             f"Locality: kept ≥ {LOCALITY_KEPT:.0%} on every task and pooled KL ≤ {LOCALITY_KL:g} (the report's one "
             "locality rule). Target: locality *and* accuracy held (the target rule on the task's fresh in-range "
             "queries; – where that row is not cached).", "",
             "| model | task | edit | pooled KL | " + " | ".join(f"KL {f}" for f in data.formats) +
             " | kept (lowest task) | control pooled KL | control kept | anchor pooled KL | anchor kept | locality "
             "| accuracy held | target |",
             "|---|---|---|---|" + "---|" * len(data.formats) + "---|---|---|---|---|---|---|---|"]
    for model in models:
        met = []
        for task, r in rows[model].items():
            controls = list(r["controls"].values())
            ctl_kl = _spread([c["kl_all"] for c in controls])
            ctl_kept = _spread([min(c["kept"].values()) for c in controls], ".0%")
            anchor = r["anchor"]
            held = accuracy_held(caches, model, task)
            for edit, loc in (("patched", r["patched"]), *((("distilled (equal terms)", distilled[model][task]),)
                                                          if task in distilled[model] else ())):
                ok = locality_met(loc)
                if edit == "patched":
                    met.append(ok and bool(held))
                lines.append(f"| {model} | {task} | {edit} | {loc['kl_all']:.3f} | "
                             + " | ".join(f"{loc['kl'][f]:.3f}" for f in data.formats)
                             + f" | {min(loc['kept'].values()):.0%} | {ctl_kl} | {ctl_kept} | "
                             f"{anchor['kl_all']:.3f} | {min(anchor['kept'].values()):.0%} | "
                             f"{'met' if ok else 'missed'} | "
                             f"{'–' if held is None or edit != 'patched' else 'yes' if held else 'no'} | "
                             f"{'met' if ok and held else 'missed' if edit == 'patched' else '–'} |")
        if met:
            lines.append(f"| {model} | **patched: target met on {sum(met)} of {len(met)} tasks** |" +
                         " |" * (len(data.formats) + 10))
    return lines


def equal_distill_pairs(caches: dict, models, tasks) -> list[tuple[str, str, dict, dict, dict]]:
    """``(model, task, distilled, patched, untouched)``: every (model, task) with its distillation on equal terms, the
    default patch's table row and its untouched-set row, in ``models`` then ``tasks`` order."""
    from experiments.thought.cache import current_row
    from icl_lens.thought import PRESERVE_SET

    fit, pairs = default_fit(), []
    for model in models:
        for task in tasks:
            d = caches[model].get(row_key("equal_distill", fit, PRESERVE_SET, task))
            p = current_row(caches[model], row_key("table", fit, task))
            u = caches[model].get(row_key("untouched", fit, task))
            if d is not None and p is not None and u is not None:
                pairs.append((model, task, d, p, u))
    return pairs


def equal_distill_counts(pairs) -> dict[str, int]:
    """The verdict sentence's counts over :func:`equal_distill_pairs`: on how many pairs the patch is at least as
    accurate on the test queries (``accuracy``), has the lower or equal untouched-set pooled KL (``locality``), fits
    in no more time (``time``, the final fits, without distillation's selection runs), and all three at once
    (``all``); ``pairs`` is their number. The report's sentence and EVAL's summary row both count here."""
    marks = [(p["accuracy"]["patched"] >= d["per_task"]["accuracy"],
              u["patched"]["kl_all"] <= d["untouched"]["kl_all"],
              p["seconds"]["patched"] <= d["seconds"]["distilled"]) for _, _, d, p, u in pairs]
    return {"pairs": len(marks), "accuracy": sum(m[0] for m in marks), "locality": sum(m[1] for m in marks),
            "time": sum(m[2] for m in marks), "all": sum(all(m) for m in marks)}


def equal_distill_sentence(counts: dict[str, int]) -> str:
    """The verdict sentence of :func:`equal_distill_counts`."""
    n = counts["pairs"]
    return (f"the patch is at least as accurate on the test queries on {counts['accuracy']} of {n} (model, task) "
            f"pairs, has the lower or equal untouched-set KL on {counts['locality']} of {n}, and fits in no more "
            f"time on {counts['time']} of {n}")


def equal_distill_lines(caches: dict, models, tasks) -> list[str]:
    """Distillation on equal terms beside the default patch: accuracy (test, fresh), locality on the untouched set,
    wall time, and the verdict sentence computed from those rows."""
    from icl_lens.thought import PRESERVE_SET

    fit = default_fit()
    pairs, stages, coverage = equal_distill_pairs(caches, models, tasks), [], []
    for model in models:
        plan, done = equal_distill_plan(caches, model, tasks), [t for m, t, *_ in pairs if m == model]
        for task in tasks:
            for w in DISTILL_PRESERVE_WEIGHTS:
                if (r := caches[model].get(row_key("equal_distill_weight", fit, PRESERVE_SET, f"{w:g}", task))):
                    stages.append((model, task, w, r))
        if plan:
            started = sorted({t for m, t, _, _ in stages if m == model} - set(done), key=tasks.index)
            met = [t for t in tasks if accuracy_verdict(caches, model, t) == "met"]
            missed, picked = [t for t in plan if t not in met], [t for t in plan if t in met]
            only = "" if picked != met else ", the only task met" if len(met) == 1 else ", the only tasks met"
            n_done = sum(t in done for t in plan)
            coverage.append(f"{model}: the rule picks {', '.join(missed) or 'none'} (missed) and "
                            f"{', '.join(picked) or 'none'} (met{only}); {n_done} of these {len(plan)} "
                            f"{'has its' if n_done == 1 else 'have their'} row"
                            + (f" ({', '.join(done)})" if done else "")
                            + (f"; selection runs only: {', '.join(started)}" if started else "") + ".")
    if not stages:
        return []
    lines = ["", "**Against distillation on equal terms** (issue 38): context distillation with the patch's preserve "
             "texts as a KL term in its loss (weight chosen by the patch's strength rule over "
             f"{', '.join(f'{w:g}' for w in DISTILL_PRESERVE_WEIGHTS)} on the selection split, each run early-stopped "
             f"on the held-out objective read every {EVAL_EVERY} steps), then distilled on the train queries for the "
             "chosen steps. The tasks (fixed before the run, `equal_distill_plan`): every task where the default patch "
             f"misses the accuracy target, then those where it meets it, at least {DISTILL_MET} and {DISTILL_MIN_TASKS} "
             "tasks in all. Coverage: " + " ".join(coverage), "",
             "Selection runs (first "
             f"{SELECT_FIT} train queries fitted, the next {SELECT_VALIDATE} scored; held-out preserve texts):", "",
             "| model | task | preserve weight | answer KL | text KL | chosen step / steps run | seconds |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {m} | {t} | {w:g} | {r['validation_kl']:.4f} | {r['text_kl']:.4f} | {r['chosen_step']} / "
              f"{r['steps_run']} | {r['seconds']:.0f} |" for m, t, w, r in stages]
    if not pairs:
        return lines
    lines += ["", "Accuracy on the test and fresh queries; locality on the untouched set (pooled KL, to 4 decimals: the "
              "sentence below compares the values, not their rounding; lowest task kept); seconds: the final fit (the "
              "distillation's selection runs in brackets).", "",
              "| model | task | weight, steps | test patched / distilled | fresh patched / distilled | "
              "KL patched / distilled | kept patched / distilled | seconds patched / distilled |",
              "|---|---|---|---|---|---|---|---|"]
    for model, task, d, p, u in pairs:
        fresh = caches[model].get(row_key("fresh", fit, task))
        fresh_p = f"{fresh['accuracy']['patched']:.0%}" if fresh else "–"
        loc_p, loc_d = u["patched"], d["untouched"]
        lines.append(f"| {model} | {task} | {d['weight']:g}, {d['steps']} | {p['accuracy']['patched']:.0%} / "
                     f"{d['per_task']['accuracy']:.0%} | {fresh_p} / {d['per_task_fresh']['accuracy']:.0%} | "
                     f"{loc_p['kl_all']:.4f} / {loc_d['kl_all']:.4f} | {min(loc_p['kept'].values()):.0%} / "
                     f"{min(loc_d['kept'].values()):.0%} | {p['seconds']['patched']:.0f} / "
                     f"{d['seconds']['distilled']:.0f} ({d['seconds']['selection']:.0f}) |")
    lines += ["", f"Read from the rows: {equal_distill_sentence(equal_distill_counts(pairs))}."]
    return lines
