"""``python -m experiments.thought``: thought patches on the shipped tasks → ``reports/eval_thought.md``.

For each embedded model and each shipped task (``icl_lens/thought/tasks/``), on the
held-out test queries: accuracy with no instruction, with the full instruction, with
the thought patch (default settings of :mod:`icl_lens.thought.fit`), with a random
control patch of the same norms and with a steering vector at its best layer, each
with a 95% Wilson interval; the patched/full ratio with a paired bootstrap interval;
the locality of every edit; the paper's settings (kind ``both``, λ = 0, no query prefix)
beside the default (before/after); test accuracy against the number of calibration
queries; the default fitted again with ``preserve`` rows (unrelated texts kept as the
unpatched model reads them) and what that does to accuracy and locality. Results are
cached per model in JSON next to the report, so runs can be split (``--models``) and
resumed; when the default settings change, a rerun recomputes the conditions that
depend on the patch and carries the others over (the earlier row is kept beside it).

``--select``: how the default settings were chosen, with no test query involved: on
each model and selection task, fit on the first 24 train queries and score the other 8
train queries by ``KL(full ‖ patched)`` at their last token; the setting with the
lowest mean over every (model, task) wins; then, second stage, that setting with
``answer_tokens`` ∈ {0, 4, 8} and, at 8, the ridge again (``SELECT_ANSWER_GRID``), scored
by the KL at every position that predicts the answer (teacher forced). ``--diagnose``: per-layer divergence and
attention to BOS / position 1 on one task, unpatched, paper patch and default patch.
``--paper-tasks`` / ``--curve-tasks`` / ``--preserve-tasks`` restrict the before/after
rows, the curves and the preserve rows to some tasks (none with an empty list: each costs
about a table row). ``--quick``: a tiny model, one task, few calibration queries (for tests).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from icl_lens.stats.bootstrap import bootstrap_ratio
from icl_lens.stats.intervals import wilson_interval
from experiments.report import command, machine, write_fragment
from icl_lens.model.loading import EMBEDDED_MODELS
from icl_lens.thought.tasks import SHIPPED_TASKS, Task, load_task

SIZES = (1, 2, 4, 8, 16, 32)
COMMAND = "python -m experiments.thought"
PAPER = {"kind": "both", "ridge": 0.0, "query_prefix": "", "answer_tokens": 0}  # Algorithm 1 as published
CURVE_TASKS = ("capitals", "antonyms")
SELECT_TASKS = ("capitals", "antonyms", "plus_one", "en_fr")
SELECT_GRID = (
    {"kind": "both", "ridge": 0.0, "query_prefix": ""},
    {"kind": "both", "ridge": 0.5, "query_prefix": "\n"},
    {"kind": "both+down", "ridge": 0.0, "query_prefix": "\n"},
    {"kind": "both+down", "ridge": 0.5, "query_prefix": "\n"},
    {"kind": "both+down", "ridge": 2.0, "query_prefix": "\n"},
    {"kind": "both+down", "ridge": 8.0, "query_prefix": "\n"},
    {"kind": "both+down", "ridge": 0.5, "query_prefix": ""},
)
# Measured on the first selection task only (cost), shown beside the grid, not eligible for the choice.
SELECT_EXTRA = ({"kind": "both+down", "ridge": 0.5, "query_prefix": "\n", "eta": 0.5, "iterations": 2},)
# Second stage: the first stage's winner with answer-token rows (answer_tokens), and the ridge again (more rows),
# scored at the answer's positions (the full model's own answer, at most SCORE_ANSWER_TOKENS tokens, teacher
# forced). Each entry overrides the first stage's setting.
STAGE_ONE = SELECT_GRID[4]  # the first stage's lowest setting (the report says whether it still is)
SELECT_ANSWER_GRID = ({"answer_tokens": 0}, {"answer_tokens": 4}, {"answer_tokens": 8},
                      {"answer_tokens": 8, "ridge": 0.5}, {"answer_tokens": 8, "ridge": 8.0},
                      {"answer_tokens": 8, "ridge": 32.0}, {"answer_tokens": 8, "ridge": 128.0})
SCORE_ANSWER_TOKENS = 8
SELECT_FIT, SELECT_VALIDATE = 24, 8
# Third stage: the second stage's winner fitted with and without preserve rows (the first PRESERVE_FIT preserve
# texts of the locality file), scored by the answer KL of the held-out train queries and by the next-token KL on
# the other preserve texts (never the locality measure's own texts). Preserve rows join the default when they lower
# that text KL and raise the mean answer KL by at most PRESERVE_TOLERANCE (relative).
PRESERVE_FIT, PRESERVE_TOLERANCE = 8, 0.10
PATCH_CONDITIONS = ("patched", "control")  # what a change of the patch settings recomputes
TARGET, ELIGIBLE = 0.9, 0.5  # patched ≥ 0.9 × full wherever full ≥ 50%
NOT_ELIGIBLE = f"n/a (full < {ELIGIBLE:.0%})"
QUICK = {"models": ["tiny-llama"], "tasks": ["capitals"], "n_train": 4, "sizes": (1, 2),
         "select_grid": SELECT_GRID[:2], "select_answer_grid": ({"answer_tokens": 0}, {"answer_tokens": 2}),
         "select_fit": 3, "select_validate": 2}


def _carry_over(old: dict, new: dict) -> dict:
    """A table row whose patch conditions come from ``new`` and the other conditions (which do not depend on
    the patch: none, full, steering) from ``old``; the steering layer goes with the steering condition."""
    kept = {"steering_layer"} if "steering" not in new["accuracy"] else set()
    row = {**old, **{k: v for k, v in new.items() if not isinstance(v, dict) and k not in kept}}
    for key, value in new.items():
        if isinstance(value, dict):
            row[key] = {**old.get(key, {}), **value}
    from icl_lens.thought.evaluate import agreement

    answers = row["answers"]
    row["agreement_with_full"] = {c: agreement(a, answers["full"]) for c, a in answers.items() if c != "full"}
    row["carried_over"] = [c for c in old["accuracy"] if c not in new["accuracy"]]
    return row


def _setting(s: dict) -> str:
    text = f"{s['kind']}, ridge {s['ridge']:g}, prefix {s['query_prefix']!r}"
    if s.get("answer_tokens"):
        text += f", answer tokens {s['answer_tokens']}"
    if s.get("iterations", 1) != 1 or s.get("eta", 1.0) != 1.0:
        text += f", η {s.get('eta', 1.0):g}, {s.get('iterations', 1)} sweeps"
    return text


def _cache_path(out: Path, model: str) -> Path:
    return out.with_name(f"{out.stem}.{model}.json")


def _cached(out: Path, model: str) -> dict:
    cache = _cache_path(out, model)
    return json.loads(cache.read_text()) if cache.exists() else {}


def run_model(model_name: str, tasks: list[str], curve_tasks: list[str], out: Path, run: str, *,
              paper_tasks: list[str] | None = None, preserve_tasks: list[str] = (),
              n_train: int | None = None, sizes=SIZES, select: bool = False, select_tasks=SELECT_TASKS,
              select_grid=SELECT_GRID, select_extra=SELECT_EXTRA, select_answer_grid=SELECT_ANSWER_GRID,
              select_fit: int = SELECT_FIT, select_validate: int = SELECT_VALIDATE,
              diagnose_task: str | None = None, table: bool = True, tune_tasks: list[str] | None = None) -> None:
    """Evaluate what the cache lacks; ``run`` (command and machine) is recorded with the keys it computed."""
    from icl_lens.model.loading import load_model
    from icl_lens.thought.diagnose import diagnose
    from icl_lens.thought.batches import text_ids, with_bos
    from icl_lens.thought.divergence import answer_kl, text_kl
    from icl_lens.thought.evaluate import evaluate_thought
    from icl_lens.thought.fit import (DEFAULT_ANSWER_TOKENS, DEFAULT_KIND, DEFAULT_QUERY_PREFIX, DEFAULT_RIDGE,
                                      thought_patch)
    from icl_lens.thought.locality import load_locality, locality_probe

    default = {"kind": DEFAULT_KIND, "ridge": DEFAULT_RIDGE, "query_prefix": DEFAULT_QUERY_PREFIX,
               "answer_tokens": DEFAULT_ANSWER_TOKENS}
    stage_one = {**STAGE_ONE, "answer_tokens": 0}
    cache, results = _cache_path(out, model_name), _cached(out, model_name)
    model = load_model(model_name)
    probe = None

    def store(key, value):
        results[key] = value
        runs = results.setdefault("runs", {})
        runs[run] = runs.get(run, []) + [key]
        cache.write_text(json.dumps(results, indent=1))

    jobs = []
    if table:  # the main table (with the paper's settings beside each task), then the curves
        for name in tasks:  # each task's paper row right after its table row
            jobs += [("table", name, None)] + ([("paper", name, None)] if paper_tasks is None or name in paper_tasks
                                               else [])
        jobs += [("curve", name, n) for name in tasks if name in curve_tasks for n in sizes]
        jobs += [("preserve", name, None) for name in tasks if name in preserve_tasks]
        jobs += [("tuned", name, None) for name in tasks]
    if select:
        jobs += [("select", name, i) for name in select_tasks for i in range(len(select_grid))]
        jobs += [("select", select_tasks[0], len(select_grid) + i) for i in range(len(select_extra))]
        jobs += [("answers", name, i) for name in select_tasks for i in range(len(select_answer_grid))]
        jobs += [("preserve-select", name, keep) for name in select_tasks for keep in (False, True)]
    if diagnose_task:
        jobs += [("diagnose", diagnose_task, None)]

    def current(key: str) -> bool:  # cached, and computed with the current default settings
        return key in results and _setting(results[key]) == _setting(default)

    def answer_selection(task, setting: dict) -> dict:
        """Fit on the first train queries, score the next ones at the answer's positions (cached)."""
        key = f"answers/{_setting(setting)}/{task.name}"
        if key not in results:
            fit, val = split(task)
            t0 = time.perf_counter()
            patch = thought_patch(model, task.instruction, fit, **setting)
            score = {"query_prefix": DEFAULT_QUERY_PREFIX, "answer_tokens": SCORE_ANSWER_TOKENS}
            store(key, {
                **setting, "task": task.name, "n_fit": len(fit), "n_validate": len(val),
                "validation_kl": answer_kl(model, task.instruction, val, patch, **score),
                "calibration_kl": answer_kl(model, task.instruction, fit, patch, **score),
                "validation_last_token_kl": answer_kl(model, task.instruction, val, patch,
                                                      query_prefix=DEFAULT_QUERY_PREFIX),
                "seconds": time.perf_counter() - t0})
        return results[key]

    def tune(name: str) -> bool:  # tasks tuned on their own: the given ones, else the missed targets
        if tune_tasks is not None:
            return name in tune_tasks
        r = results.get(f"table/{name}")
        return r is not None and _verdict(r, r["correct"]["patched"]) == "missed"

    def split(task):  # selection: fit on the first train queries, score the next ones (never test)
        return ([q for q, _ in task.train[:select_fit]],
                [q for q, _ in task.train[select_fit:select_fit + select_validate]])

    start = time.perf_counter()
    for job, name, arg in tqdm(jobs, desc=model_name):
        task = load_task(name)
        if job == "table" and not (current(f"table/{name}") and "answers" in results[f"table/{name}"]):
            probe = probe or locality_probe(model)
            old = results.get(f"table/{name}")
            if old is None or "answers" not in old:  # new, or from before the answers were kept: every condition
                new = evaluate_thought(model, task, n_train=n_train, locality=probe).to_dict(outcomes=True)
            else:  # the default changed: recompute what depends on the patch, carry over the rest
                new = _carry_over(old, evaluate_thought(model, task, n_train=n_train, locality=probe,
                                                        conditions=PATCH_CONDITIONS).to_dict(outcomes=True))
            if old is not None and _setting(old) != _setting(default):  # keep the earlier default's row
                store(f"earlier/{_setting(old)}/{name}", old)
            store(f"table/{name}", new)
        elif job == "paper" and f"paper/{name}" not in results:
            probe = probe or locality_probe(model)
            res = evaluate_thought(model, task, n_train=n_train, locality=probe, conditions=("none", "patched"), **PAPER)
            store(f"paper/{name}", res.to_dict(outcomes=True))
        elif job == "preserve" and not current(f"preserve/{name}"):
            probe = probe or locality_probe(model)
            res = evaluate_thought(model, task, n_train=n_train, locality=probe, conditions=("patched",),
                                   preserve=load_locality().preserve_texts)
            store(f"preserve/{name}", res.to_dict(outcomes=True))
        elif job == "curve" and arg <= len(task.train) and not current(f"curve/{name}/{arg}"):
            res = evaluate_thought(model, task, n_train=arg, conditions=("patched",), locality=False)
            store(f"curve/{name}/{arg}", res.to_dict(outcomes=True))
        elif job == "select":
            setting = (*select_grid, *select_extra)[arg]
            key = f"select/{_setting(setting)}/{name}"
            if key not in results:
                fit, val = split(task)
                t0 = time.perf_counter()
                patch = thought_patch(model, task.instruction, fit, **{"answer_tokens": 0, **setting})
                store(key, {**setting, "task": name, "n_fit": len(fit), "n_validate": len(val),
                            "validation_kl": answer_kl(model, task.instruction, val, patch,
                                                       query_prefix=setting["query_prefix"]),
                            "calibration_kl": answer_kl(model, task.instruction, fit, patch,
                                                        query_prefix=setting["query_prefix"]),
                            "seconds": time.perf_counter() - t0})
        elif job == "answers":
            answer_selection(task, stage_one | select_answer_grid[arg])
        elif job == "preserve-select" and f"preserve-select/{_setting(default)}/{arg}/{name}" not in results:
            texts = load_locality().preserve_texts
            fit, val = split(task)
            t0 = time.perf_counter()
            patch = thought_patch(model, task.instruction, fit, **default,
                                  preserve=texts[:PRESERVE_FIT] if arg else ())
            held_out = [with_bos(model, text_ids(model, t)) for t in texts[PRESERVE_FIT:]]
            score = {"query_prefix": DEFAULT_QUERY_PREFIX, "answer_tokens": SCORE_ANSWER_TOKENS}
            store(f"preserve-select/{_setting(default)}/{arg}/{name}", {
                **default, "task": name, "preserve": PRESERVE_FIT if arg else 0, "n_fit": len(fit),
                "n_validate": len(val), "n_texts_scored": len(held_out),
                "validation_kl": answer_kl(model, task.instruction, val, patch, **score),
                "text_kl": text_kl(model, held_out, patch), "seconds": time.perf_counter() - t0})
        elif job == "tuned" and tune(name):
            if not current(f"tuned/{name}"):
                scores = {_setting(s): (s, answer_selection(task, s)["validation_kl"])
                          for s in (default, *(stage_one | g for g in select_answer_grid))}
                chosen, _ = min(scores.values(), key=lambda sk: sk[1])
                t0 = time.perf_counter()
                probe = probe or locality_probe(model)
                res = (evaluate_thought(model, task, n_train=n_train, locality=probe, conditions=("patched",),
                                        **chosen).to_dict(outcomes=True)
                       if _setting(chosen) != _setting(default) else {})  # the default is this task's lowest
                store(f"tuned/{name}", {**default, "task": name, "chosen": chosen, "result": res,
                                        "validation_kl": {k: kl for k, (_, kl) in scores.items()},
                                        "seconds": time.perf_counter() - t0})
            if f"train/{name}" not in results:  # the instruction on the calibration queries themselves
                on_train = Task(task.name, task.instruction, task.train, task.train)
                store(f"train/{name}", evaluate_thought(model, on_train, conditions=("none", "full"),
                                                        locality=False).to_dict(outcomes=True))
        elif job == "diagnose" and f"diagnose/{name}" not in results:
            queries = {"train": [q for q, _ in task.train], "test": [q for q, _ in task.test]}
            frames = {}
            settings = (("unpatched, no prefix", None, ""), ("unpatched, default prefix", None, None),
                        ("paper patch", PAPER, ""), ("default patch", {}, None))
            for label, setting, prefix in settings:
                patch = None if setting is None else thought_patch(model, task.instruction, queries["train"], **setting)
                prefix = patch.query_prefix if patch is not None else (DEFAULT_QUERY_PREFIX if prefix is None else prefix)
                for split, qs in queries.items():
                    frames[f"{label}/{split}"] = diagnose(model, task.instruction, qs, patch,
                                                          query_prefix=prefix).to_frame().to_dict(orient="list")
            store(f"diagnose/{name}", frames)
    if jobs:
        store(f"seconds/{time.strftime('%Y-%m-%dT%H:%M:%S')}", {"jobs": len(jobs), "seconds": time.perf_counter() - start})


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def _acc_ci(r: dict, cond: str) -> str:
    if cond not in r["correct"]:
        return "–"
    low, high = wilson_interval(r["correct"][cond], r["n_test"])
    return f"{_pct(r['correct'][cond] / r['n_test'])} [{100 * low:.0f}–{100 * high:.0f}]"


def _ratio(r: dict) -> tuple[float | None, tuple[float, float] | None]:
    o = r.get("outcomes", {})
    if not r["correct"].get("full"):
        return None, None
    ratio = r["correct"]["patched"] / r["correct"]["full"]
    return ratio, bootstrap_ratio(o["patched"], o["full"]) if o else None


def _fmt_ratio(ratio, ci) -> str:
    if ratio is None:
        return "–"
    return f"{ratio:.2f}" + (f" [{ci[0]:.2f}–{ci[1]:.2f}]" if ci else "")


def write_report(out: Path, models: list[str], tasks: list[str], report_command: str,
                 select_tasks=SELECT_TASKS, answer_tokens: dict | None = None) -> str:
    """The report from the cached results; ``answer_tokens[(model, task)]``: tokens per test answer (optional),
    for the breakdown of the missed targets by answer length."""
    from icl_lens.thought.fit import DEFAULT_ANSWER_TOKENS, DEFAULT_KIND, DEFAULT_QUERY_PREFIX, DEFAULT_RIDGE
    from icl_lens.thought.locality import load_locality

    loc = load_locality()
    default = {"kind": DEFAULT_KIND, "ridge": DEFAULT_RIDGE, "query_prefix": DEFAULT_QUERY_PREFIX}
    caches = {m: _cached(out, m) for m in models}
    runs = [f"- {m}: {len(keys)} result(s) by {run}" for m in models for run, keys in caches[m].get("runs", {}).items()]
    runs += [f"- {m}: command and machine not recorded" for m in models
             if not caches[m].get("runs") and any(k != "runs" for k in caches[m])]
    lines = [
        "## Thought patches: prompts turned into weights (issues 5, 14)",
        "",
        f"Report written by `{report_command}` from the cached results `{_cache_path(out, '<model>').name}`, "
        "computed (float32) by:",
        "",
        *runs,
        "",
        "Method (Mazzawi, Dherin et al. 2025, arXiv 2510.08734, Algorithm 1, layer by layer; "
        "`icl_lens.thought.fit`). **Default settings** (the same for every task and model): "
        f"kind `{DEFAULT_KIND}`, η = 1, one sweep, scale-free ridge {DEFAULT_RIDGE:g} "
        "(λ = ridge · tr(Σ x xᵀ)/d of each fit's inputs), all train queries (32) as calibration, query prefix "
        f"{DEFAULT_QUERY_PREFIX!r} (the query-alone prompt is `[BOS] + prefix + query` at fit and at use), "
        + (f"answer tokens {DEFAULT_ANSWER_TOKENS} (the calibration rows also cover the first "
           f"{DEFAULT_ANSWER_TOKENS} tokens of the model's own greedy answer under the instruction, read after "
           "each calibration query up to its first newline: the positions where the patched model writes its "
           "answer). " if DEFAULT_ANSWER_TOKENS else "calibration rows at the query tokens only. ")
        + "Kind `both+down` is the paper's thought matrix and vector plus a least-squares fit, through the MLP's "
        "down projection, of the per-token block-output residual the constant vector leaves (an icl_lens "
        "extension; see the fit's docstring). Nothing is tuned per task. "
        "Accuracy on held-out test queries, greedy decoding, correct when the continuation (leading spaces "
        "stripped) starts with the answer; [95% Wilson interval]. *none*: query alone; *full*: few-shot "
        "instruction + query; *patched*: query alone, thought-patched model; *control*: query alone, random patch "
        "with the same per-layer norms; *steering*: query alone, mean residual difference (instruction+query − "
        "query alone, over the query tokens of the train queries) added after the block chosen by calibration KL "
        f"(layer in the table). Ratio = patched/full with a paired bootstrap 95% interval; target ≥ {TARGET} "
        f"where full ≥ {ELIGIBLE:.0%}. Locality: mean next-token KL(unpatched ‖ edited) in nats over "
        f"every position of {len(loc.texts)} fixed unrelated texts, and the share of the {len(loc.other_prompts)} "
        f"queries of a fixed other few-shot task ({loc.other_task}, read with its instruction) on which the edited "
        "model's answer (the first line of its greedy continuation) is the unpatched model's "
        "(`icl_lens/thought/tasks/locality.json`). When the default settings change, a rerun recomputes the "
        "conditions that depend on the patch (patched, control) and carries the others over (none, full, "
        "steering); *seconds* is the time of the run that computed the row's patch conditions.",
        "",
        "| model | task | none | full | patched | control | steering (layer) | patched/full | target | "
        "locality KL patched / control / steering | other task kept patched / control / steering | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts: dict[str, list[tuple[str, bool]]] = {}
    steering_wins, paper_rows = [], []
    for model in models:
        res = caches[model]
        for name in tasks:
            r = res.get(f"table/{name}")
            if r is None:
                continue
            ratio, ci = _ratio(r)
            verdict = _verdict(r, r["correct"]["patched"])
            if verdict != NOT_ELIGIBLE:
                verdicts.setdefault(model, []).append((name, verdict == "met"))
            kl, kept = r["locality_kl"], r["locality_accuracy"]
            lines.append(
                f"| {model} | {name} | {_acc_ci(r, 'none')} | {_acc_ci(r, 'full')} | {_acc_ci(r, 'patched')} | "
                f"{_acc_ci(r, 'control')} | {_acc_ci(r, 'steering')} ({r['steering_layer']}) | {_fmt_ratio(ratio, ci)} | "
                f"{verdict} | "
                f"{kl['patched']:.3f} / {kl['control']:.3f} / {kl['steering']:.3f} | "
                f"{_pct(kept['patched'])} / {_pct(kept['control'])} / {_pct(kept['steering'])} | {r['seconds']:.0f} |")
            steering_wins.append(r["accuracy"]["patched"] >= r["accuracy"]["steering"])
            p = res.get(f"paper/{name}")
            if p is not None:
                paper_rows.append((model, name, p, r))
    summary = []
    for model, v in verdicts.items():
        missed = [n for n, ok in v if not ok]
        summary.append(f"- {model}: target met on {sum(ok for _, ok in v)} of {len(v)} tasks where full ≥ "
                       f"{ELIGIBLE:.0%}" + (f"; missed: {', '.join(missed)}." if missed else "."))
    if steering_wins:
        summary.append(f"- The thought patch is at least as accurate as the steering vector on {sum(steering_wins)} "
                       f"of {len(steering_wins)} (model, task) pairs.")
    if paper_rows:
        diff = [r["correct"]["patched"] - p["correct"]["patched"] for _, _, p, r in paper_rows]
        summary.append(f"- Default against the paper's settings (patched test accuracy): higher on "
                       f"{sum(d > 0 for d in diff)}, equal on {sum(d == 0 for d in diff)}, lower on "
                       f"{sum(d < 0 for d in diff)} of {len(diff)} (model, task) pairs.")
    kls = {c: [caches[m][f"table/{t}"]["locality_kl"][c] for m in models for t in tasks if f"table/{t}" in caches[m]]
           for c in ("patched", "control", "steering")}
    if kls["patched"]:
        med = {c: float(np.median(v)) for c, v in kls.items()}
        kept = [caches[m][f"table/{t}"]["locality_accuracy"]["patched"] for m in models for t in tasks
                if f"table/{t}" in caches[m]]
        summary.append(f"- Locality: median KL on the unrelated texts {med['patched']:.3f} nats for the thought patch, "
                       f"{med['steering']:.3f} for the steering vector, {med['control']:.3f} for the random control; "
                       f"the patched model keeps ≥ 90% of the other task's answers on {sum(k >= 0.9 for k in kept)} of "
                       f"{len(kept)} (model, task) pairs (median {100 * float(np.median(kept)):.0f}%).")
    answerable = sorted({t for m in models for t in tasks if f"table/{t}" in caches[m]
                         and caches[m][f"table/{t}"]["accuracy"]["full"] >= ELIGIBLE})
    evaluated = sorted({t for m in models for t in tasks if f"table/{t}" in caches[m]})
    if evaluated:
        summary.append(f"- Answerable by the full instruction (full ≥ {ELIGIBLE:.0%}) on at least one model: "
                       f"{len(answerable)} of {len(evaluated)} evaluated tasks"
                       + (f"; not: {', '.join(t for t in evaluated if t not in answerable)}." if
                          len(answerable) < len(evaluated) else "."))
    for model in models:
        missing = [t for t in tasks if f"table/{t}" not in caches[model]]
        if missing:
            summary.append(f"- **Not evaluated** on {model} (no cached result): {', '.join(missing)}.")
    lines += ["", "Read from the table (rules: target as stated; counts over the rows above):", "", *summary]
    lines += _agreement_lines(caches, models, tasks)
    lines += _answer_length_lines(caches, models, tasks, answer_tokens or {})
    lines += _earlier_lines(caches, models, tasks)
    lines += _preserve_lines(caches, models, tasks, len(loc.preserve_texts))
    lines += _tuned_lines(caches, models, tasks)
    lines += _paper_lines(caches, default)
    if paper_rows:
        lines += ["", "**Before / after**: the paper's settings (kind `both`, ridge 0, no query prefix, the "
                  "query read right after BOS) against the default, same train and test queries. *none* is "
                  "the query alone in each setting's own format.", "",
                  "| model | task | full | none (paper format) | patched, paper | ratio | patched, default | ratio | "
                  "locality KL paper / default |", "|---|---|---|---|---|---|---|---|---|"]
        for model, name, p, r in paper_rows:
            lines.append(f"| {model} | {name} | {_acc_ci(r, 'full')} | {_acc_ci(p, 'none')} | {_acc_ci(p, 'patched')} | "
                         f"{_to_full(r, p['correct']['patched'])} | {_acc_ci(r, 'patched')} | "
                         f"{_to_full(r, r['correct']['patched'])} | {p['locality_kl']['patched']:.3f} / "
                         f"{r['locality_kl']['patched']:.3f} |")
    curves = {}
    for model in models:
        for name in tasks:
            pts = {n: caches[model][f"curve/{name}/{n}"] for n in SIZES if f"curve/{name}/{n}" in caches[model]}
            if pts:
                curves[(model, name)] = pts
    if curves:
        lines += ["", "Test accuracy of the patched model (default settings) against the number of calibration "
                  "queries (the first n train queries):", "",
                  "| model | task | " + " | ".join(str(n) for n in SIZES) + " |", "|---|---|" + "---|" * len(SIZES)]
        for (model, name), pts in curves.items():
            lines.append(f"| {model} | {name} | " + " | ".join(_acc_ci(pts[n], "patched") if n in pts else "–"
                                                               for n in SIZES) + " |")
    lines += _selection_lines(caches, default, select_tasks)
    lines += _answer_selection_lines(caches, select_tasks, {**default, "answer_tokens": DEFAULT_ANSWER_TOKENS})
    lines += _preserve_selection_lines(caches, select_tasks)
    lines += _diagnosis_lines(caches)
    timing = []
    for model in models:
        secs = [v["seconds"] for k, v in caches[model].items() if k.split("/", 1)[0] in ("table", "paper", "curve",
                                                                                          "preserve")]
        if secs:
            timing.append(f"{model} {sum(secs) / 60:.0f} min")
    if timing:
        lines += ["", "Compute, table + before/after + curves + preserve rows (sum of the per-result seconds; a "
                  f"carried-over row counts its recomputed conditions only): {'; '.join(timing)}."]
    return "\n".join(lines) + "\n"


AGREE_CONDITIONS = ("patched", "none", "steering", "control")


def _agreement_lines(caches: dict, models, tasks) -> list[str]:
    """Answer by answer against the full instruction: same answer (errors included), and the full model's
    wrong answers repeated; for every missed target a sentence read from these counts."""
    rows, notes = [], []
    n_all, wrong_all, same_all, repeated_all = 0, 0, Counter(), Counter()
    for model in models:
        for name in tasks:
            r = caches[model].get(f"table/{name}")
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
            rows.append(f"| {model} | {name} | {_acc_ci(r, 'full')} | "
                        + " | ".join(f"{same[c]}/{n}" for c in AGREE_CONDITIONS) + " | "
                        + (" / ".join(f"{repeated[c]}" for c in AGREE_CONDITIONS[:3]) + f" of {len(wrong)}"
                           if wrong else "–") + " |")
            if _verdict(r, r["correct"]["patched"]) == "missed":
                acc, ratio = r["accuracy"], _ratio(r)[0]
                note = (f"- {model}, {name} (missed, ratio {ratio:.2f}): the patched model gives the full "
                        f"instruction's answer on {same['patched']} of {n} test queries (no instruction: "
                        f"{same['none']}, steering: {same['steering']}) and repeats {repeated['patched']} of its "
                        f"{len(wrong)} wrong answers (no instruction: {repeated['none']})")
                if acc["none"] > acc["full"]:
                    note += (f"; here the instruction lowers accuracy (none {_pct(acc['none'])} > full "
                             f"{_pct(acc['full'])}), and the patch carries that effect too")
                train = caches[model].get(f"train/{name}")
                if train is not None:
                    note += (f"; on the {train['n_test']} train (calibration) queries the full instruction is right "
                             f"on {train['correct']['full']} ({_pct(train['accuracy']['full'])}; none "
                             f"{_pct(train['accuracy']['none'])})")
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


def _answer_length_lines(caches: dict, models, tasks, answer_tokens: dict) -> list[str]:
    """Where the target is missed: full and patched correct counts on one-token and longer answers."""
    rows = []
    for model in models:
        for name in tasks:
            r, n_tok = caches[model].get(f"table/{name}"), answer_tokens.get((model, name))
            if r is None or n_tok is None or "outcomes" not in r or _verdict(r, r["correct"]["patched"]) != "missed":
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


def _earlier_lines(caches: dict, models, tasks) -> list[str]:
    """The patched accuracy of each earlier default beside the current one (same test queries)."""
    rows = []
    for model in models:
        res = caches[model]
        for key, old in res.items():
            if not key.startswith("earlier/") or key.rsplit("/", 1)[1] not in tasks:
                continue
            name = key.rsplit("/", 1)[1]
            r = res.get(f"table/{name}")
            if r is None:
                continue
            rows.append(f"| {model} | {name} | {_setting(old)} | {_acc_ci(r, 'full')} | {_acc_ci(old, 'patched')} | "
                        f"{_to_full(r, old['correct']['patched'])} | {_acc_ci(r, 'patched')} | "
                        f"{_to_full(r, r['correct']['patched'])} | {old['locality_kl']['patched']:.3f} / "
                        f"{r['locality_kl']['patched']:.3f} |")
    if not rows:
        return []
    return ["", "**Earlier default against the current one** (same train and test queries; the earlier row was "
            "computed by the run that made it the default):", "",
            "| model | task | earlier default | full | patched, earlier | ratio | patched, now | ratio | "
            "locality KL earlier / now |", "|---|---|---|---|---|---|---|---|---|", *rows]


def _preserve_lines(caches: dict, models, tasks, n_texts: int) -> list[str]:
    """The default against the default fitted with preserve rows: accuracy bought against locality."""
    rows, kl, meets = [], {"default": [], "preserve": []}, {"default": 0, "preserve": 0, "eligible": 0}
    for model in models:
        for name in tasks:
            r, p = caches[model].get(f"table/{name}"), caches[model].get(f"preserve/{name}")
            if r is None or p is None:
                continue
            if r["accuracy"]["full"] >= ELIGIBLE:
                meets["eligible"] += 1
                meets["default"] += _verdict(r, r["correct"]["patched"]) == "met"
                meets["preserve"] += _verdict(r, p["correct"]["patched"]) == "met"
            kl["default"].append(r["locality_kl"]["patched"])
            kl["preserve"].append(p["locality_kl"]["patched"])
            rows.append(f"| {model} | {name} | {_acc_ci(r, 'full')} | {_acc_ci(r, 'patched')} | "
                        f"{_to_full(r, r['correct']['patched'])} | {_acc_ci(p, 'patched')} | "
                        f"{_to_full(r, p['correct']['patched'])} | {r['locality_kl']['patched']:.3f} / "
                        f"{p['locality_kl']['patched']:.3f} | {_pct(r['locality_accuracy']['patched'])} / "
                        f"{_pct(p['locality_accuracy']['patched'])} |")
    if not rows:
        return []
    med = {k: float(np.median(v)) for k, v in kl.items()}
    return ["", f"**Locality with preserve rows** (`thought_patch(preserve=...)`): the default fitted again with the "
            f"{n_texts} `preserve_texts` of the locality file (unrelated texts, none of them measured) as rows whose "
            "target is their own unpatched state, beside the default; the same test queries and locality measure.",
            "", "| model | task | full | patched | ratio | patched + preserve | ratio | locality KL default / preserve | "
            "other task kept default / preserve |", "|---|---|---|---|---|---|---|---|---|", *rows, "",
            f"Median locality KL {med['default']:.3f} nats for the default, {med['preserve']:.3f} with preserve rows; "
            f"target met on {meets['default']} (default) and {meets['preserve']} (preserve) of {meets['eligible']} "
            "eligible (model, task) pairs."]


def _to_full(r: dict, correct: int) -> str:
    """``correct`` test answers as a ratio to the row's full-instruction count ("–" when full has none)."""
    full = r["correct"]["full"]
    return f"{correct / full:.2f}" if full else "–"


def _verdict(r: dict, patched: int) -> str:
    """The target's verdict for ``patched`` correct test answers against the row's full instruction."""
    if r["accuracy"]["full"] < ELIGIBLE:
        return NOT_ELIGIBLE
    return "met" if patched / r["correct"]["full"] >= TARGET else "missed"


def _tuned_lines(caches: dict, models, tasks) -> list[str]:
    """Tuned per task, reported as such: where the default misses, the second-stage setting with the lowest
    held-out train answer KL on that task alone, and its test accuracy beside the default's."""
    rows = []
    for model in models:
        for name in tasks:
            t, r = caches[model].get(f"tuned/{name}"), caches[model].get(f"table/{name}")
            if t is None or r is None:
                continue
            kl = t["validation_kl"]
            chosen, default = _setting(t["chosen"]), _setting(t)
            res = t["result"] or r  # empty: the default is this task's lowest setting
            rows.append(f"| {model} | {name} | {chosen}{' (= default)' if chosen == default else ''} | "
                        f"{kl[default]:.3f} / {kl[chosen]:.3f} | {_acc_ci(r, 'full')} | {_acc_ci(r, 'patched')} | "
                        f"{_to_full(r, r['correct']['patched'])} | {_acc_ci(res, 'patched')} | "
                        f"{_to_full(r, res['correct']['patched'])} | {_verdict(r, res['correct']['patched'])} |")
    if not rows:
        return []
    return ["", "**Tuned per task** (not the default; reported as such): for each (model, task) where the default "
            "misses the target, every setting of the second selection stage fitted on that task's first "
            f"{SELECT_FIT} train queries and scored on the next {SELECT_VALIDATE} (never test) by the answer KL; the "
            "lowest is evaluated on the test queries.", "",
            "| model | task | tuned setting | held-out train answer KL default / tuned | full | patched, default | "
            "ratio | patched, tuned | ratio | target, tuned |", "|---|---|---|---|---|---|---|---|---|---|", *rows]


def _answer_selection_lines(caches: dict, select_tasks, default: dict) -> list[str]:
    """Second stage of the choice: answer-token rows (and the ridge again), scored at the answer's positions."""
    kl: dict[str, dict[str, list[float]]] = {}
    last: dict[str, list[float]] = {}
    for model, res in caches.items():
        for key, v in res.items():
            if key.startswith("answers/") and v["task"] in select_tasks:
                kl.setdefault(_setting(v), {}).setdefault(model, []).append(v["validation_kl"])
                last.setdefault(_setting(v), []).append(v["validation_last_token_kl"])
    if not kl:
        return []
    models = sorted({m for per in kl.values() for m in per})
    full = max(sum(len(x) for x in per.values()) for per in kl.values())
    means = {k: float(np.mean([x for xs in per.values() for x in xs])) for k, per in kl.items()
             if sum(len(x) for x in per.values()) == full}
    best = min(means, key=means.get)
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
                     f"{np.mean(last[k]):.4f} | {'lowest' if k == best else ''} |")
    lines += ["", f"The defaults in `icl_lens/thought/fit.py` ({_setting(default)}) "
              + ("are the lowest setting." if _setting(default) == best else f"differ from the lowest ({best}).")]
    return lines


def _preserve_selection_lines(caches: dict, select_tasks) -> list[str]:
    """Third stage of the choice: preserve rows or not, by held-out answer KL and held-out text KL."""
    got: dict[tuple[str, bool], dict[str, list[float]]] = {}
    for res in caches.values():
        for key, v in res.items():
            if key.startswith("preserve-select/") and v["task"] in select_tasks:
                cell = got.setdefault((_setting(v), bool(v["preserve"])), {"answer": [], "text": []})
                cell["answer"].append(v["validation_kl"])
                cell["text"].append(v["text_kl"])
    pairs = sorted({s for s, _ in got if (s, False) in got and (s, True) in got})
    if not pairs:
        return []
    lines = ["", f"**Preserve rows** (third stage of `{COMMAND} --select`): the second stage's setting fitted on the "
             f"same {SELECT_FIT} train queries with and without the first {PRESERVE_FIT} `preserve_texts` of the "
             "locality file as rows kept at their unpatched state; scored by the answer KL of the held-out train "
             "queries (as the second stage) and by the next-token KL(unpatched ‖ patched) on the other preserve "
             "texts (not the locality measure's texts); mean over models × selection tasks. Rule: preserve rows join "
             f"the default when they lower the text KL and raise the answer KL by at most {PRESERVE_TOLERANCE:.0%}.",
             "", "| setting | preserve rows | mean answer KL | mean held-out text KL | results |", "|---|---|---|---|---|"]
    for s in pairs:
        for keep in (False, True):
            c = got[(s, keep)]
            lines.append(f"| {s} | {PRESERVE_FIT if keep else 0} | {np.mean(c['answer']):.4f} | "
                         f"{np.mean(c['text']):.4f} | {len(c['answer'])} |")
        off, on = got[(s, False)], got[(s, True)]
        joins = (np.mean(on["text"]) < np.mean(off["text"])
                 and np.mean(on["answer"]) <= (1 + PRESERVE_TOLERANCE) * np.mean(off["answer"]))
        change = np.mean(on["answer"]) / np.mean(off["answer"]) - 1
        expected = len(caches) * len(select_tasks)
        verdict = (("**join** the default." if joins else "do **not** join the default.")
                   if len(on["answer"]) == len(off["answer"]) == expected else
                   f"no verdict yet ({min(len(on['answer']), len(off['answer']))} of {expected} results).")
        lines += ["", f"{s}: with preserve rows the answer KL changes by {change:+.1%} and the held-out text KL from "
                  f"{np.mean(off['text']):.3f} to {np.mean(on['text']):.3f} nats: by the rule preserve rows "
                  + verdict, ""]
    return lines[:-1]


def _paper_lines(caches: dict, default: dict) -> list[str]:
    """The paper's claim beside what the selection runs measured for its settings and for the default."""
    paper, ours = _setting(PAPER), _setting(default)
    cells = []
    for model, res in caches.items():
        got = {}
        for which, setting in (("paper", paper), ("default", ours)):
            vals = [v for k, v in res.items() if k.startswith("select/") and _setting(v) == setting
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


def _selection_lines(caches: dict, default: dict, select_tasks) -> list[str]:
    rows: dict[str, list[float]] = {}
    per: dict[tuple[str, str], dict[str, float]] = {}
    n_fit = n_val = None
    for model, res in caches.items():
        for key, v in res.items():
            if key.startswith("select/") and v["task"] in select_tasks:
                s = _setting(v)
                rows.setdefault(s, []).append(v["validation_kl"])
                per.setdefault((model, s), {})[v["task"]] = v["validation_kl"]
                n_fit, n_val = v["n_fit"], v["n_validate"]
    if not rows:
        return []
    counts = {s: len(v) for s, v in rows.items()}
    full = max(counts.values())
    means = {s: sum(v) / len(v) for s, v in rows.items() if len(v) == full}
    best = min(means, key=means.get)
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
        mark = "lowest" if s == best else ("" if s in means else f"{counts[s]} of {full} (model, task) only")
        lines.append(f"| {s} | " + " | ".join(cells) + f" | {means.get(s, float('nan')):.4f} | {mark} |")
    lines.append("")
    lines.append(f"The second stage starts from `STAGE_ONE` ({_setting(STAGE_ONE)}), "
                 + ("the lowest setting." if _setting(STAGE_ONE) == best else f"not the lowest ({best})."))
    return lines


def _diagnosis_lines(caches: dict) -> list[str]:
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


def _answer_tokens(out: Path, models: list[str], tasks: list[str]) -> dict:
    """Tokens per test answer (``" " + answer``) for every cached table row, read with each model's tokenizer."""
    from icl_lens.model.loading import load_model
    from icl_lens.thought.batches import text_ids

    counts = {}
    for model_name in models:
        names = [t for t in tasks if f"table/{t}" in _cached(out, model_name)]
        if not names:
            continue
        model = load_model(model_name)
        for name in names:
            counts[(model_name, name)] = [len(text_ids(model, " " + a.strip())) for _, a in load_task(name).test]
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(EMBEDDED_MODELS))
    p.add_argument("--tasks", nargs="+", default=list(SHIPPED_TASKS))
    p.add_argument("--curve-tasks", nargs="*", default=list(CURVE_TASKS),
                   help="tasks for the accuracy-against-calibration-size curve (none: no curve)")
    p.add_argument("--paper-tasks", nargs="*", default=None,
                   help="tasks on which the paper's settings are run beside the default (default: every task)")
    p.add_argument("--preserve-tasks", nargs="*", default=None,
                   help="tasks on which the default is also fitted with the locality file's preserve_texts "
                        "(default: every task)")
    p.add_argument("--out", default="reports/eval_thought.md")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the cores are shared)")
    p.add_argument("--select", action="store_true", help="also run the selection of the default settings")
    p.add_argument("--select-only", action="store_true", help="run only the selection (no table)")
    p.add_argument("--diagnose", metavar="TASK", default=None, help="also run the per-layer diagnosis on TASK")
    p.add_argument("--report-only", action="store_true", help="only assemble the report from cached results")
    p.add_argument("--quick", action="store_true", help="tiny-llama, one task, 4 calibration queries (tests)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = command(COMMAND, argv)
    q = QUICK if args.quick else {}
    models = q.get("models", args.models)
    tasks = q.get("tasks", args.tasks)
    curve_tasks = q.get("tasks", args.curve_tasks)[:1] if args.quick else args.curve_tasks
    if not args.report_only:
        for model in models:
            run_model(model, tasks, curve_tasks, out, f"`{cmd}` on {machine()}", n_train=q.get("n_train"),
                      paper_tasks=None if args.quick else args.paper_tasks,
                      preserve_tasks=tasks if args.preserve_tasks is None else args.preserve_tasks,
                      sizes=q.get("sizes", SIZES), select=args.select or args.select_only,
                      select_tasks=q.get("tasks", SELECT_TASKS), select_grid=q.get("select_grid", SELECT_GRID),
                      select_extra=() if args.quick else SELECT_EXTRA,
                      select_answer_grid=q.get("select_answer_grid", SELECT_ANSWER_GRID),
                      select_fit=q.get("select_fit", SELECT_FIT), select_validate=q.get("select_validate", SELECT_VALIDATE),
                      diagnose_task=args.diagnose, table=not args.select_only,
                      tune_tasks=q.get("tasks") if args.quick else None)
    report_tasks = tasks if args.quick else list(SHIPPED_TASKS)
    text = write_report(out, models, report_tasks, cmd, select_tasks=q.get("tasks", SELECT_TASKS),
                        answer_tokens=_answer_tokens(out, models, report_tasks))
    print(write_fragment(out, [text]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
