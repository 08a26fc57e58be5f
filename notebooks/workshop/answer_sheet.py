"""The reference answers of notebook 04, measured once by this command and stored in ``reports/workshop_answers.json``.

    python notebooks/workshop/answer_sheet.py [--model smollm2-135m]     # about 3 minutes on a 2-core laptop

Notebook 04's exercises fit and score thought patches: a participant's prediction is graded against these stored
intervals, not against the participant's own run (a wrong computation then cannot earn a ✓), and the participant's
counts are checked against them, so the notebook tests fail when the library's results drift from the sheet. The
runs are the notebook's: the capitals task, its first 8 train queries for calibration, its first 24 test queries,
icl_lens's default fit (``evaluate_thought``), one torch thread. docs/workshop.md's expected answers for 04 are
rendered from this file (``notebooks/workshop/figures.py``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHEET = ROOT / "reports" / "workshop_answers.json"
N_CALIBRATION, N_TEST = 8, 24  # notebook 04's `small` task


def measure(model_name: str) -> dict:
    """Notebook 04's runs on ``model_name``: the four conditions of section 2 and the three refits of its exercises."""
    import torch

    from icl_lens import Task, evaluate_thought, load_model, load_task

    torch.set_num_threads(1)
    model = load_model(model_name)
    task = load_task("capitals")
    small = Task(task.name, task.instruction, task.train[:N_CALIBRATION], task.test[:N_TEST])
    start = time.perf_counter()
    section_2 = evaluate_thought(model, small, conditions=("none", "full", "patched", "control"))
    by_kind = {kind: evaluate_thought(model, small, kind=kind, conditions=("patched",), locality=False)
               for kind in ("vector", "matrix")}
    one_query = evaluate_thought(model, small, n_train=1, conditions=("patched",), locality=False)
    return {
        "task": task.name, "n_calibration": N_CALIBRATION, "n_test": section_2.n_test,
        "correct": {c: int(sum(o)) for c, o in section_2.outcomes.items()},
        "correct_by_kind": {k: int(sum(r.outcomes["patched"])) for k, r in by_kind.items()},
        "correct_one_query": int(sum(one_query.outcomes["patched"])),
        "seconds": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args(argv)
    sheet = json.loads(SHEET.read_text()) if SHEET.exists() else {}
    entry = measure(args.model)
    entry["command"] = f"python notebooks/workshop/answer_sheet.py --model {args.model}"
    sheet.setdefault("04_thought_patches", {})[args.model] = entry
    SHEET.write_text(json.dumps(sheet, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(entry, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
