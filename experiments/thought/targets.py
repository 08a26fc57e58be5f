"""Issue 22's sections of the thought report: the four targets in one table, distillation beside the patch, the
composed patches and the preserve strength's selection. Every verdict is computed here from the cached rows."""
from __future__ import annotations

import numpy as np

from experiments.thought.cache import current_row, fit_of, row_key
from experiments.thought.rule import (
    PARTS, Ratio, fresh_parts, in_range, locality_rule, query_units, range_parts, ratio_rule, target_rule,
)
from experiments.thought.sections import acc_ci, kept_of, pct, tie_marks, tie_sentence
from experiments.thought.settings import (
    COMMAND,
    COMPOSE_GROUPS,
    COMPOSE_TARGET,
    DISTILL_GAP,
    DISTILL_SPEEDUP,
    ELIGIBLE,
    LOCALITY_KEPT,
    LOCALITY_KL,
    PRESERVE_SLACK,
    PRESERVE_TOLERANCE,
    RATIO_LOWER,
    SELECT_FIT,
    SELECT_TASKS,
    SELECT_VALIDATE,
    TARGET,
    TASKS_NEEDED,
    DISTILL_LRS,
    DISTILL_TASKS,
    choose_lr,
    choose_strength,
    earlier_strength_choice,
    default_fit,
    setting_name,
)

NOT_MEASURED = "not measured"


SPLITS = ("fresh", "test")  # the targets' queries: fresh (scored once, by the frozen default) first, then test
SPLIT_NAMES = {"fresh": "fresh (scored once)", "test": "test"}


def split_key(split: str, task: str) -> str:
    """The cache key of a task's main-table row on ``split`` with the current default: ``table/…`` (test) or
    ``fresh/…``."""
    return row_key("table" if split == "test" else split, default_fit(), task)


def new_rows(caches: dict, model: str, tasks, split: str = "test") -> dict[str, dict]:
    """The model's rows on ``split`` scored by issue 22's verdict (they keep whole continuations) with the current
    default (an earlier default's row is not the default's result)."""
    return {t: r for t in tasks if (r := current_row(caches[model], split_key(split, t))) and "continuations" in r}


def locality_met(r: dict, cond: str = "patched") -> bool:
    """:func:`~experiments.thought.rule.locality_rule` on a table row's ``cond`` (its other task, its text KL
    against the row's random control)."""
    kl = r["locality_kl"]
    return locality_rule(kept_of(r)[cond], kl[cond], kl["control"])


def distill_met(r: dict) -> tuple[bool, float, float | None]:
    """Patched within DISTILL_GAP of distilled (or above it), and distillation ≥ DISTILL_SPEEDUP × slower."""
    gap = r["accuracy"]["patched"] - r["accuracy"]["distilled"]
    s = r["seconds"]
    speed = s["distilled"] / s["patched"] if s.get("patched") else None
    return gap >= -DISTILL_GAP and speed is not None and speed >= DISTILL_SPEEDUP, gap, speed


COMPOSE_METHODS = {"added": "edits added", "joint": "one joint fit"}  # the two ways, reported side by side


def group_rows(group: dict, method: str, split: str = "test") -> list[tuple[str, dict, dict]]:
    """``(task, single patch's result, result at once)`` on ``split`` for every task of a cached composed group,
    at once by ``method`` (``"added"``: the single patches' edits added; ``"joint"``: one fit over all their rows;
    empty when not run); each result has ``accuracy``, ``correct``, ``n_test`` and ``locality`` (the single patch's
    own, or the patch at once's)."""
    key = per_task_key(split)
    if key not in group:
        return []
    return [(t, group[key][t]["single"], got) for t in dict.fromkeys(group["tasks"])
            if (got := at_once(group, t, method, split)) is not None]


def per_task_key(split: str) -> str:
    """Where a composed group keeps its per-task results on ``split``: ``per_task`` (test), ``per_task_fresh``."""
    return "per_task" if split == "test" else f"per_task_{split}"


def compose_groups(caches: dict, model: str, size: int) -> list[dict]:
    """The model's cached composed groups of ``size`` tasks, fitted with the current default."""
    return [c for key, c in caches[model].items()
            if key.startswith("compose/") and fit_of(key) == default_fit().key() and len(c["tasks"]) == size]


def at_once(group: dict, task: str, method: str, split: str = "test") -> dict | None:
    """``task``'s result on ``split`` with the group's patch at once by ``method``, with that patch's locality
    (None: not run)."""
    got = group if method == "added" else group.get(method)
    key = per_task_key(split)
    return None if got is None or key not in got else {**got[key][task], "locality": got["locality"]}


def compose_share(task: str, single: dict, at_once: dict, split: str = "test") -> Ratio:
    """The share of its single-patch accuracy a task keeps at once, by the one rule (:func:`rule.ratio_rule`): at
    once over alone on the same queries (fresh: those in range), point and paired-bootstrap lower bound ≥
    COMPOSE_TARGET (``add``'s unordered pairs one unit). Without per-query outcomes: the point share, no interval, never met."""
    if "outcomes" in single and "outcomes" in at_once:
        n = len(single["outcomes"])
        units = query_units(task, split, n) or list(range(n))
        parts = range_parts(task, split) if split == "fresh" else None
        keep = [i for i in range(n) if parts is None or len(parts) != n or parts[i] == PARTS[0]]  # in range only
        return ratio_rule([at_once["outcomes"][i] for i in keep], [single["outcomes"][i] for i in keep],
                          point=COMPOSE_TARGET, lower=COMPOSE_TARGET, units=[units[i] for i in keep])
    share = at_once["correct"] / single["correct"] if single["correct"] else None
    return Ratio(share, None, False, True, False, single["n_test"], single["n_test"])


def _compose_target_rows(caches: dict, model: str, size: int, words: str, on: str, split: str) -> list[str]:
    """The target rows of the groups of ``size`` tasks, one per way (added, joint): every task of every group
    counted by the one rule, and each group's locality at once beside its tasks' alone."""
    rows = []
    for method, name in COMPOSE_METHODS.items():
        groups = [(c, got) for c in compose_groups(caches, model, size) if (got := group_rows(c, method, split))]
        if not groups:
            continue
        shares = [(t, compose_share(t, r, a, split)) for _, got in groups for t, r, a in got]
        n_ok = sum(s.met for _, s in shares)
        local = "; ".join(
            f"{'+'.join(c['tasks'])}: locality KL {got[0][2]['locality']['kl']:.3f} at once (alone: "
            + ", ".join(f"{r['locality']['kl']:.3f}" for _, r, _ in got) + f"), other task kept "
            f"{pct(got[0][2]['locality']['accuracy'])} (alone: " + ", ".join(pct(r["locality"]["accuracy"])
                                                                              for _, r, _ in got) + ")"
            for c, got in groups)
        rows.append(f"| {words} tasks at once ({name}): each keeps ≥ {COMPOSE_TARGET} of its single-patch accuracy, "
                    f"95% lower bound ≥ {COMPOSE_TARGET} | {on} | {n_ok} of {len(shares)} tasks in {len(groups)} "
                    f"group{'s' if len(groups) > 1 else ''} (" + ", ".join(f"{t} {s.text()}" for t, s in shares)
                    + f"); {local} | {'met' if n_ok == len(shares) else 'missed'} |")
    if size == 2 and not rows:
        rows.append(f"| two tasks at once | {on} | {NOT_MEASURED} | – |")
    return rows


def targets_lines(caches: dict, models, tasks) -> list[str]:
    """The four targets of issue 22, one row per (target, model, split), whatever they are: the fresh queries
    (scored once, by the frozen default) first, then the test queries (which earlier defaults were scored on)."""
    rows = [row for split in SPLITS for model in models for row in _target_rows(caches, model, tasks, split)]
    return ["", "**Issue 22's targets** (held-out queries of both splits: *fresh*, scored once by the frozen "
            "default, and *test*, which earlier defaults were scored on; a row only counts results scored by the "
            "boundary verdict: the answer followed by the end or a character that cannot continue a word; every "
            "accuracy and composition count by the one rule of `experiments/thought/rule.py` (ratio and its paired "
            "bootstrap 95% lower bound, full ≥ 50% on the same queries); on the fresh queries the accuracy target "
            "reads the queries in range of the task's generators, and those out of range have a generalisation row "
            "of their own, never counted — see the fresh table):", "", "| target | model | queries | result | verdict |",
            "|---|---|---|---|---|", *rows]


def _accuracy_row(rows: dict[str, dict], on: str, part: str, needed: int | None) -> str:
    """The accuracy target's row over ``rows`` (task → row of the queries the target reads), every count by
    :func:`rule.target_rule`; ``needed``: tasks to meet for the verdict (None: a row without a verdict)."""
    met = {t: target_rule(r) for t, r in rows.items()}
    eligible = {t: m for t, m in met.items() if m.eligible}
    lows = [m.lower for m in eligible.values() if m.lower is not None]
    n_met = sum(m.met for m in eligible.values())
    sel = [t for t in eligible if t in SELECT_TASKS]
    identical = [t for t, m in eligible.items() if m.identical]
    verdict = "–" if needed is None else "met" if n_met >= needed else "missed"
    return (f"| accuracy{part}: patched ≥ {TARGET} × full, 95% lower bound ≥ {RATIO_LOWER}"
            + ("" if needed is None else f", on ≥ {needed} tasks") + f" | {on} | {n_met} of {len(eligible)} tasks "
            f"with full ≥ {ELIGIBLE:.0%} ({len(rows)} evaluated; selection tasks among them: "
            f"{sum(eligible[t].met for t in sel)} of {len(sel)}); median lower bound "
            f"{np.median(lows) if lows else float('nan'):.2f}"
            + (f"; identical answers to full, interval without spread: {', '.join(identical)}" if identical else "")
            + (f"; missed: {', '.join(t for t, m in eligible.items() if not m.met)}" if n_met < len(eligible) else "")
            + f" | {verdict} |")


def _target_rows(caches: dict, model: str, tasks, split: str) -> list[str]:
    rows = []
    got = new_rows(caches, model, tasks, split)
    on = f"{model} | {SPLIT_NAMES[split]}"
    if not got:
        return [f"| {name} | {on} | {NOT_MEASURED} (no row with the current default) | – |"
                for name in ("accuracy", "locality", "against distillation", "two tasks at once")]
    rows.append(_accuracy_row({t: p for t, r in got.items() if (p := in_range(r)) is not None}, on,
                              f" ({'in range' if split == 'fresh' else 'all queries'})", TASKS_NEEDED))
    if split == "fresh":
        out = {t: p[PARTS[1]] for t, r in got.items() if PARTS[1] in (p := fresh_parts(r))}
        if out:
            rows.append(_accuracy_row(out, on, " (out of range: generalisation, not a target)", None))
    kl = [r["locality_kl"]["patched"] for r in got.values()]
    ctrl = [r["locality_kl"]["control"] for r in got.values()]
    kept = [kept_of(r)["patched"] for r in got.values()]
    n_loc = sum(locality_met(r) for r in got.values())
    rows.append(f"| locality: other task kept ≥ {LOCALITY_KEPT:.0%}, KL ≤ {LOCALITY_KL} nats and below the "
                f"control | {on} | {n_loc} of {len(got)} tasks; median kept {pct(float(np.median(kept)))}, "
                f"median KL {np.median(kl):.3f} (control {np.median(ctrl):.3f}) | "
                f"{'met' if n_loc == len(got) else 'missed'} |")
    dist = {t: distill_met(r) for t, r in got.items() if "distilled" in r["accuracy"]}
    if dist:
        gaps = [g for _, g, _ in dist.values()]
        speeds = [s for _, _, s in dist.values() if s is not None]
        n_d = sum(ok for ok, _, _ in dist.values())
        rows.append(f"| against distillation: accuracy within {DISTILL_GAP} of it, ≥ {DISTILL_SPEEDUP:g}× less "
                    f"wall time | {on} | {n_d} of {len(dist)} tasks; patched − distilled accuracy median "
                    f"{np.median(gaps):+.2f} (min {min(gaps):+.2f}); distillation / patch time median "
                    f"{np.median(speeds):.1f}× | {'met' if n_d == len(dist) else 'missed'} |")
    else:
        rows.append(f"| against distillation | {on} | {NOT_MEASURED} | – |")
    for size, words in ((2, "two"), (4, "four")):
        rows += _compose_target_rows(caches, model, size, words, on, split)
    return rows


def distill_lines(caches: dict, models, tasks, split: str = "fresh") -> list[str]:
    """The thought patch beside context distillation into the same parameters on ``split``: accuracy, locality,
    wall time."""
    rows = []
    for model in models:
        for t, r in new_rows(caches, model, tasks, split).items():
            if "distilled" not in r["accuracy"]:
                continue
            ok, gap, speed = distill_met(r)
            rows.append(f"| {model} | {t}{' (selection)' if t in SELECT_TASKS else ''} | {acc_ci(r, 'none')} | {acc_ci(r, 'full')} | {acc_ci(r, 'patched')} | "
                        f"{acc_ci(r, 'distilled')} | {gap:+.2f} | "
                        f"{r['locality_kl']['patched']:.3f} / {r['locality_kl']['distilled']:.3f} | "
                        f"{pct(kept_of(r)['patched'])} / {pct(kept_of(r)['distilled'])} | "
                        f"{r['seconds']['patched']:.0f} / {r['seconds']['distilled']:.0f} | "
                        f"{'–' if speed is None else f'{speed:.1f}×'} |")
    if not rows:
        return []
    from icl_lens.thought import DISTILL_BATCH, DISTILL_LR, DISTILL_STEPS

    return ["", f"**Against context distillation** ({SPLIT_NAMES[split]} queries; `icl_lens.thought.distill_patch`: Adam "
            "on the same parameters — input maps, vectors, down projections — the same calibration rows and answer "
            f"positions, minimising KL(prompted ‖ edited); {DISTILL_STEPS} steps of {DISTILL_BATCH} queries, peak "
            f"learning rate {DISTILL_LR:g} (chosen by the rule below), warm-up then cosine decay). Both methods' seconds "
            "are the wall time of the fit alone, in the same run.",
            "",
            "| model | task | none | full | patched | distilled | patched − distilled | "
            "locality KL patched / distilled | other task kept patched / distilled | seconds patched / "
            "distilled | time ratio |", "|---|---|---|---|---|---|---|---|---|---|---|", *rows]


def compose_lines(caches: dict, models, split: str = "fresh") -> list[str]:
    """Every composed group on ``split``: each task alone, with the edits added and with the joint fit (where run)."""
    rows = []
    key = per_task_key(split)
    for model in models:
        for size in sorted({len(g) for g in COMPOSE_GROUPS} | {len(c["tasks"]) for k, c in caches[model].items()
                                                                if k.startswith("compose/")}):
            for group in compose_groups(caches, model, size):
                if key not in group:
                    continue
                for t in dict.fromkeys(group["tasks"]):
                    r = group[key][t]["single"]
                    cells = []
                    for got in (at_once(group, t, m, split) for m in COMPOSE_METHODS):
                        cells.append(("–", "–", "–", "–") if got is None else (
                            f"{pct(got['accuracy'])} ({got['correct']}/{got['n_test']})",
                            (share := compose_share(t, r, got, split)).text() + f" {share.verdict}",
                            f"{got['locality']['kl']:.3f}",
                            pct(got["locality"]["accuracy"])))
                    (ca, cs, ck, cp), (ja, js, jk, jp) = cells
                    rows.append(f"| {model} | {size} | {t} | {pct(r['accuracy'])} ({r['correct']}/{r['n_test']}) | "
                                f"{ca} | {ja} | {cs} / {js} | {r['locality']['kl']:.3f} / {ck} / {jk} | "
                                f"{pct(r['locality']['accuracy'])} / {cp} / {jp} |")
    if not rows:
        return []
    return ["", f"**Composed patches** ({SPLIT_NAMES[split]} queries; 2 or 4 tasks applied at once, each task "
            "scored on its own queries; "
            "two ways, both run for every group and shown side by side, none chosen: *added*, "
            "`ThoughtPatch.composed`, the default single patches' edits added; *joint*, `thought_patch_joint`, one "
            "fit with the default settings over all the tasks' calibration rows, each task's queries read after its "
            "own instruction):", "",
            f"| model | tasks at once | task | patched alone | added | joint | share of alone added / joint [95% "
            f"paired bootstrap] and target (≥ {COMPOSE_TARGET}, lower bound ≥ {COMPOSE_TARGET}) | "
            "locality KL alone / added / joint | other task kept alone / added / joint |",
            "|---|---|---|---|---|---|---|---|---|", *rows]


def strength_scores(caches: dict, select_tasks, preserve_set: str | None) -> dict[float, dict[str, list[float]]]:
    """The third stage's results with ``preserve_set`` (None: those from before the set was named, the samples
    alone): per strength, the answer KLs and text KLs over models × selection tasks."""
    got: dict[float, dict[str, list[float]]] = {}
    for res in caches.values():
        for key, v in res.items():
            if key.startswith("strength/") and v["task"] in select_tasks and v.get("preserve_set") == preserve_set:
                cell = got.setdefault(float(v["preserve_strength"]), {"answer": [], "text": []})
                cell["answer"].append(v["validation_kl"])
                cell["text"].append(v["text_kl"])
    return got


def rule_scores(got: dict[float, dict[str, list[float]]]) -> dict[float, tuple[float, float]]:
    """Mean (answer KL, text KL) of the strengths measured on every (model, task) that any strength was."""
    full = max((len(c["answer"]) for c in got.values()), default=0)
    return {s: (float(np.mean(c["answer"])), float(np.mean(c["text"]))) for s, c in got.items()
            if len(c["answer"]) == full}


def strength_lines(caches: dict, select_tasks) -> list[str]:
    """Third selection stage: the preserve penalty's strength, by held-out answer KL and held-out text KL; the
    earlier stage with the samples alone beside it."""
    from icl_lens.thought import PRESERVE_SET

    lines = []
    for preserve_set, texts in ((PRESERVE_SET, "the model's own samples from BOS and the few-shot prompts, fit half"),
                                (None, "the model's own samples from BOS alone, first half: the earlier stage")):
        got = strength_scores(caches, select_tasks, preserve_set)
        if not got:
            continue
        scores = rule_scores(got)
        text_units = {st: {(m, v["task"]): v["text_kl"] for m, res in caches.items() for k, v in res.items()
                           if k.startswith("strength/") and v["task"] in select_tasks
                           and v.get("preserve_set") == preserve_set and float(v["preserve_strength"]) == st}
                      for st in scores}
        lines += ["", f"**Preserve strength** (third stage of `{COMMAND} --select`; preserve texts: {texts}): the "
                  f"default fitted on the first {SELECT_FIT} train queries of each selection task with the preserve "
                  f"penalty at each strength; scored by the answer KL of the next {SELECT_VALIDATE} train queries and "
                  "by the next-token KL(unpatched ‖ patched) on the held-out preserve texts (the other half; never "
                  "the locality measure's texts); mean over models × tasks. Rule: the lowest text KL among the "
                  f"strengths whose answer KL is at most strength 0's + {PRESERVE_SLACK:g} nats (the earlier rule: "
                  f"at most {1 + PRESERVE_TOLERANCE:g} × strength 0's; replaced after the first selection task's "
                  "results, before the other tasks' and before any fresh query, `experiments/thought/settings.py`).",
                  "",
                  "| strength | mean answer KL | mean held-out text KL | results |", "|---|---|---|---|"]
        for st in sorted(got):
            c = got[st]
            lines.append(f"| {st:g} | {np.mean(c['answer']):.4f} | {np.mean(c['text']):.4f} | {len(c['answer'])} |")
        if 0.0 in scores:
            chosen = choose_strength(scores)
            allowed = {st: u for st, u in text_units.items() if scores[st][0] <= scores[0.0][0] + PRESERVE_SLACK}
            lines += ["", f"By the rule: strength **{chosen:g}** (by the earlier rule: "
                      f"{earlier_strength_choice(scores):g})." + tie_sentence(tie_marks(allowed, chosen), "strength")]
    return lines


def distill_lr_scores(caches: dict) -> dict[float, list[float]]:
    """The distillation stage: per learning rate, the held-out answer KLs over models × DISTILL_TASKS."""
    got: dict[float, list[float]] = {}
    for res in caches.values():
        for key, v in res.items():
            if key.startswith("distill/") and v["task"] in DISTILL_TASKS:
                got.setdefault(float(v["lr"]), []).append(v["validation_kl"])
    return got


def distill_lr_lines(caches: dict) -> list[str]:
    """How distillation's learning rate was chosen: every rate's held-out answer KL, text KL and time."""
    rows = []
    for model, res in caches.items():
        for key, v in sorted(res.items()):
            if key.startswith("distill/") and v["task"] in DISTILL_TASKS:
                rows.append(f"| {model} | {v['task']} | {v['lr']:g} | {v['first_loss']:.3f} → {v['last_loss']:.3f} | "
                            f"{v['calibration_kl']:.3f} | {v['validation_kl']:.3f} | {v['text_kl']:.3f} | "
                            f"{v['seconds']:.0f} |")
    if not rows:
        return []
    got = distill_lr_scores(caches)
    full = max(len(x) for x in got.values())
    scores = {lr: float(np.mean(x)) for lr, x in got.items() if len(x) == full}
    chosen = choose_lr(scores)
    edge = chosen in (min(DISTILL_LRS), max(DISTILL_LRS))
    units = {lr: {(m, v["task"]): v["validation_kl"] for m, res in caches.items() for k, v in res.items()
                  if k.startswith("distill/") and v["task"] in DISTILL_TASKS and float(v["lr"]) == lr} for lr in scores}
    return ["", f"**Distillation's learning rate** (`{COMMAND} --select`): on each model and "
            f"{', '.join(DISTILL_TASKS)}, distilled on the first {SELECT_FIT} train queries at each peak learning rate "
            f"and scored on the next {SELECT_VALIDATE} train queries (never test or fresh) by the answer KL at the "
            "answer's positions; the held-out preserve texts' KL is shown, not used. Rule: the lowest mean answer KL "
            "over models × tasks.", "",
            "| model | task | peak lr | training loss first → last | calibration KL | held-out answer KL | "
            "held-out text KL | seconds |", "|---|---|---|---|---|---|---|---|", *rows, "",
            "Mean held-out answer KL: " + ", ".join(f"lr {lr:g}: {k:.3f}" for lr, k in sorted(scores.items()))
            + f". By the rule: **{chosen:g}**"
            + (" (at the end of the grid: a wider grid could do better)." if edge else ".")
            + tie_sentence(tie_marks(units, chosen), "learning rate")]


def fresh_lines(caches: dict, models, tasks) -> list[str]:
    """The fresh queries, scored once by the frozen default, in range and out of range apart (:func:`rule.range_parts`):
    every condition, the ratio and the rule's verdict (in range: the target; out of range: generalisation, not a
    target), agreement with the full prompt beside the random control's, and locality."""
    rows = []
    for model in models:
        for t, whole in new_rows(caches, model, tasks, "fresh").items():
            kl, kept = whole["locality_kl"], kept_of(whole)
            for part, r in fresh_parts(whole).items():
                rule = target_rule(r)
                verdict = rule.verdict if part == PARTS[0] or not rule.eligible else f"{rule.verdict} (not a target)"
                agree = _agreement(r)
                rows.append(f"| {model} | {t}{' (selection)' if t in SELECT_TASKS else ''} | {part} | {r['n_test']} | "
                            + " | ".join(acc_ci(r, c) for c in ("none", "full", "patched", "distilled", "steering",
                                                                 "control"))
                            + f" | {rule.text()} | {verdict} | "
                            + " / ".join(pct(agree.get(c)) for c in ("patched", "control")) + " | "
                            + f"{kl['patched']:.3f} / {kl['control']:.3f} | {pct(kept['patched'])} / {pct(kept['control'])} |")
    if not rows:
        return []
    return ["", "**Fresh queries, scored once** (issue 22: the task builder's `fresh` split, read by no selection "
            "stage, scored by the frozen default in one run beside the test queries, with the same fitted edits). "
            "How fresh was built (`python -m experiments.build_tasks`): first each task's own pairs that demonstrations, "
            "train and test left unused, then new pairs from new lists of the same kind (words, translations, "
            "countries) or, for the three tasks with numbers, from beyond their generators' range: `add` sums with "
            "an addend of 10–19 (train and test: one-digit addends), `plus_one` from 99 to 998 (train and test: "
            "10–98), `number_words` 0, the hundreds and the thousands (train and test: 1–99). *In range*: every "
            "number of the query lies in its generator's range (tasks without numbers: every query); *out of "
            "range*: the rest, reported apart as generalisation, never counted for the target. Accuracy [95% "
            "Wilson interval]; ratio patched/full with a paired bootstrap 95% interval (`add`: a + b and b + a "
            "resampled as one unordered pair; *identical answers*: the patch right on exactly the full prompt's "
            "queries, where the bootstrap has no spread to show); rule (`experiments/thought/rule.py`): ratio ≥ "
            f"{TARGET} and lower bound ≥ {RATIO_LOWER} where full ≥ {ELIGIBLE:.0%} on the same queries (n/a "
            "below); agreement: share of queries answered as the full prompt answers them, patched beside the "
            "random control; locality as in the test table (it does not depend on the split).", "",
            "| model | task | range | queries | none | full | patched | distilled | steering | control | "
            "patched/full | rule | agreement with full, patched / control | locality KL patched / control | "
            "other task kept patched / control |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *rows]


def _agreement(r: dict) -> dict[str, float]:
    """Share of the row's queries on which each condition gives the full prompt's answer (the row's own
    ``agreement_with_full`` where it keeps no answers)."""
    a = r.get("answers")
    if not a or "full" not in a or not r["n_test"]:
        return r.get("agreement_with_full", {})
    return {c: sum(x == y for x, y in zip(v, a["full"])) / r["n_test"] for c, v in a.items()}
