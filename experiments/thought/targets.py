"""Issue 22's sections of the thought report: the four targets in one table, distillation beside the patch, the
composed patches and the preserve strength's selection. Every verdict is computed here from the cached rows."""
from __future__ import annotations

import numpy as np

from experiments.thought.cache import current_row, fit_of, row_key
from experiments.thought.sections import acc_ci, kept_of, pct, ratio_ci
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


def ratio_met(r: dict) -> tuple[bool, float | None, tuple | None]:
    """Patched ≥ TARGET × full (point estimate) and the paired bootstrap lower bound ≥ RATIO_LOWER."""
    ratio, ci = ratio_ci(r)
    return (ratio is not None and ratio >= TARGET and ci is not None and ci[0] >= RATIO_LOWER), ratio, ci


def locality_met(r: dict, cond: str = "patched") -> bool:
    kl, kept = r["locality_kl"], kept_of(r)
    return kept[cond] >= LOCALITY_KEPT and kl[cond] <= LOCALITY_KL and kl[cond] < kl["control"]


def distill_met(r: dict) -> tuple[bool, float, float | None]:
    """Patched within DISTILL_GAP of distilled (or above it), and distillation ≥ DISTILL_SPEEDUP × slower."""
    gap = r["accuracy"]["patched"] - r["accuracy"]["distilled"]
    s = r["seconds"]
    speed = s["distilled"] / s["patched"] if s.get("patched") else None
    return gap >= -DISTILL_GAP and speed is not None and speed >= DISTILL_SPEEDUP, gap, speed


COMPOSE_METHODS = {"added": "edits added", "joint": "one joint fit"}  # the two ways, reported side by side


def compose_rows(caches: dict, model: str, size: int, method: str = "added",
                 split: str = "test") -> list[tuple[str, dict, dict]]:
    """``(task, single patch's result, result at once)`` on ``split`` for every cached group of ``size`` tasks that
    holds ``method`` (``"added"``: the single patches' edits added; ``"joint"``: one fit over all their rows); each
    result has ``accuracy``, ``correct``, ``n_test`` and ``locality`` (the single patch's own, or the patch at
    once's)."""
    key = per_task_key(split)
    return [(t, c[key][t]["single"], got) for c in compose_groups(caches, model, size) if key in c
            for t in dict.fromkeys(c["tasks"]) if (got := at_once(c, t, method, split)) is not None]


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


def compose_share(single: dict, at_once: dict) -> float | None:
    """The share of its single-patch accuracy a task keeps at once (None where the single patch has none)."""
    return at_once["accuracy"] / single["accuracy"] if single["accuracy"] else None


def targets_lines(caches: dict, models, tasks) -> list[str]:
    """The four targets of issue 22, one row per (target, model, split), whatever they are: the fresh queries
    (scored once, by the frozen default) first, then the test queries (which earlier defaults were scored on)."""
    rows = [row for split in SPLITS for model in models for row in _target_rows(caches, model, tasks, split)]
    return ["", "**Issue 22's targets** (held-out queries of both splits: *fresh*, scored once by the frozen "
            "default, and *test*, which earlier defaults were scored on; a row only counts results scored by the "
            "boundary verdict: the answer followed by the end or a character that cannot continue a word; verdicts "
            "computed from the rows below):", "", "| target | model | queries | result | verdict |",
            "|---|---|---|---|---|", *rows]


def _target_rows(caches: dict, model: str, tasks, split: str) -> list[str]:
    rows = []
    got = new_rows(caches, model, tasks, split)
    eligible = {t: r for t, r in got.items() if r["accuracy"]["full"] >= ELIGIBLE}
    on = f"{model} | {SPLIT_NAMES[split]}"
    if not got:
        return [f"| {name} | {on} | {NOT_MEASURED} (no row with the current default) | – |"
                for name in ("accuracy", "locality", "against distillation", "two tasks at once")]
    met = {t: ratio_met(r) for t, r in eligible.items()}
    lows = [ci[0] for _, _, ci in met.values() if ci is not None]
    n_met = sum(ok for ok, _, _ in met.values())
    sel = [t for t in met if t in SELECT_TASKS]
    rows.append(f"| accuracy: patched ≥ {TARGET} × full, 95% lower bound ≥ {RATIO_LOWER}, on ≥ {TASKS_NEEDED} "
                f"tasks | {on} | {n_met} of {len(eligible)} tasks with full ≥ {ELIGIBLE:.0%} ({len(got)} "
                f"evaluated; selection tasks among them: {sum(met[t][0] for t in sel)} of {len(sel)}); median "
                f"lower bound {np.median(lows) if lows else float('nan'):.2f} | "
                f"{'met' if n_met >= TASKS_NEEDED else 'missed'} |")
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
    by_method = {m: pairs for m in COMPOSE_METHODS if (pairs := compose_rows(caches, model, 2, m, split))}
    for method, pairs in by_method.items():
        shares = [compose_share(r, c) for _, r, c in pairs]
        ok = [s is not None and s >= COMPOSE_TARGET for s in shares]
        loc = pairs[0][2]["locality"]
        single = [r["locality"] for _, r, _ in pairs]
        rows.append(f"| two tasks at once ({COMPOSE_METHODS[method]}): each keeps ≥ {COMPOSE_TARGET} of its "
                    f"single-patch accuracy | {on} | {sum(ok)} of {len(ok)} tasks ("
                    + ", ".join(f"{t} {s:.2f}" if s is not None else f"{t} –" for (t, _, _), s in zip(pairs, shares))
                    + f"); locality KL {loc['kl']:.3f} at once (alone: "
                    + ", ".join(f"{x['kl']:.3f}" for x in single) + f"), other task kept {pct(loc['accuracy'])} "
                    "(alone: " + ", ".join(pct(x["accuracy"]) for x in single) + f") | "
                    f"{'met' if all(ok) else 'missed'} |")
    if not by_method:
        rows.append(f"| two tasks at once | {on} | {NOT_MEASURED} | – |")
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
            gain = r.get("gain_recovered", {})
            rows.append(f"| {model} | {t}{' (selection)' if t in SELECT_TASKS else ''} | {acc_ci(r, 'none')} | {acc_ci(r, 'full')} | {acc_ci(r, 'patched')} | "
                        f"{acc_ci(r, 'distilled')} | {gap:+.2f} | "
                        + " / ".join("–" if gain.get(c) is None else f"{gain[c]:.2f}" for c in ("patched", "distilled"))
                        + f" | {r['locality_kl']['patched']:.3f} / {r['locality_kl']['distilled']:.3f} | "
                        f"{pct(kept_of(r)['patched'])} / {pct(kept_of(r)['distilled'])} | "
                        f"{r['seconds']['patched']:.0f} / {r['seconds']['distilled']:.0f} | "
                        f"{'–' if speed is None else f'{speed:.1f}×'} |")
    if not rows:
        return []
    from icl_lens.thought import DISTILL_BATCH, DISTILL_LR, DISTILL_STEPS

    return ["", f"**Against context distillation** ({SPLIT_NAMES[split]} queries; `icl_lens.thought.distill_patch`: Adam "
            "on the same parameters — input maps, vectors, down projections — the same calibration rows and answer "
            f"positions, minimising KL(prompted ‖ edited); {DISTILL_STEPS} steps of {DISTILL_BATCH} queries, peak "
            f"learning rate {DISTILL_LR:g} (chosen by the rule below), warm-up then cosine decay). Gain recovered = "
            "(c − none) / (full − none). Both methods' seconds are the wall time of the fit alone, in the same run.",
            "",
            "| model | task | none | full | patched | distilled | patched − distilled | gain recovered patched / "
            "distilled | locality KL patched / distilled | other task kept patched / distilled | seconds patched / "
            "distilled | time ratio |", "|---|---|---|---|---|---|---|---|---|---|---|---|", *rows]


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
                        share = None if got is None else compose_share(r, got)
                        cells.append(("–", "–", "–", "–") if got is None else (
                            f"{pct(got['accuracy'])} ({got['correct']}/{got['n_test']})",
                            "–" if share is None else f"{share:.2f}", f"{got['locality']['kl']:.3f}",
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
            "| model | tasks at once | task | patched alone | added | joint | share of alone added / joint | "
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
            lines += ["", f"By the rule: strength **{choose_strength(scores):g}** (by the earlier rule: "
                      f"{earlier_strength_choice(scores):g})."]
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
    return ["", f"**Distillation's learning rate** (`{COMMAND} --select`): on each model and "
            f"{', '.join(DISTILL_TASKS)}, distilled on the first {SELECT_FIT} train queries at each peak learning rate "
            f"and scored on the next {SELECT_VALIDATE} train queries (never test or fresh) by the answer KL at the "
            "answer's positions; the held-out preserve texts' KL is shown, not used. Rule: the lowest mean answer KL "
            "over models × tasks.", "",
            "| model | task | peak lr | training loss first → last | calibration KL | held-out answer KL | "
            "held-out text KL | seconds |", "|---|---|---|---|---|---|---|---|", *rows, "",
            "Mean held-out answer KL: " + ", ".join(f"lr {lr:g}: {k:.3f}" for lr, k in sorted(scores.items()))
            + f". By the rule: **{chosen:g}**"
            + (" (at the end of the grid: a wider grid could do better)." if edge else ".")]


def fresh_lines(caches: dict, models, tasks) -> list[str]:
    """The fresh queries, scored once by the frozen default: every condition, the ratio and its target, the gain
    recovered, agreement with the full prompt beside the random control's, and locality."""
    rows = []
    for model in models:
        for t, r in new_rows(caches, model, tasks, "fresh").items():
            ratio, ci = ratio_ci(r)
            ok = ratio_met(r)[0]
            verdict = "n/a" if r["accuracy"]["full"] < ELIGIBLE else "met" if ok else "missed"
            gain, agree = r.get("gain_recovered", {}), r.get("agreement_with_full", {})
            kl, kept = r["locality_kl"], kept_of(r)
            rows.append(f"| {model} | {t}{' (selection)' if t in SELECT_TASKS else ''} | {r['n_test']} | "
                        + " | ".join(acc_ci(r, c) for c in ("none", "full", "patched", "distilled", "steering",
                                                             "control"))
                        + f" | {'–' if ratio is None else f'{ratio:.2f}'}"
                        + (f" [{ci[0]:.2f}–{ci[1]:.2f}]" if ci else "") + f" | {verdict} | "
                        + ("–" if gain.get("patched") is None else f"{gain['patched']:.2f}") + " | "
                        + " / ".join(pct(agree.get(c)) for c in ("patched", "control")) + " | "
                        + f"{kl['patched']:.3f} / {kl['control']:.3f} | {pct(kept['patched'])} / {pct(kept['control'])} |")
    if not rows:
        return []
    return ["", "**Fresh queries, scored once** (issue 22: the task builder's `fresh` split, read by no selection "
            "stage, scored by the frozen default in one run beside the test queries, with the same fitted edits). "
            "Accuracy [95% Wilson interval]; ratio patched/full with a paired bootstrap 95% interval (target: ≥ "
            f"{TARGET} with the lower bound ≥ {RATIO_LOWER}, where full ≥ {ELIGIBLE:.0%}; n/a below); gain recovered "
            "(patched − none) / (full − none); agreement: share of queries answered as the full prompt answers "
            "them, patched beside the random control; locality as in the test table (it does not depend on the "
            "split).", "",
            "| model | task | queries | none | full | patched | distilled | steering | control | patched/full | "
            "target | gain recovered | agreement with full, patched / control | locality KL patched / control | "
            "other task kept patched / control |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            *rows]
