"""The reference answers of the workshop's exercises, measured once by this command and stored in
``reports/workshop_answers.json``.

    python notebooks/workshop/answer_sheet.py [--model smollm2-135m] [--notebooks 01 02 03 04 05 06]
    # on a 2-core laptop, one thread: 04 about 7 minutes; 01 02 03 05 06 together about a minute

Each entry is what that notebook's check cells measure, computed with the same library calls on the same prompts
(the workshop model SmolLM2-135M; notebook 02 runs the lab's shipped models, stored under ``lab``; one torch
thread). docs/workshop.md's expected answers are rendered from this file (``notebooks/workshop/figures.py``), and
each notebook's check cells compare their own run with it (:func:`workshop.exercise_checks.check_sheet`), so the
notebook tests fail when the library's results drift from the sheet.

Notebook 04's exercises fit and score thought patches: a participant's prediction is graded against these stored
intervals, not against the participant's own run (a wrong computation then cannot earn a ✓), and the participant's
counts are checked against them. The runs are the notebook's: the capitals task, its first 8 train queries for
calibration, its first 24 test queries, icl_lens's default fit (``evaluate_thought``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python notebooks/workshop/answer_sheet.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workshop.exercise_checks import as_record

ROOT = Path(__file__).resolve().parents[2]
SHEET = ROOT / "reports" / "workshop_answers.json"
N_CALIBRATION, N_TEST = 8, 24  # notebook 04's `small` task
LAB = "lab"  # notebook 02's models: the lab's shipped 10-layer models, not a language model


def measure_01(model_name: str) -> dict:
    """Notebook 01's checks: the identity without the correction (three prompts) and with it, with the first sentence
    removed, and the layer with the largest mean patch norm."""
    import torch

    import icl_lens

    model = icl_lens.load_model(model_name)
    prompt = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
    others = ["The cat sat on the mat because it was", "Two plus two is four. Three plus three is"]
    patches = icl_lens.token_patches(model, prompt)
    errors = [icl_lens.verify_equivalence(model, p, dataclasses.replace(q, correction=torch.zeros_like(q.correction))
                                          ).relative_error
              for p, q in [(prompt, patches)] + [(p, icl_lens.token_patches(model, p)) for p in others]]
    ablated = icl_lens.token_patches(model, prompt, remove=range(1, patches.tokens.index(".") + 1))
    return {"errors_without_correction": errors,
            "error_with_correction": icl_lens.verify_equivalence(model, prompt, patches).relative_error,
            "error_first_sentence_removed": icl_lens.verify_equivalence(model, prompt, ablated).relative_error,
            "largest_norm_layer": int(patches.to_frame().groupby("layer").norm.mean().idxmax()),
            "n_layers": model.cfg.n_layers}


def measure_02(model_name: str) -> dict:
    """Notebook 02's checks on the lab's models: the unexplained shares of patch_parts, the GRU's exponent beyond the
    training length (mean curve and per prompt), the delta rule's mean β of layer 0."""
    import torch

    from icl_lens import lab
    from icl_lens.core import power_law_fit
    from icl_lens.stats import bootstrap_mean

    torch.manual_seed(0)
    reference = lab.patch_parts("softmax", n_prompts=16).to_frame()
    base = ((reference["none"] - reference.contextual) ** 2).mean()
    gap = {k: bootstrap_mean((reference[k] - reference.contextual) ** 2 / base) for k in ("w_in", "correction", "full")}
    conv = lab.convergence_by_architecture(n_prompts=4, n_max=64)
    pairs = torch.arange(1, conv.n_max + 1, dtype=torch.float64)
    late = pairs >= conv.n_train
    per_prompt = bootstrap_mean([float(power_law_fit(row[late], x=pairs[late]).exponent[0])
                                 for row in conv.total_norms("gru").double()])
    _, cache = lab.load_lab_model("delta").run_with_cache(
        lab.sample_prompts(1, 16, 4, generator=torch.Generator().manual_seed(2)).tokens)
    return {"unexplained": gap,
            "gru_alpha_beyond_train": float(conv.summary().set_index("arch").alpha_beyond_train["gru"]),
            "gru_alpha_per_prompt": per_prompt,
            "mean_beta_layer_0": float(cache["blocks.0.mix.hook_beta"].mean())}


def measure_03(model_name: str) -> dict:
    """Notebook 03's checks: mean decay exponents of free-text and few-shot prompts, every step of the free-text
    prompt verified, and the layers where the same-prompt cosine beats the control."""
    import torch

    import icl_lens
    from icl_lens.stats import bootstrap_mean

    model = icl_lens.load_model(model_name)
    prompt = "France: Paris\nJapan: Tokyo\nItaly: Rome\nSpain: Madrid\nGermany:"
    other_prompt = "The old lighthouse keeper climbed the stairs every night to light the"
    few_shot_prompts = [prompt, "hot: cold\nbig: small\nfast: slow\nhappy: sad\nup:",
                        "cat: chat\ndog: chien\nhouse: maison\nwater: eau\nbread:"]
    free_prompts = [other_prompt, "She opened the window and the cold morning air filled the",
                    "After the long meeting, the engineers went back to their desks and"]
    mean_exponent = {p: float(icl_lens.trajectory(model, p).decay_fit().exponent.mean())
                     for p in few_shot_prompts + free_prompts}
    free_traj = icl_lens.trajectory(model, other_prompt)
    free_check = icl_lens.verify_trajectory(model, other_prompt, free_traj, steps=range(1, free_traj.n_context + 1))
    fa = icl_lens.finetune_alignment(model, prompt, lr=1e-3, steps=3)
    fa_other = icl_lens.finetune_alignment(model, other_prompt, lr=1e-3, steps=3)
    same, control = fa.cosine(), fa.cosine_with_explicit_of(fa_other)
    return {"mean_exponent_free_text": bootstrap_mean([mean_exponent[p] for p in free_prompts]),
            "mean_exponent_few_shot": bootstrap_mean([mean_exponent[p] for p in few_shot_prompts]),
            "free_text_steps": len(free_check.steps), "free_text_worst_error": free_check.relative_error,
            "beats_control": int((same > control).sum()), "n_layers": len(fa.layers),
            "max_abs_cos": float(torch.cat([same, control]).abs().max())}


def measure_05(model_name: str) -> dict:
    """Notebook 05's checks: the token with the largest last-layer norm, and the (prompt, layer) pairs whose steps
    shrink (α > 0) over the three exercise prompts."""
    import icl_lens

    model = icl_lens.load_model(model_name)
    prompt = "The capital of France is Paris. The capital of Italy is"
    every = icl_lens.token_patches(model, prompt).to_frame()
    last_layer = every[every.layer == every.layer.max()]
    exercise_prompts = [prompt, "The cat sat on the mat. The dog sat on the rug. The bird sat on the",
                        "One, two, three, four, five, six, seven,"]
    exponents = [e for p in exercise_prompts for e in icl_lens.trajectory(model, p).decay_fit().to_frame().exponent]
    return {"largest_last_layer_token": last_layer.loc[last_layer.norm.idxmax(), "token"].strip(),
            "shrinking": sum(e > 0 for e in exponents), "prompt_layer_pairs": len(exponents)}


def measure_06(model_name: str) -> dict:
    """Notebook 06 exercise 1's check: positions without enough context at window 8."""
    import icl_lens

    model = icl_lens.load_model(model_name)
    prompt = ("The cat sat on the mat. The dog sat on the rug. The bird sat on the branch. "
              "The fish swam in the bowl. The horse stood in the field. Meanwhile, the Treaty of Westphalia "
              "was signed in 1648.")
    patches = icl_lens.token_patches(model, prompt)
    return {"without_enough_context_window_8": int((~icl_lens.spike_scores(patches, window=8).enough_context).sum())}


def measure_04(model_name: str) -> dict:
    """Notebook 04's runs on ``model_name``: the four conditions of section 2 and the three refits of its exercises."""
    from icl_lens import Task, evaluate_thought, load_model, load_task

    model = load_model(model_name)
    task = load_task("capitals")
    small = Task(task.name, task.instruction, task.train[:N_CALIBRATION], task.test[:N_TEST])
    section_2 = evaluate_thought(model, small, conditions=("none", "full", "patched", "control"))
    by_kind = {kind: evaluate_thought(model, small, kind=kind, conditions=("patched",), locality=False)
               for kind in ("vector", "matrix")}
    one_query = evaluate_thought(model, small, n_train=1, conditions=("patched",), locality=False)
    return {
        "task": task.name, "n_calibration": N_CALIBRATION, "n_test": section_2.n_test,
        "correct": {c: int(sum(o)) for c, o in section_2.outcomes.items()},
        "correct_by_kind": {k: int(sum(r.outcomes["patched"])) for k, r in by_kind.items()},
        "correct_one_query": int(sum(one_query.outcomes["patched"])),
    }


MEASURES: dict[str, Callable[[str], dict]] = {
    "01_quickstart": measure_01, "02_regression_lab": measure_02, "03_implicit_dynamics": measure_03,
    "04_thought_patches": measure_04, "05_live_dashboard": measure_05, "06_spike_flags": measure_06}


SEEDS = {  # what draws at random in each notebook's checks (the library's defaults, as the notebooks call them)
    "01_quickstart": "none: forward passes only", "02_regression_lab": (
        "torch.manual_seed(0) as the notebook; patch_parts seed 3, convergence_by_architecture seed 2, the β prompt "
        "seed 2, bootstrap_mean seed 0"),
    "03_implicit_dynamics": "bootstrap_mean seed 0; SGD is deterministic",
    "04_thought_patches": "evaluate_thought seed 0 (its random control)",
    "05_live_dashboard": "none: forward passes only", "06_spike_flags": "none: forward passes only"}


def measure(notebook: str, model_name: str) -> dict:
    """One notebook's sheet entry: its measures, with the command, model, threads and seconds that produced them."""
    import torch

    torch.set_num_threads(1)
    model_name = LAB if notebook == "02_regression_lab" else model_name
    start = time.perf_counter()
    entry = as_record(MEASURES[notebook](model_name))
    flag = "" if notebook == "02_regression_lab" else f" --model {model_name}"
    return {**entry, "model": model_name, "seeds": SEEDS[notebook], "torch_threads": 1, "seconds": round(time.perf_counter() - start, 1),
            "command": f"python notebooks/workshop/answer_sheet.py{flag} --notebooks {notebook[:2]}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--notebooks", nargs="+", default=[n[:2] for n in MEASURES], metavar="NN",
                        help="which notebooks' answers to measure (default: all)")
    args = parser.parse_args(argv)
    chosen = [n for n in MEASURES if n[:2] in args.notebooks]
    unknown = set(args.notebooks) - {n[:2] for n in chosen}
    if unknown:
        parser.error(f"no answers for notebook(s) {sorted(unknown)}; known: {[n[:2] for n in MEASURES]}")
    for notebook in chosen:
        entry = measure(notebook, args.model)
        sheet = json.loads(SHEET.read_text()) if SHEET.exists() else {}  # reread: each entry is saved as it ends
        sheet.setdefault(notebook, {})[entry["model"]] = entry
        SHEET.write_text(json.dumps(sheet, indent=1, ensure_ascii=False) + "\n")
        print(notebook, json.dumps(entry, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
