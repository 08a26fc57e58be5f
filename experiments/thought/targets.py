"""Issue 22's sections of the thought report: the four targets in one table, distillation beside the patch, the
composed patches and the preserve strength's selection. Every verdict is computed here from the cached rows."""
from __future__ import annotations

import numpy as np

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
    PRESERVE_TOLERANCE,
    RATIO_LOWER,
    SELECT_FIT,
    SELECT_TASKS,
    SELECT_VALIDATE,
    TARGET,
    TASKS_NEEDED,
    choose_strength,
    setting_name,
)

NOT_MEASURED = "not measured"


def new_rows(caches: dict, model: str, tasks) -> dict[str, dict]:
    """The model's table rows scored by issue 22's verdict (they keep whole continuations)."""
    return {t: r for t in tasks if (r := caches[model].get(f"table/{t}")) is not None and "continuations" in r}


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


def compose_rows(caches: dict, model: str, size: int, method: str = "added") -> list[tuple[str, dict, dict]]:
    """``(task, single patch's result, result at once)`` for every cached group of ``size`` tasks that holds
    ``method`` (``"added"``: the single patches' edits added; ``"joint"``: one fit over all their rows); each result
    has ``accuracy``, ``correct``, ``n_test`` and ``locality`` (the single patch's own, or the patch at once's)."""
    return [(t, c["per_task"][t]["single"], got) for c in compose_groups(caches, model, size)
            for t in dict.fromkeys(c["tasks"]) if (got := at_once(c, t, method)) is not None]


def compose_groups(caches: dict, model: str, size: int) -> list[dict]:
    """The model's cached composed groups of ``size`` tasks."""
    return [c for key, c in caches[model].items() if key.startswith("compose/") and len(c["tasks"]) == size]


def at_once(group: dict, task: str, method: str) -> dict | None:
    """``task``'s result with the group's patch at once by ``method``, with that patch's locality (None: not run)."""
    got = group if method == "added" else group.get(method)
    return None if got is None else {**got["per_task"][task], "locality": got["locality"]}


def compose_share(single: dict, at_once: dict) -> float | None:
    """The share of its single-patch accuracy a task keeps at once (None where the single patch has none)."""
    return at_once["accuracy"] / single["accuracy"] if single["accuracy"] else None


def targets_lines(caches: dict, models, tasks) -> list[str]:
    """The four targets of issue 22, one row per (target, model), whatever they are."""
    rows = []
    for model in models:
        got = new_rows(caches, model, tasks)
        eligible = {t: r for t, r in got.items() if r["accuracy"]["full"] >= ELIGIBLE}
        if not got:
            rows += [f"| {name} | {model} | {NOT_MEASURED} (no row scored by this verdict) | – |"
                     for name in ("accuracy", "locality", "against distillation", "two tasks at once")]
            continue
        met = {t: ratio_met(r) for t, r in eligible.items()}
        lows = [ci[0] for _, _, ci in met.values() if ci is not None]
        n_met = sum(ok for ok, _, _ in met.values())
        sel = [t for t in met if t in SELECT_TASKS]
        rows.append(f"| accuracy: patched ≥ {TARGET} × full, 95% lower bound ≥ {RATIO_LOWER}, on ≥ {TASKS_NEEDED} "
                    f"tasks | {model} | {n_met} of {len(eligible)} tasks with full ≥ {ELIGIBLE:.0%} ({len(got)} "
                    f"evaluated; selection tasks among them: {sum(met[t][0] for t in sel)} of {len(sel)}); median "
                    f"lower bound {np.median(lows) if lows else float('nan'):.2f} | "
                    f"{'met' if n_met >= TASKS_NEEDED else 'missed'} |")
        kl = [r["locality_kl"]["patched"] for r in got.values()]
        ctrl = [r["locality_kl"]["control"] for r in got.values()]
        kept = [kept_of(r)["patched"] for r in got.values()]
        n_loc = sum(locality_met(r) for r in got.values())
        rows.append(f"| locality: other task kept ≥ {LOCALITY_KEPT:.0%}, KL ≤ {LOCALITY_KL} nats and below the "
                    f"control | {model} | {n_loc} of {len(got)} tasks; median kept {pct(float(np.median(kept)))}, "
                    f"median KL {np.median(kl):.3f} (control {np.median(ctrl):.3f}) | "
                    f"{'met' if n_loc == len(got) else 'missed'} |")
        dist = {t: distill_met(r) for t, r in got.items() if "distilled" in r["accuracy"]}
        if dist:
            gaps = [g for _, g, _ in dist.values()]
            speeds = [s for _, _, s in dist.values() if s is not None]
            n_d = sum(ok for ok, _, _ in dist.values())
            rows.append(f"| against distillation: accuracy within {DISTILL_GAP} of it, ≥ {DISTILL_SPEEDUP:g}× less "
                        f"wall time | {model} | {n_d} of {len(dist)} tasks; patched − distilled accuracy median "
                        f"{np.median(gaps):+.2f} (min {min(gaps):+.2f}); distillation / patch time median "
                        f"{np.median(speeds):.1f}× | {'met' if n_d == len(dist) else 'missed'} |")
        else:
            rows.append(f"| against distillation | {model} | {NOT_MEASURED} | – |")
        by_method = {m: pairs for m in COMPOSE_METHODS if (pairs := compose_rows(caches, model, 2, m))}
        for method, pairs in by_method.items():
            shares = [compose_share(r, c) for _, r, c in pairs]
            ok = [s is not None and s >= COMPOSE_TARGET for s in shares]
            loc = pairs[0][2]["locality"]
            single = [r["locality"] for _, r, _ in pairs]
            rows.append(f"| two tasks at once ({COMPOSE_METHODS[method]}): each keeps ≥ {COMPOSE_TARGET} of its "
                        f"single-patch accuracy | {model} | {sum(ok)} of {len(ok)} tasks ("
                        + ", ".join(f"{t} {s:.2f}" if s is not None else f"{t} –" for (t, _, _), s in zip(pairs, shares))
                        + f"); locality KL {loc['kl']:.3f} at once (alone: "
                        + ", ".join(f"{x['kl']:.3f}" for x in single) + f"), other task kept {pct(loc['accuracy'])} "
                        "(alone: " + ", ".join(pct(x["accuracy"]) for x in single) + f") | "
                        f"{'met' if all(ok) else 'missed'} |")
        if not by_method:
            rows.append(f"| two tasks at once | {model} | {NOT_MEASURED} | – |")
    return ["", "**Issue 22's targets** (held-out test queries; a row only counts results scored by the boundary "
            "verdict: the answer followed by the end or a character that cannot continue a word; verdicts computed "
            "from the rows below):", "", "| target | model | result | verdict |", "|---|---|---|---|", *rows]


def distill_lines(caches: dict, models, tasks) -> list[str]:
    """The thought patch beside context distillation into the same parameters: accuracy, locality, wall time."""
    rows = []
    for model in models:
        for t, r in new_rows(caches, model, tasks).items():
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
    return ["", "**Against context distillation** (`icl_lens.thought.distill`: Adam on the same parameters — input "
            "maps, vectors, down projections — the same calibration rows and answer positions, minimising "
            "KL(prompted ‖ edited); schedule in `icl_lens.thought.defaults`). Gain recovered = (c − none) / "
            "(full − none).", "",
            "| model | task | none | full | patched | distilled | patched − distilled | gain recovered patched / "
            "distilled | locality KL patched / distilled | other task kept patched / distilled | seconds patched / "
            "distilled | time ratio |", "|---|---|---|---|---|---|---|---|---|---|---|---|", *rows]


def compose_lines(caches: dict, models) -> list[str]:
    """Every composed group: each task alone, with the edits added and with the joint fit (where run)."""
    rows = []
    for model in models:
        for size in sorted({len(g) for g in COMPOSE_GROUPS} | {len(c["tasks"]) for k, c in caches[model].items()
                                                                if k.startswith("compose/")}):
            for group in compose_groups(caches, model, size):
                for t in dict.fromkeys(group["tasks"]):
                    r = group["per_task"][t]["single"]
                    cells = []
                    for got in (at_once(group, t, m) for m in COMPOSE_METHODS):
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
    return ["", "**Composed patches** (2 or 4 tasks applied at once, each task scored on its own test queries; "
            "two ways, both run for every group and shown side by side, none chosen: *added*, "
            "`ThoughtPatch.composed`, the default single patches' edits added; *joint*, `thought_patch_joint`, one "
            "fit with the default settings over all the tasks' calibration rows, each task's queries read after its "
            "own instruction):", "",
            "| model | tasks at once | task | patched alone | added | joint | share of alone added / joint | "
            "locality KL alone / added / joint | other task kept alone / added / joint |",
            "|---|---|---|---|---|---|---|---|---|", *rows]


def strength_lines(caches: dict, select_tasks) -> list[str]:
    """Third selection stage: the preserve penalty's strength, by held-out answer KL and held-out sample KL."""
    got: dict[float, dict[str, list[float]]] = {}
    for res in caches.values():
        for key, v in res.items():
            if key.startswith("strength/") and v["task"] in select_tasks:
                cell = got.setdefault(float(v["preserve_strength"]), {"answer": [], "text": []})
                cell["answer"].append(v["validation_kl"])
                cell["text"].append(v["text_kl"])
    if not got:
        return []
    full = max(len(c["answer"]) for c in got.values())
    scores = {s: (float(np.mean(c["answer"])), float(np.mean(c["text"]))) for s, c in got.items()
              if len(c["answer"]) == full}
    lines = ["", f"**Preserve strength** (third stage of `{COMMAND} --select`): the default fitted on the first "
             f"{SELECT_FIT} train queries of each selection task with the preserve penalty (the model's own samples "
             "from BOS, first half) at each strength; scored by the answer KL of the next "
             f"{SELECT_VALIDATE} train queries and by the next-token KL(unpatched ‖ patched) on the held-out samples "
             "(second half; never the locality measure's texts); mean over models × tasks. Rule: the lowest text KL "
             f"among the strengths whose answer KL is at most {1 + PRESERVE_TOLERANCE:g} × strength 0's.", "",
             "| strength | mean answer KL | mean held-out text KL | results |", "|---|---|---|---|"]
    for s in sorted(got):
        c = got[s]
        lines.append(f"| {s:g} | {np.mean(c['answer']):.4f} | {np.mean(c['text']):.4f} | {len(c['answer'])} |")
    if 0.0 in scores:
        lines += ["", f"By the rule: strength **{choose_strength(scores):g}**."]
    return lines


