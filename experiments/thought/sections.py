"""The thought report's sections, each read from the cached results of every model."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from experiments.thought.settings import (
    COMMAND,
    ELIGIBLE,
    PAPER,
    SCORE_ANSWER_TOKENS,
    SELECT_FIT,
    SELECT_TASKS,
    SELECT_VALIDATE,
    STAGE_ONE,
    default_fit,
    setting_name,
)
from experiments.thought.cache import fit_of, row_key
from experiments.thought.rule import near_tie, target_rule, with_patched
from icl_lens.stats import wilson_interval


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def kept_of(r: dict) -> dict:
    """Other-task answers kept per edit (``locality_kept``; rows from before issue 22: ``locality_accuracy``)."""
    return r.get("locality_kept", r.get("locality_accuracy", {}))


def total_seconds(r: dict) -> float:
    """A row's wall time: ``seconds["total"]`` (else the sum of its parts; rows from before issue 22: a number)."""
    s = r.get("seconds", 0.0)
    return float(s.get("total", sum(s.values())) if isinstance(s, dict) else s)


def acc_ci(r: dict, cond: str) -> str:
    if cond not in r["correct"]:
        return "–"
    low, high = wilson_interval(r["correct"][cond], r["n_test"])
    return f"{pct(r['correct'][cond] / r['n_test'])} [{100 * low:.0f}–{100 * high:.0f}]"


def tie_marks(units: dict, best) -> dict:
    """Per setting of a selection stage (``units[setting] = {(model, task): score}``, lower is better), whether it is
    a near tie with ``best`` by :func:`rule.near_tie` (``best`` itself: False)."""
    return {s: s != best and near_tie(units[best], u) for s, u in units.items()}


def tie_sentence(ties: dict, what: str = "setting") -> str:
    """The sentence a selection stage's choice carries when other settings tie with it (empty when none does)."""
    tied = [f"{s:g}" if isinstance(s, float) else str(s) for s, t in ties.items() if t]
    return (f" Near tie (paired bootstrap 95% interval of the mean difference over the (model, task) units includes "
            f"0, `experiments/thought/rule.py`) with: {'; '.join(tied)}; the choice among them is within the noise "
            f"of the {what}s' measurements." if tied else "")


AGREE_CONDITIONS = ("patched", "none", "steering", "control")


def agreement_lines(caches: dict, models, tasks) -> list[str]:
    """Answer by answer against the full instruction: same answer (errors included), and the full model's
    wrong answers repeated; for every missed target a sentence read from these counts."""
    rows, notes = [], []
    n_all, wrong_all, same_all, repeated_all = 0, 0, Counter(), Counter()
    for model in models:
        for name in tasks:
            r = caches[model].get(row_key("table", default_fit(), name))
            if r is None or "answers" not in r:
                continue
            answers, full_ok = r["answers"], r["outcomes"]["full"]
            wrong = [i for i, ok in enumerate(full_ok) if not ok]
            same = {c: sum(x == y for x, y in zip(answers[c], answers["full"])) for c in AGREE_CONDITIONS}
            repeated = {c: sum(answers[c][i] == answers["full"][i] for i in wrong) for c in AGREE_CONDITIONS}
            n = r["n_test"]
            n_all, wrong_all = n_all + n, wrong_all + len(wrong)
            same_all.update(same)
            repeated_all.update(repeated)
            rows.append(f"| {model} | {name} | {acc_ci(r, 'full')} | "
                        + " | ".join(f"{same[c]}/{n}" for c in AGREE_CONDITIONS) + " | "
                        + (" / ".join(f"{repeated[c]}" for c in AGREE_CONDITIONS[:3]) + f" of {len(wrong)}"
                           if wrong else "–") + " |")
            if (rule := target_rule(r)).verdict == "missed":
                acc = r["accuracy"]
                note = (f"- {model}, {name} (missed, ratio {rule.text()}): the patched model gives the full "
                        f"instruction's answer on {same['patched']} of {n} test queries (no instruction: "
                        f"{same['none']}, steering: {same['steering']}) and repeats {repeated['patched']} of its "
                        f"{len(wrong)} wrong answers (no instruction: {repeated['none']})")
                if acc["none"] > acc["full"]:
                    note += (f"; here the instruction lowers accuracy (none {pct(acc['none'])} > full "
                             f"{pct(acc['full'])}), and the patch carries that effect too")
                train = caches[model].get(f"train/{name}")
                if train is not None:
                    note += (f"; on the {train['n_test']} train (calibration) queries the full instruction is right "
                             f"on {train['correct']['full']} ({pct(train['accuracy']['full'])}; none "
                             f"{pct(train['accuracy']['none'])})")
                notes.append(note + ".")
    if not rows:
        return []
    share = (lambda k, n: f"{k} ({100 * k / n:.0f}%)" if n else f"{k}")
    notes.insert(0, f"- Over the {len(rows)} (model, task) pairs above: the full instruction's answer is given on "
                 + ", ".join(f"{share(same_all[c], n_all)} by {c}" for c in AGREE_CONDITIONS)
                 + f" of {n_all} test queries; of its {wrong_all} wrong answers, "
                 + ", ".join(f"{share(repeated_all[c], wrong_all)} by {c}" for c in AGREE_CONDITIONS)
                 + " are repeated.")
    return ["", "**Answer by answer against the full instruction** (a thought patch is fitted to imitate the "
            "model with the instruction in context, wrong answers included, so accuracy alone does not say how much "
            "of the instruction it carries): on how many test queries each query-alone condition gives the full "
            "instruction's answer (the greedy continuation up to the token where right or wrong is settled), and how "
            "many of the full instruction's wrong answers it repeats.", "",
            "| model | task | full | " + " | ".join(f"{c} = full" for c in AGREE_CONDITIONS)
            + " | full's wrong answers repeated: patched / none / steering |",
            "|---|---|---|" + "---|" * len(AGREE_CONDITIONS) + "---|", *rows,
            "", *notes]


def answer_length_lines(caches: dict, models, tasks, answer_tokens: dict) -> list[str]:
    """Where the target is missed: full and patched correct counts on one-token and longer answers."""
    rows = []
    for model in models:
        for name in tasks:
            r, n_tok = caches[model].get(row_key("table", default_fit(), name)), answer_tokens.get((model, name))
            if r is None or n_tok is None or "outcomes" not in r or target_rule(r).verdict != "missed":
                continue
            o = r["outcomes"]
            for label, keep in (("1", lambda n: n == 1), ("≥ 2", lambda n: n > 1)):
                sel = [i for i, n in enumerate(n_tok) if keep(n)]
                if sel:
                    full, pat = sum(o["full"][i] for i in sel), sum(o["patched"][i] for i in sel)
                    rows.append(f"| {model} | {name} | {label} | {len(sel)} | {full} | {pat} | "
                                f"{f'{pat / full:.2f}' if full else '–'} |")
    if not rows:
        return []
    return ["", "**Missed targets by answer length** (tokens of the answer as it follows a space, in the model's "
            "tokenizer; counts of correct test queries). Gemma 3 and SmolLM2 write numbers digit by digit, so "
            "every two-digit arithmetic answer has two or more tokens. A one-token row below the target is a loss "
            "that answer length does not explain.", "",
            "| model | task | answer tokens | n | full | patched | patched/full |", "|---|---|---|---|---|---|---|",
            *rows]


def earlier_lines(caches: dict, models, tasks) -> list[str]:
    """The patched accuracy of each earlier default beside the current one (same test queries)."""
    rows, current = [], default_fit().key()
    for model in models:
        res = caches[model]
        for key, old in res.items():  # rows of earlier defaults: kept aside, or under another fit's key
            earlier = key.startswith("earlier/") or (key.startswith("table/") and fit_of(key) != current)
            if not earlier or key.rsplit("/", 1)[1] not in tasks:
                continue
            name = key.rsplit("/", 1)[1]
            r = res.get(row_key("table", default_fit(), name))
            if r is None:
                continue
            rows.append(f"| {model} | {name} | {setting_name(old)} | {acc_ci(r, 'full')} | {acc_ci(old, 'patched')} | "
                        f"{to_full(r, old['correct']['patched'])} | {acc_ci(r, 'patched')} | "
                        f"{to_full(r, r['correct']['patched'])} | {old['locality_kl']['patched']:.3f} / "
                        f"{r['locality_kl']['patched']:.3f} |")
    if not rows:
        return []
    return ["", "**Earlier default against the current one** (same train and test queries; the earlier row was "
            "computed by the run that made it the default):", "",
            "| model | task | earlier default | full | patched, earlier | ratio | patched, now | ratio | "
            "locality KL earlier / now |", "|---|---|---|---|---|---|---|---|---|", *rows]


def to_full(r: dict, correct: int) -> str:
    """``correct`` test answers as a ratio to the row's full-instruction count ("–" when full has none)."""
    full = r["correct"]["full"]
    return f"{correct / full:.2f}" if full else "–"


def tuned_lines(caches: dict, models, tasks) -> list[str]:
    """Tuned per task, reported as such: where the default misses, the second-stage setting with the lowest
    held-out train answer KL on that task alone, and its test accuracy beside the default's (tunings made against
    another default are under another key, left out)."""
    rows = []
    for model in models:
        for name in tasks:
            t = caches[model].get(row_key("tuned", default_fit(), name))
            r = caches[model].get(row_key("table", default_fit(), name))
            if t is None or r is None:
                continue
            kl = t["validation_kl"]
            chosen, default = t.get("chosen_name", setting_name(t["chosen"])), setting_name(t)
            res = t["result"] or r  # empty: the default is this task's lowest setting
            rows.append(f"| {model} | {name} | {chosen}{' (= default)' if chosen == default else ''} | "
                        f"{kl[default]:.3f} / {kl[chosen]:.3f} | {acc_ci(r, 'full')} | {acc_ci(r, 'patched')} | "
                        f"{to_full(r, r['correct']['patched'])} | {acc_ci(res, 'patched')} | "
                        f"{to_full(r, res['correct']['patched'])} | {target_rule(with_patched(r, res)).verdict} |")
    if not rows:
        return []
    return ["", "**Tuned per task** (not the default; reported as such): for each (model, task) where the default "
            "misses the target, every setting of the second selection stage fitted on that task's first "
            f"{SELECT_FIT} train queries and scored on the next {SELECT_VALIDATE} (never test) by the answer KL; the "
            "lowest is evaluated on the test queries.", "",
            "| model | task | tuned setting | held-out train answer KL default / tuned | full | patched, default | "
            "ratio | patched, tuned | ratio | target, tuned |", "|---|---|---|---|---|---|---|---|---|---|", *rows]


def answer_selection_lines(caches: dict, select_tasks, default: dict) -> list[str]:
    """Second stage of the choice: answer-token rows (and the ridge again), scored at the answer's positions."""
    kl: dict[str, dict[str, list[float]]] = {}
    last: dict[str, list[float]] = {}
    units: dict[str, dict[tuple, float]] = {}
    for model, res in caches.items():
        for key, v in res.items():
            if key.startswith("answers/") and v["task"] in select_tasks:
                kl.setdefault(setting_name(v), {}).setdefault(model, []).append(v["validation_kl"])
                units.setdefault(setting_name(v), {})[(model, v["task"])] = v["validation_kl"]
                last.setdefault(setting_name(v), []).append(v["validation_last_token_kl"])
    if not kl:
        return []
    models = sorted({m for per in kl.values() for m in per})
    full = max(sum(len(x) for x in per.values()) for per in kl.values())
    means = {k: float(np.mean([x for xs in per.values() for x in xs])) for k, per in kl.items()
             if sum(len(x) for x in per.values()) == full}
    best = min(means, key=means.get)
    ties = tie_marks({k: units[k] for k in means}, best)
    lines = ["", f"**Answer-token rows** (second stage of `{COMMAND} --select`): the first stage's lowest setting "
             "fitted with its calibration rows extended by the first k tokens of the model's own greedy answer "
             "under the instruction (teacher forced), and with k = 8 the ridge again (the fit has more rows); the "
             "held-out train queries scored by KL(full ‖ patched) at every position that predicts their answer "
             f"(the full model's own, ≤ {SCORE_ANSWER_TOKENS} tokens, up to its first newline, read by both), and "
             "at the last query token alone as in the first stage; lowest mean answer KL wins.", "",
             "| setting | " + " | ".join(f"{m} answer KL" for m in models) + " | mean answer KL | "
             "mean last-token KL | |", "|---|" + "---|" * len(models) + "---|---|---|"]
    for k in sorted(kl, key=lambda k: means.get(k, math.inf)):
        cells = [f"{np.mean(kl[k][m]):.3f}" if m in kl[k] else "–" for m in models]
        lines.append(f"| {k} | " + " | ".join(cells) + f" | {means.get(k, float('nan')):.4f} | "
                     f"{np.mean(last[k]):.4f} | {'lowest' if k == best else 'near tie' if ties.get(k) else ''} |")
    lines += ["", f"The defaults in `icl_lens/thought/_fit.py` ({setting_name(default)}) "
              + ("are the lowest setting." if setting_name(default) == best else f"differ from the lowest ({best}).")
              + tie_sentence(ties)]
    return lines


def paper_lines(caches: dict, default: dict) -> list[str]:
    """The paper's claim beside what the selection runs measured for its settings and for the default."""
    paper, ours = setting_name(PAPER), setting_name(default)
    cells = []
    for model, res in caches.items():
        got = {}
        for which, setting in (("paper", paper), ("default", ours)):
            vals = [v for k, v in res.items() if k.startswith("select/") and setting_name(v) == setting
                    and v["task"] in SELECT_TASKS]
            if vals:
                got[which] = (float(np.mean([v["calibration_kl"] for v in vals])),
                              float(np.mean([v["validation_kl"] for v in vals])), len(vals))
        if len(got) == 2:
            (pc, pv, n), (dc, dv, _) = got["paper"], got["default"]
            cells.append(f"{model}: paper's settings KL {pc:.3f} on their own calibration queries and {pv:.3f} on "
                         f"held-out train queries, the default's kind, ridge and prefix {dc:.3f} / {dv:.3f} (mean over "
                         f"{n} selection tasks)")
    if not cells:
        return []
    return ["", "**Against the paper.** Mazzawi, Dherin et al. (arXiv 2510.08734) report the patched Gemma 3 1B "
            "instruction-tuned model, without the instruction, at 100% on arithmetic with 10 calibration examples, "
            "equal to the full prompt, and close to the full prompt on translation and capitals. Here the models are "
            "smaller (Gemma 3 270M base, SmolLM2-135M-Instruct), the test queries are held out from calibration, "
            "and locality is measured. Why the paper's Algorithm 1 falls short here, from the selection runs "
            "(KL(full ‖ patched) at the last token): " + "; ".join(cells) + ". A large KL on the calibration "
            "queries themselves means the fit cannot represent the instruction's effect (the per-token "
            "skip-connection residual that one constant thought vector cannot carry; on SmolLM2 also the query's "
            "first token turning into a second attention sink when it sits at position 1); a small calibration KL "
            "with a larger held-out KL means it fits the calibration tokens and generalises only partly "
            "(with λ = 0 and fewer calibration tokens than d_model the matrix interpolates them). The default "
            "addresses the first with the down-projection fit and the newline query prefix, the second with the "
            "ridge; the answer-token rows then cover the positions where the answer is written (the KL there is "
            "in the second selection stage below); what remains is in the table above."]


def selection_lines(caches: dict, default: dict, select_tasks) -> list[str]:
    rows: dict[str, list[float]] = {}
    per: dict[tuple[str, str], dict[str, float]] = {}
    n_fit = n_val = None
    for model, res in caches.items():
        for key, v in res.items():
            if key.startswith("select/") and v["task"] in select_tasks:
                s = setting_name(v)
                rows.setdefault(s, []).append(v["validation_kl"])
                per.setdefault((model, s), {})[v["task"]] = v["validation_kl"]
                n_fit, n_val = v["n_fit"], v["n_validate"]
    if not rows:
        return []
    counts = {s: len(v) for s, v in rows.items()}
    full = max(counts.values())
    means = {s: sum(v) / len(v) for s, v in rows.items() if len(v) == full}
    best = min(means, key=means.get)
    ties = tie_marks({s: {(m, t): x for (m, s2), per_task in per.items() if s2 == s for t, x in per_task.items()}
                      for s in means}, best)
    models = sorted({m for m, _ in per})
    lines = ["", f"**Choice of the default** (`{COMMAND} --select`): fit on the first {n_fit} train queries, "
             f"score the next {n_val} train queries (never test) by KL(full ‖ patched) at their last token; mean "
             f"over models × selection tasks ({', '.join(select_tasks)}); lowest wins (rule applied to settings "
             "measured on every (model, task)).", "",
             "| setting | " + " | ".join(f"{m} mean KL" for m in models) + " | mean KL | |",
             "|---|" + "---|" * len(models) + "---|---|"]
    for s in sorted(rows, key=lambda s: means.get(s, math.inf)):
        cells = []
        for m in models:
            vals = list(per.get((m, s), {}).values())
            cells.append(f"{sum(vals) / len(vals):.3f}" if vals else "–")
        mark = ("lowest" if s == best else "near tie" if ties.get(s) else
                "" if s in means else f"{counts[s]} of {full} (model, task) only")
        lines.append(f"| {s} | " + " | ".join(cells) + f" | {means.get(s, float('nan')):.4f} | {mark} |")
    lines.append("")
    lines.append(f"The second stage starts from `STAGE_ONE` ({setting_name(STAGE_ONE)}), "
                 + ("the lowest setting." if setting_name(STAGE_ONE) == best else f"not the lowest ({best}).")
                 + tie_sentence(ties))
    return lines


def diagnosis_lines(caches: dict) -> list[str]:
    lines = []
    for model, res in caches.items():
        for key, frames in res.items():
            if not key.startswith("diagnose/"):
                continue
            task = key.split("/", 1)[1]
            labels = list(dict.fromkeys(k.rsplit("/", 1)[0] for k in frames))
            n_layers = len(next(iter(frames.values()))["layer"])
            show = sorted(l for l in {0, 1, 2, 3, 5, n_layers // 2, n_layers - 2, n_layers - 1} if 0 <= l < n_layers)
            lines += ["", f"**Diagnosis, {model}, {task}** (`{COMMAND} --diagnose {task}`): per layer, the last query "
                      "token's block output in the query-alone pass against the full-instruction pass, "
                      "‖o − O‖/‖O‖ (mean over queries; calibration = train, held out = test); the attention the "
                      "last query token pays to BOS and to position 1, and the block-output norm at position 1, "
                      "in the query-alone pass (test queries); in context the query's first token has norm "
                      "*ctx norm*.", "",
                      "| setting | " + " | ".join(f"L{l}" for l in show) + " |", "|---|" + "---|" * len(show)]
            for label in labels:
                for split in ("train", "test"):
                    f = frames[f"{label}/{split}"]
                    lines.append(f"| {label}: divergence ({'calibration' if split == 'train' else 'held out'}) | "
                                 + " | ".join(f"{f['divergence'][l]:.2f}" for l in show) + " |")
                f = frames[f"{label}/test"]
                lines.append(f"| {label}: attention to BOS / position 1 | "
                             + " | ".join(f"{f['attn_bos'][l]:.2f} / {f['attn_pos1'][l]:.2f}" for l in show) + " |")
                lines.append(f"| {label}: norm at position 1 (ctx norm) | "
                             + " | ".join(f"{f['norm_pos1'][l]:.0f} ({f['norm_qfirst_context'][l]:.0f})" for l in show)
                             + " |")
    return lines
