"""``python -m experiments.lab_training_length``: has a lab model's in-context error stopped falling at its recipe?

The alignment section's lab models are trained by a fixed recipe (``icl_lens.lab._checkpoints.RECIPES``:
steps and rate). For the single block of Dherin et al. 2025 (arXiv 2507.16003, §5), whose one-pass
alignment the report reads, this trains each seed for the recipe's steps and for twice as many (the same
schedule stretched) and compares the in-context MSE at ``n_context_train`` pairs on 1,024 fresh prompts
(the training record's ``eval_loss_n_train``).

Rule, fixed before the run: the error has *stopped falling* at the recipe when, on every seed, doubling
the steps lowers it by less than ``TOLERANCE`` (5%) of its value at the recipe's steps; otherwise the
report says by how much it still falls. Writes ``reports/eval_lab_training.md`` and ``.json``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch

from experiments.report import command, load_average, machine, markdown_table, write_fragment
from icl_lens.lab import RECIPES
from icl_lens.lab import seeds as lab_seeds

TOLERANCE = 0.05
SEEDS = (0, 1, 2)


def verdict(rows: list[dict], tolerance: float = TOLERANCE) -> bool:
    """Stopped falling: on every seed the longer run's error is above ``(1 − tolerance)`` × the recipe's."""
    return all(r["longer"] > (1 - tolerance) * r["recipe"] for r in rows)


def measure(name: str, seeds, steps: int, factor: int = 2) -> list[dict]:
    from icl_lens.lab import train as training

    lr = RECIPES[name]["lr"]
    rows = []
    for seed in seeds:
        runs = {}
        for label, n in (("recipe", steps), ("longer", factor * steps)):
            _, record = training.train(lab_seeds.MODELS[name], steps=n, lr=lr, batch=lab_seeds.BATCH, seed=seed, progress=False)
            runs[label] = record["eval_loss_n_train"]
            runs[f"{label}_seconds"] = record["seconds"]
        rows.append({"seed": seed, "steps": steps, "longer_steps": factor * steps, **runs,
                     "change": runs["longer"] / runs["recipe"] - 1})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="single_block", choices=list(lab_seeds.MODELS))
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    ap.add_argument("--steps", type=int, default=None, help="the shorter run (default: the recipe's steps)")
    ap.add_argument("--out", default="reports/eval_lab_training.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    steps = args.steps or RECIPES[args.model]["steps"]
    load0, start = load_average(), time.perf_counter()
    rows = measure(args.model, args.seeds, steps)
    stopped = verdict(rows)
    changes = [r["change"] for r in rows]
    result = (f"doubling the steps changes the error by {min(changes):+.1%} to {max(changes):+.1%} across the "
              f"{len(rows)} seeds: " + ("stopped falling" if stopped else "still falling")
              + f" (rule: less than {TOLERANCE:.0%} lower on every seed)")
    where = machine(load_before=load0)
    frame = pd.DataFrame([{"seed": r["seed"], f"MSE after {r['steps']} steps": r["recipe"],
                           f"MSE after {r['longer_steps']} steps": r["longer"], "change": f"{r['change']:+.1%}"}
                          for r in rows])
    lines = [f"## ICL lab: does the {args.model}'s in-context error stop falling at its recipe?", "",
             f"Command: `{command('python -m experiments.lab_training_length', argv)}`  ",
             f"Machine: {where}.  ",
             f"Run time: {time.perf_counter() - start:.0f} s.", "",
             f"`{args.model}` trained by its recipe ({steps} steps, rate {RECIPES[args.model]['lr']}, batch {lab_seeds.BATCH}, "
             "AdamW with warm-up and cosine decay) and for twice the steps (the same schedule stretched); MSE: the "
             "normalised in-context query error (squared error / d_x) at the training context length on 1,024 fresh prompts. Rule, "
             f"fixed before the run: stopped falling when doubling lowers it by less than {TOLERANCE:.0%} on every seed.",
             "", markdown_table(frame), "", f"Result: {result}."]
    out = Path(args.out)
    write_fragment(out, lines)
    out.with_suffix(".json").write_text(json.dumps({"model": args.model, "tolerance": TOLERANCE, "rows": rows,
                                                    "stopped_falling": stopped, "machine": where}, indent=1) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
