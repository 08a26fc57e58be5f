"""``icl-lens thought-eval TASK.jsonl``: accuracy of a thought patch on one task.

Prints test accuracy with no instruction, with the full instruction in context, with the
thought patch (fitted on the task's train queries, arXiv 2510.08734) and no instruction,
and with a random control patch of the same per-layer norms; plus the seconds taken.
``--json`` prints ``{"task", "model", "n_train", "n_test", "accuracy": {"none", "full",
"patched", "control"}, "seconds"}``.
"""
from __future__ import annotations

import argparse
import json
import sys

from icl_lens.model.loading import DEFAULT_MODEL


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "thought-eval", help="evaluate a thought patch (prompt turned into weights) on a task file",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", help="task .jsonl file (or the name of a shipped task, e.g. capitals)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model name (default {DEFAULT_MODEL})")
    p.add_argument("--kind", choices=("vector", "matrix", "both"), default="both")
    p.add_argument("--eta", type=float, default=1.0, help="step size η (default 1)")
    p.add_argument("--ridge", type=float, default=0.0, help="ridge λ ≥ 0 (default 0: pseudo-inverse)")
    p.add_argument("--n-train", type=int, default=None, help="calibration queries to use (default: all train)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from icl_lens.model.loading import load_model
    from icl_lens.model.thought_eval import evaluate_thought
    from icl_lens.tasks import load_task

    task = load_task(args.task)  # validate the file before loading a model
    model = load_model(args.model)
    result = evaluate_thought(model, task, kind=args.kind, eta=args.eta, ridge=args.ridge, n_train=args.n_train)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(f"task {result.task} | model {result.model} | {result.n_train} calibration queries | "
              f"{result.n_test} test queries")
        for cond, acc in result.accuracy.items():
            print(f"  {cond:<8} {acc:6.1%}")
        print(f"  seconds  {result.seconds:.1f}")
    return 0


def main(argv=None) -> int:
    """Stand-alone entry point (the lead wires ``register`` into ``icl-lens``)."""
    parser = argparse.ArgumentParser(prog="icl-lens")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
