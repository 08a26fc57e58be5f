"""``python -m icl_lens.evals.thought``: thought-patch accuracy on the shipped tasks → ``reports/eval_thought.md``.

For each embedded model and each shipped task (``icl_lens/tasks/``): test accuracy with
no instruction, with the full instruction in context, with the thought patch fitted on
all train queries (arXiv 2510.08734; kind ``both``, η = 1, λ = 0), and with a random
control patch of the same per-layer norms; then test accuracy of the patched model
against the calibration-set size (1, 2, 4, …, 32). Results are cached per (model, task)
in a JSON file next to the report, so the run can be split (``--models``) and resumed.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from icl_lens.evals.report import command, machine, write_fragment
from icl_lens.model.loading import EMBEDDED_MODELS
from icl_lens.thought.tasks import SHIPPED_TASKS, load_task

SIZES = (1, 2, 4, 8, 16, 32)
COMMAND = "python -m icl_lens.evals.thought"


def _cache_path(out: Path, model: str) -> Path:
    return out.with_name(f"{out.stem}.{model}.json")


def _cached(out: Path, model: str) -> dict:
    cache = _cache_path(out, model)
    return json.loads(cache.read_text()) if cache.exists() else {}


def run_model(model_name: str, tasks: list[str], curve_tasks: list[str], out: Path, run: str) -> None:
    """Evaluate what the cache lacks; ``run`` (command and machine) is recorded with the keys it computed."""
    from icl_lens.model.loading import load_model
    from icl_lens.thought.evaluate import evaluate_thought

    cache, results = _cache_path(out, model_name), _cached(out, model_name)
    model = load_model(model_name)

    def store(key, value):
        results[key] = value
        runs = results.setdefault("runs", {})
        runs[run] = runs.get(run, []) + [key]
        cache.write_text(json.dumps(results, indent=1))

    for name in tasks:
        task = load_task(name)
        key = f"table/{name}"
        if key not in results:
            store(key, evaluate_thought(model, task).to_dict())
            print(model_name, results[key], flush=True)
        if name in curve_tasks:
            for n in SIZES:
                ckey = f"curve/{name}/{n}"
                if n <= len(task.train) and ckey not in results:
                    store(ckey, evaluate_thought(model, task, n_train=n, conditions=("patched",)).to_dict())
                    print(model_name, ckey, results[ckey]["accuracy"], flush=True)


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def write_report(out: Path, models: list[str], tasks: list[str], report_command: str) -> str:
    caches = {m: _cached(out, m) for m in models}
    runs = [f"- {m}: {len(keys)} result(s) by {run}" for m in models for run, keys in caches[m].get("runs", {}).items()]
    unrecorded = [m for m in models if caches[m] and "runs" not in caches[m]]
    lines = [
        "## Thought patches: prompts turned into weights (issue 5)",
        "",
        f"Report written by `{report_command}` from the cached results `{_cache_path(out, '<model>').name}`, "
        "computed (float32) by:",
        "",
        *runs,
        *[f"- {m}: command and machine not recorded (cache written before runs were recorded)" for m in unrecorded],
        "",
        "Method (Mazzawi, Dherin et al. 2025, arXiv 2510.08734, Algorithm 1): thought patch fitted layer by "
        "layer on the task's train queries (all tokens of each query), kind `both`, η = 1, λ = 0 (minimum-norm "
        "pseudo-inverse). Accuracy on held-out test queries, greedy decoding, correct when the continuation "
        "(leading spaces stripped) starts with the answer. *none*: query alone; *full*: few-shot instruction + "
        "query; *patched*: query alone, thought-patched model; *control*: query alone, random patch with the same "
        "per-layer ‖ΔW‖ and vector norms. Ratio = patched / full.",
        "",
        "| model | task | train | test | none | full | patched | control | patched/full | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    curves: dict[tuple[str, str], dict[int, float]] = {}
    for model in models:
        results = caches[model]
        for name in tasks:
            r = results.get(f"table/{name}")
            if r is not None:
                a = r["accuracy"]
                ratio = "–" if not a["full"] else f"{a['patched'] / a['full']:.2f}"
                lines.append(f"| {model} | {name} | {r['n_train']} | {r['n_test']} | {_pct(a['none'])} | "
                             f"{_pct(a['full'])} | {_pct(a['patched'])} | {_pct(a['control'])} | {ratio} | "
                             f"{r['seconds']:.0f} |")
            pts = {n: results[f"curve/{name}/{n}"]["accuracy"]["patched"] for n in SIZES
                   if f"curve/{name}/{n}" in results}
            if pts:
                curves[(model, name)] = pts
    if curves:
        lines += ["", "Test accuracy of the patched model against the number of calibration queries:", "",
                  "| model | task | " + " | ".join(str(n) for n in SIZES) + " |",
                  "|---|---|" + "---|" * len(SIZES)]
        for (model, name), pts in curves.items():
            lines.append(f"| {model} | {name} | " + " | ".join(_pct(pts.get(n)) for n in SIZES) + " |")
    text = "\n".join(lines) + "\n"
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", nargs="+", default=list(EMBEDDED_MODELS))
    p.add_argument("--tasks", nargs="+", default=list(SHIPPED_TASKS))
    p.add_argument("--curve-tasks", nargs="+", default=list(SHIPPED_TASKS))
    p.add_argument("--out", default="reports/eval_thought.md")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the cores are shared)")
    p.add_argument("--report-only", action="store_true", help="only assemble the report from cached results")
    p.add_argument("--notes", default=None, help="Markdown file appended to the report (analysis)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cmd = command(COMMAND, argv)
    if not args.report_only:
        for model in args.models:
            run_model(model, args.tasks, args.curve_tasks, out, f"`{cmd}` on {machine()}")
    text = write_report(out, list(EMBEDDED_MODELS), list(SHIPPED_TASKS), cmd)
    if args.notes:
        text += "\n" + Path(args.notes).read_text()
    print(write_fragment(out, [text]))
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
