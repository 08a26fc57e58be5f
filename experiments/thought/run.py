"""``python -m experiments.thought``: the report from the cached results, and the command line (see the
package docstring)."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from experiments.report import command, machine, write_fragment
from experiments.thought.cache import cache_path, cached, current_row, fit_of, row_key
from experiments.thought.jobs import run_model
from experiments.thought.method import (NULL_SPACE_GRID, QUICK_NULL_SPACE_GRID, equal_distill_lines, null_space_lines,
                                        untouched_lines)
from experiments.thought.targets import (
    compose_lines,
    distill_lines,
    distill_lr_lines,
    fresh_lines,
    strength_lines,
    targets_lines,
)
from experiments.thought.rule import target_rule
from experiments.thought.sections import (
    acc_ci,
    agreement_lines,
    answer_length_lines,
    answer_selection_lines,
    diagnosis_lines,
    earlier_lines,
    kept_of,
    paper_lines,
    pct,
    selection_lines,
    to_full,
    total_seconds,
    tuned_lines,
)
from experiments.thought.settings import (
    COMMAND,
    ELIGIBLE,
    RATIO_LOWER,
    QUICK,
    SELECT_ANSWER_GRID,
    SELECT_EXTRA,
    SELECT_FIT,
    SELECT_GRID,
    SELECT_TASKS,
    SELECT_VALIDATE,
    SIZES,
    TARGET,
    COMPOSE_GROUPS,
    CURVE_TASKS,
    DISTILL_LRS,
    PRESERVE_STRENGTHS,
    default_fit,
    paper_fit,
)
from icl_lens.model import EMBEDDED_MODELS
from icl_lens.thought.tasks import SHIPPED_TASKS, load_task


def write_report(out: Path, models: list[str], tasks: list[str], report_command: str,
                 select_tasks=SELECT_TASKS, answer_tokens: dict | None = None) -> str:
    """The report from the cached results; ``answer_tokens[(model, task)]``: tokens per test answer (optional),
    for the breakdown of the missed targets by answer length."""
    from icl_lens.thought import (
        DEFAULT_ANSWER_TOKENS,
        DEFAULT_KIND,
        DEFAULT_PRESERVE_STRENGTH,
        DEFAULT_QUERY_PREFIX,
        DEFAULT_RIDGE,
    )
    from icl_lens.thought import load_locality
    from icl_lens.thought import few_shot_texts

    loc = load_locality()
    default = {"kind": DEFAULT_KIND, "ridge": DEFAULT_RIDGE, "query_prefix": DEFAULT_QUERY_PREFIX}
    caches = {m: cached(out, m) for m in models}
    runs = [f"- {m}: {len(keys)} result(s) by {run}" for m in models for run, keys in caches[m].get("runs", {}).items()]
    runs += [f"- {m}: command and machine not recorded" for m in models
             if not caches[m].get("runs") and any(k != "runs" for k in caches[m])]
    lines = [
        "## Thought patches: prompts turned into weights (issues 5, 14, 22)",
        *targets_lines(caches, models, tasks),
        "",
        f"Report written by `{report_command}` from the cached results `{cache_path(out, '<model>').name}`, "
        "computed (float32) by:",
        "",
        *runs,
        "",
        "Method (Mazzawi, Dherin et al. 2025, arXiv 2510.08734, Algorithm 1, layer by layer; "
        "`icl_lens.thought.thought_patch`). **Default settings** (the same for every task and model): "
        f"kind `{DEFAULT_KIND}`, η = 1, one sweep, scale-free ridge {DEFAULT_RIDGE:g} "
        "(λ = ridge · tr(Σ x xᵀ)/d of each fit's inputs), all train queries (32) as calibration, query prefix "
        f"{DEFAULT_QUERY_PREFIX!r} (the query-alone prompt is `[BOS] + prefix + query` at fit and at use), "
        + (f"answer tokens {DEFAULT_ANSWER_TOKENS} (the calibration rows also cover the first "
           f"{DEFAULT_ANSWER_TOKENS} tokens of the model's own greedy answer under the instruction, read after "
           "each calibration query up to its first newline: the positions where the patched model writes its "
           "answer). " if DEFAULT_ANSWER_TOKENS else "calibration rows at the query tokens only. ")
        + "Kind `both+down` is the paper's thought matrix and vector plus a least-squares fit, through the MLP's "
        "down projection, of the per-token block-output residual the constant vector leaves (an icl_lens "
        "extension; see the fit's docstring). "
        + (f"Preserve strength {DEFAULT_PRESERVE_STRENGTH:g} (the fit's locality term, MEMIT's covariance "
           "penalty: the keys of the preserve texts, `icl_lens.thought.preserve_texts` — the model's own samples from BOS "
           f"and {len(few_shot_texts())} few-shot prompts of other kinds of task, fit half — weigh that many times "
           "the calibration rows in every least squares; never the texts that measure locality). "
           if DEFAULT_PRESERVE_STRENGTH else "")
        + "Nothing is tuned per task. "
        "Accuracy on held-out test queries, greedy decoding, correct when the continuation (leading spaces "
        "stripped) starts with the answer and the next character cannot continue a word (\"six\" is wrong for "
        "\"sixteen\"; earlier defaults' rows, some scored by the earlier starts-with rule, are under *Earlier "
        "default*); [95% Wilson interval]. *none*: query alone; *full*: few-shot "
        "instruction + query; *patched*: query alone, thought-patched model; *control*: query alone, random patch "
        "with the same per-layer norms; *steering*: query alone, mean residual difference (instruction+query − "
        "query alone, over the query tokens of the train queries) added after the block chosen by calibration KL "
        f"(layer in the table). Ratio = patched/full with a paired bootstrap 95% interval; the target rule, one "
        f"function for every count of the report (`experiments/thought/rule.py`): ratio ≥ {TARGET} and its lower "
        f"bound ≥ {RATIO_LOWER}, where full ≥ {ELIGIBLE:.0%} on the same queries. Locality: mean next-token KL(unpatched ‖ edited) in nats over "
        f"every position of {len(loc.texts)} fixed unrelated texts, and the share of the {len(loc.other_prompts)} "
        f"queries of a fixed other few-shot task ({loc.other_task}, read with its instruction) on which the edited "
        "model's answer (the first line of its greedy continuation) is the unpatched model's "
        "(`icl_lens/thought/tasks/locality.json`). Every condition of a row, on the test and the fresh queries, "
        "comes from one run with one default; *seconds* is that run's wall time. The test queries were scored by "
        "earlier defaults too (their rows are under *Earlier default* below); the fresh ones only by this one.",
        *fresh_lines(caches, models, tasks),
        "",
        "**Test queries** (the same fitted edits as the fresh table):",
        "",
        "| model | task | none | full | patched | control | steering (layer) | patched/full | target | "
        "locality KL patched / control / steering | other task kept patched / control / steering | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts: dict[str, list[tuple[str, bool]]] = {}
    steering_wins, paper_rows = [], []
    fit = default_fit()
    table = {m: {t: r for t in tasks if (r := current_row(caches[m], row_key("table", fit, t))) is not None}
             for m in models}
    for model in models:
        res = caches[model]
        for name, r in table[model].items():
            rule = target_rule(r)
            if rule.eligible:
                verdicts.setdefault(model, []).append((name, rule.met))
            kl, kept = r["locality_kl"], kept_of(r)
            lines.append(
                f"| {model} | {name} | {acc_ci(r, 'none')} | {acc_ci(r, 'full')} | {acc_ci(r, 'patched')} | "
                f"{acc_ci(r, 'control')} | {acc_ci(r, 'steering')} ({r['steering_layer']}) | {rule.text()} | "
                f"{rule.verdict} | "
                f"{kl['patched']:.3f} / {kl['control']:.3f} / {kl['steering']:.3f} | "
                f"{pct(kept['patched'])} / {pct(kept['control'])} / {pct(kept['steering'])} | {total_seconds(r):.0f} |")
            steering_wins.append(r["accuracy"]["patched"] >= r["accuracy"]["steering"])
            p = res.get(row_key("paper", paper_fit(), name))
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
    kls = {c: [r["locality_kl"][c] for m in models for r in table[m].values()] for c in ("patched", "control", "steering")}
    if kls["patched"]:
        med = {c: float(np.median(v)) for c, v in kls.items()}
        kept = [kept_of(r)["patched"] for m in models for r in table[m].values()]
        summary.append(f"- Locality: median KL on the unrelated texts {med['patched']:.3f} nats for the thought patch, "
                       f"{med['steering']:.3f} for the steering vector, {med['control']:.3f} for the random control; "
                       f"the patched model keeps ≥ 90% of the other task's answers on {sum(k >= 0.9 for k in kept)} of "
                       f"{len(kept)} (model, task) pairs (median {100 * float(np.median(kept)):.0f}%).")
    answerable = sorted({t for m in models for t, r in table[m].items() if r["accuracy"]["full"] >= ELIGIBLE})
    evaluated = sorted({t for m in models for t in table[m]})
    if evaluated:
        summary.append(f"- Answerable by the full instruction (full ≥ {ELIGIBLE:.0%}) on at least one model: "
                       f"{len(answerable)} of {len(evaluated)} evaluated tasks"
                       + (f"; not: {', '.join(t for t in evaluated if t not in answerable)}." if
                          len(answerable) < len(evaluated) else "."))
    for model in models:
        missing = [t for t in tasks if t not in table[model]]
        if missing:
            summary.append(f"- **Not evaluated** on {model} with the current default: {', '.join(missing)}.")
    lines += ["", "Read from the table (counts over the rows above, by the target rule of the method paragraph):", "",
              *summary]
    lines += agreement_lines(caches, models, tasks)
    lines += answer_length_lines(caches, models, tasks, answer_tokens or {})
    lines += earlier_lines(caches, models, tasks)
    lines += distill_lines(caches, models, tasks)
    lines += untouched_lines(caches, models, tasks)
    lines += equal_distill_lines(caches, models, tasks)
    lines += compose_lines(caches, models)
    lines += tuned_lines(caches, models, tasks)
    lines += paper_lines(caches, default)
    if paper_rows:
        lines += ["", "**Before / after**: the paper's settings (kind `both`, ridge 0, no query prefix, the "
                  "query read right after BOS) against the default, same train and test queries. *none* is "
                  "the query alone in each setting's own format.", "",
                  "| model | task | full | none (paper format) | patched, paper | ratio | patched, default | ratio | "
                  "locality KL paper / default |", "|---|---|---|---|---|---|---|---|---|"]
        for model, name, p, r in paper_rows:
            lines.append(f"| {model} | {name} | {acc_ci(r, 'full')} | {acc_ci(p, 'none')} | {acc_ci(p, 'patched')} | "
                         f"{to_full(r, p['correct']['patched'])} | {acc_ci(r, 'patched')} | "
                         f"{to_full(r, r['correct']['patched'])} | {p['locality_kl']['patched']:.3f} / "
                         f"{r['locality_kl']['patched']:.3f} |")
    curves = {}
    for model in models:
        for name in tasks:
            pts = {n: c for n in SIZES if (c := caches[model].get(row_key("curve", fit, name, n))) is not None}
            if pts:
                curves[(model, name)] = pts
    missing = [f"{m} {t}" for m in models for t in CURVE_TASKS if t in tasks and (m, t) not in curves]
    if curves or missing:
        lines += ["", "**Calibration-size curves**: test accuracy of the patched model (the current default) against "
                  "the number of calibration queries (the first n train queries), the full prompt beside it:", ""]
    if curves:
        lines += ["| model | task | full | " + " | ".join(str(n) for n in SIZES) + " |",
                  "|---|---|---|" + "---|" * len(SIZES)]
        for (model, name), pts in curves.items():
            full = acc_ci(table[model][name], "full") if name in table[model] else "–"
            lines.append(f"| {model} | {name} | {full} | " + " | ".join(acc_ci(pts[n], "patched") if n in pts else "–"
                                                                          for n in SIZES) + " |")
    if missing:
        lines += ["", f"**Not run with the current default**: {', '.join(missing)} (`{COMMAND} --models MODEL --tasks "
                  f"{' '.join(CURVE_TASKS)} --curve-tasks {' '.join(CURVE_TASKS)} --paper-tasks --compose "
                  "--tune-tasks` computes only the curves the cache lacks"
                  + (f"; a point of the curves above took {secs.min() / 60:.1f}–{secs.max() / 60:.1f} min, "
                     "one thread each" if (secs := np.array([total_seconds(c) for pts in curves.values()
                                                              for c in pts.values()])).size else "") + ")."]
    lines += selection_lines(caches, default, select_tasks)
    lines += answer_selection_lines(caches, select_tasks, {**default, "answer_tokens": DEFAULT_ANSWER_TOKENS})
    lines += strength_lines(caches, select_tasks)
    lines += null_space_lines(caches, select_tasks)
    lines += distill_lr_lines(caches)
    lines += diagnosis_lines(caches)
    timing = []
    for model in models:
        secs = [total_seconds(v) + total_seconds(v.get("joint", {})) for k, v in caches[model].items()
                if k.split("/", 1)[0] in ("table", "curve", "compose") and fit_of(k) == fit.key()
                and current_row(caches[model], k)]
        if secs:
            timing.append(f"{model} {sum(secs) / 60:.0f} min")
    if timing:
        lines += ["", "Compute of the current default's results (table with its fresh queries, curves, composed "
                  f"patches; sum of the per-result seconds, one thread each): {'; '.join(timing)}."]
    return "\n".join(lines) + "\n"


def _answer_tokens(out: Path, models: list[str], tasks: list[str]) -> dict:
    """Tokens per test answer (``" " + answer``) for every cached table row, read with each model's tokenizer."""
    from icl_lens.model import load_model
    from icl_lens.thought import text_ids

    counts = {}
    for model_name in models:
        results = cached(out, model_name)
        names = [t for t in tasks if row_key("table", default_fit(), t) in results]
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
    p.add_argument("--compose", nargs="*", type=int, default=[2, 4],
                   help="sizes of the composed groups to run (COMPOSE_GROUPS; none: no composition)")
    p.add_argument("--tune-tasks", nargs="*", default=None,
                   help="tasks tuned on their own (default: those where the default misses the target)")
    p.add_argument("--distill-on", nargs="*", default=None,
                   help="tasks whose table row also runs context distillation (default: every task; about 9 min "
                        "each on SmolLM2-135M, 2 CPU cores)")
    p.add_argument("--out", default="reports/eval_thought.md")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the cores are shared)")
    p.add_argument("--select", action="store_true", help="also run the selection of the default settings")
    p.add_argument("--select-only", action="store_true", help="run only the selection (no table)")
    p.add_argument("--method", nargs="*", default=None, metavar="TASK",
                   help="issue 38's method rows on these tasks: the untouched locality set and distillation on equal "
                        "terms (no task named: the untouched set on every task, distillation on the tasks "
                        "equal_distill_plan picks from the cached rows)")
    p.add_argument("--method-only", action="store_true", help="run only the --method rows (no table)")
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
                      compose_groups=[g for g in q.get("compose_groups", COMPOSE_GROUPS) if len(g) in args.compose],
                      strengths=q.get("strengths", PRESERVE_STRENGTHS),
                      sizes=q.get("sizes", SIZES), select=args.select or args.select_only,
                      select_tasks=q.get("tasks", SELECT_TASKS), select_grid=q.get("select_grid", SELECT_GRID),
                      select_extra=() if args.quick else SELECT_EXTRA,
                      select_answer_grid=q.get("select_answer_grid", SELECT_ANSWER_GRID),
                      select_fit=q.get("select_fit", SELECT_FIT), select_validate=q.get("select_validate", SELECT_VALIDATE),
                      diagnose_task=args.diagnose, table=not (args.select_only or args.method_only),
                      tune_tasks=q.get("tasks") if args.quick else args.tune_tasks,
                      distill_lrs=q.get("distill_lrs", DISTILL_LRS), distill_steps=q.get("distill_steps"),
                      distill_on=None if args.quick else args.distill_on,
                      null_space_grid=(QUICK_NULL_SPACE_GRID if args.quick else NULL_SPACE_GRID)
                      if args.select or args.select_only else (),
                      method_tasks=() if args.method is None and not args.method_only else
                      (q.get("tasks") or args.method or tasks), plan_distill=not (q or args.method))
    report_tasks = tasks if args.quick else list(SHIPPED_TASKS)
    text = write_report(out, models, report_tasks, cmd, select_tasks=q.get("tasks", SELECT_TASKS),
                        answer_tokens=_answer_tokens(out, models, report_tasks))
    print(write_fragment(out, [text]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
