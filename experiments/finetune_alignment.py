"""Evaluation: implicit vs explicit finetuning, measured the way Dherin et al. 2025 measure it.

``python -m experiments.finetune_alignment [--quick]`` writes
``reports/eval_finetune_alignment.md`` and ``reports/eval_finetune_alignment.json``.

The paper (arXiv 2507.16003, §4–5) claims that the implicit updates of a context (token
patches, and their steps as the context is consumed) track explicit finetuning on the
same examples. This command measures, with the library's functions:

1. loss curves: test error against the number of examples consumed, in context and by
   SGD on the first MLP matrix (one pair per step, a learning-rate sweep)
   (:func:`icl_lens.lab.experiments.loss_curves.loss_curves`), for every lab model;
2. weight-space alignment, cumulative and per step, in the prefix and the paper's
   absorb order, with a mismatched-prompt control, variants that isolate the cause and a
   random-direction baseline (:func:`icl_lens.lab.experiments.implicit_explicit.implicit_vs_explicit`);
3. function-space alignment (:meth:`LossCurves.function_cosines`);
4. where the context effect lives: full patch, W_in patches only, corrections only
   (:func:`icl_lens.lab.experiments.patch_parts.patch_parts`,
   :func:`icl_lens.model.context_effect.context_effect`);
5. the per-token protocol on Gemma 3 270M and SmolLM2-135M
   (:func:`icl_lens.dynamics.context_alignment.context_alignment`), on few-shot prompts built
   from the shipped thought-patch tasks.

Every sentence of the reading is computed from the numbers with the rules stated in it.
"""
from __future__ import annotations

import argparse
import json
import random
import time

import pandas as pd
import torch
from tqdm.auto import tqdm

from experiments.report import command, load_average, machine, markdown_table, write_fragment

LAB_MODELS = ("single_block", "one_block", "one_block_skip", "one_block_ln", "one_block_preln", "skip_only",
              "softmax", "linear", "delta", "gru")
LM_MODELS = ("gemma-3-270m", "smollm2-135m")
LM_TASKS = ("capitals", "en_fr", "en_es", "kv8")
QUICK_LAB, QUICK_LM = ("single_block", "softmax"), ("tiny-gemma3",)
ALIGNED = 0.5  # a mean cosine from which updates count as aligned ("highly aligned" in the paper's words)
WEAK = 0.1  # below this, a cosine that is above the control still counts as negligible
DEMOS = 5


def describe(name: str) -> str:
    """One line per lab model, read from its configuration."""
    from icl_lens.lab.checkpoints import LAB_MODELS as CONFIGS

    c = CONFIGS[name]
    parts = [f"{c.n_layers} {c.arch} block{'s' if c.n_layers > 1 else ''}", f"d_model {c.d_model}",
             "skip" if c.skip else "no skip", "LayerNorm" if c.layer_norm else "no LayerNorm"]
    if not c.embed:
        parts.append("no embedding, tokens [x, y]" if not c.query_flag else "no embedding")
    parts.append(f"d_x {c.d_x}, up to {c.n_context_train} pairs")
    return ", ".join(parts)


def few_shot_prompts(n_per_task: int, seed: int = 0) -> list[tuple[str, str]]:
    """``(task, prompt)`` pairs: ``DEMOS`` demonstrations ``"query answer"`` then a held-out query
    (capitals, en_fr, en_es), or the task's instruction (the key–value table) then a train query (kv8)."""
    from icl_lens.thought.tasks import load_task

    rng = random.Random(seed)
    out = []
    for name in LM_TASKS:
        task = load_task(name)
        for _ in range(n_per_task):
            if name.startswith("kv"):
                q, _ = rng.choice(task.train)
                out.append((name, task.instruction + q))
            else:
                demos = rng.sample(task.train, DEMOS)
                q, _ = rng.choice(task.test)
                out.append((name, "".join(f"{a} {b}\n" for a, b in demos) + q))
    return out


def verdict(same, control) -> str:
    """``holds`` (interval above the control's and above 0, mean ≥ ALIGNED), ``weak`` (above the control,
    WEAK ≤ mean < ALIGNED), ``negligible`` (above the control, mean < WEAK) or ``no`` (not above the control)."""
    if same.low > max(control.high, 0.0):
        return "holds" if same.mean >= ALIGNED else "weak" if same.mean >= WEAK else "negligible"
    return "no"


def _fmt(ci) -> str:
    return f"{ci.mean:+.3f} [{ci.low:+.3f}, {ci.high:+.3f}]"


def run_lab(names, n_prompts: int, n_probes: int, progress: bool) -> dict:
    from icl_lens.lab.checkpoints import load_lab_model, training_record
    from icl_lens.lab.experiments.patch_parts import patch_parts
    from icl_lens.lab.experiments.implicit_explicit import implicit_vs_explicit
    from icl_lens.lab.experiments.loss_curves import loss_curves

    out = {}
    for name in tqdm(names, desc="lab models", disable=not progress):
        model = load_lab_model(name)
        curves = loss_curves(name, n_prompts=n_prompts, n_probes=n_probes, model=model)
        lr = curves.lrs[curves.best]
        align = implicit_vs_explicit(name, n_prompts=n_prompts, lr=lr, model=model)
        effect = patch_parts(name, n_prompts=n_prompts, model=model)
        out[name] = {"curves": curves, "align": align, "effect": effect, "record": training_record(name)}
    return out


def run_lm(names, n_per_task: int, progress: bool) -> dict:
    from icl_lens import load_model
    from icl_lens.dynamics.context_alignment import context_alignment
    from icl_lens.model.context_effect import context_effect

    prompts = few_shot_prompts(n_per_task)
    texts = [p for _, p in prompts]
    out = {}
    for name in tqdm(names, desc="language models", disable=not progress):
        model = load_model(name)
        t0 = time.perf_counter()
        table = context_alignment(model, texts, progress=progress)
        effect = context_effect(model, texts, positions=[-1])
        n_tokens = [int(model.to_tokens(t).shape[-1]) for t in texts]
        out[name] = {"table": table, "effect": effect, "seconds": time.perf_counter() - t0, "tokens": n_tokens}
        del model
    return out


def alignment_rows(tables: dict) -> pd.DataFrame:
    """One row per model: the paper's cumulative and per-step cosines with controls and variants (means, 95% CIs)."""
    rows = []
    for name, t in tables.items():
        row = {"model": name}
        for order in ("absorb", "prefix"):
            for kind in ("cumulative", "step"):
                row[f"{order} {kind}"] = _fmt(t.ci(f"sgd:{order}:{kind}"))
                row[f"control {order} {kind}"] = _fmt(t.ci(f"control:{order}:{kind}"))
        if "small_lr:absorb:step" in t.per_prompt:
            row["small-rate SGD (absorb step)"] = _fmt(t.ci("small_lr:absorb:step"))
        row["query input (absorb)"] = _fmt(t.ci("query_input:absorb:cumulative"))
        if "at_implicit:prefix:step" in t.per_prompt:
            row["at implicit W (prefix step)"] = _fmt(t.ci("at_implicit:prefix:step"))
        if "input_side:prefix:step" in t.per_prompt:
            row["input-side cos (prefix)"] = f"{t.ci('input_side:prefix:step').mean:+.3f}"
        rnd = t.per_prompt["random:any:any"]
        row["random |cos|"] = f"{float(rnd.abs().mean()):.1e}"
        row["absorb cumulative verdict"] = verdict(t.ci("sgd:absorb:cumulative"), t.ci("control:absorb:cumulative"))
        row["absorb step verdict"] = verdict(t.ci("sgd:absorb:step"), t.ci("control:absorb:step"))
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Implicit vs explicit finetuning (the paper's protocol)")
    ap.add_argument("--quick", action="store_true", help="small sizes for tests (not for reading)")
    ap.add_argument("--lab-prompts", type=int, default=64)
    ap.add_argument("--lm-prompts-per-task", type=int, default=16)
    ap.add_argument("--lab-models", nargs="*", default=list(LAB_MODELS))
    ap.add_argument("--lm-models", nargs="*", default=list(LM_MODELS))
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for the language models (1: on a shared machine a second thread mostly spin-waits)")
    ap.add_argument("--out", default="reports/eval_finetune_alignment.md")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:  # a smoke test of every code path: two lab models, a tiny random language model
        args.lab_prompts, args.lm_prompts_per_task = 4, 1
        args.lab_models = [m for m in args.lab_models if m in QUICK_LAB] or list(QUICK_LAB)
        args.lm_models = list(QUICK_LM)
    if args.lab_prompts < 2 or args.lm_prompts_per_task * len(LM_TASKS) < 2 and args.lm_models:
        raise SystemExit("need at least 2 prompts per experiment (the control pairs each prompt with the next)")
    progress = not args.no_progress
    torch.set_num_threads(args.threads)
    load_before, t0, c0 = load_average(), time.perf_counter(), time.process_time()
    lab_threads = 1  # the lab models are tiny: one thread is fastest
    torch.set_num_threads(lab_threads)
    t_lab = time.perf_counter()
    lab = run_lab(args.lab_models, args.lab_prompts, 8 if args.quick else 32, progress)
    t_lab = time.perf_counter() - t_lab
    torch.set_num_threads(args.threads)
    lm = run_lm(args.lm_models, args.lm_prompts_per_task, progress)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    text, numbers = report(args, lab, lm, wall=wall, cpu=cpu, lab_seconds=t_lab, load_before=load_before, argv=argv)
    json_path = args.out[:-3] + ".json" if args.out.endswith(".md") else args.out + ".json"
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(numbers, f, indent=1)
    print(text)


def _ci_dict(ci) -> dict:
    return {"mean": ci.mean, "low": ci.low, "high": ci.high, "n": ci.n}


def report(args, lab: dict, lm: dict, *, wall: float, cpu: float, lab_seconds: float, load_before: float,
           argv) -> tuple[str, dict]:
    """The Markdown fragment and the JSON numbers; every reading sentence computed from the numbers."""
    numbers: dict = {"lab": {}, "lm": {}, "seconds": wall, "cpu_seconds": cpu, "lab_seconds": lab_seconds,
                     "quick": bool(args.quick), "aligned_threshold": ALIGNED}
    lines = [
        "## Implicit vs explicit finetuning (the paper's protocol)",
        "",
        f"Command: `{command('python -m experiments.finetune_alignment', argv)}`  ",
        f"Machine: {machine(load_before=load_before)}.  ",
        f"Run time: {wall:.0f} s wall, {cpu:.0f} s CPU (lab models {lab_seconds:.0f} s wall, one thread; language "
        f"models {args.threads} thread{'s' if args.threads > 1 else ''}).",
        "",
    ]
    if args.quick:
        lines += ["**Quick mode: sizes for the tests, not for reading.**", ""]
    lines += [
        "**Protocol** (Dherin et al. 2025, arXiv 2507.16003; definitions in docs/design.md §3). For a prompt with "
        "examples c₁..cₙ and a query, the implicit weights Wᵢ of the query's first MLP matrix after i examples come "
        "in two orders: *prefix* (the query sees c₁..cᵢ) and *absorb*, the paper's (c₁..cᵢ absorbed into the "
        "weights, c_{i+1}..cₙ still in context); both start at W₀ and end at the full token patch Wₙ. The explicit "
        "side is SGD on the context-free model, one example per step in the same order, loss ½(ŷ − y)² (lab) or "
        "the cross-entropy of `[BOS, cⱼ]` toward the next prompt token (language models, gradients at W₀: the "
        "small-rate limit). Per layer: *cumulative* = cos(Wᵢ − W₀, Σ_{j≤i} −η∇ℓⱼ), *per step* = "
        "cos(Wᵢ − Wᵢ₋₁, −η∇ℓᵢ), averaged over i; tables give the signed mean over prompts (each prompt's mean over "
        "layers) with its 95% percentile-bootstrap interval. *Control*: the next prompt's SGD steps (other task, "
        "other examples). *Random*: cosines with uniformly random directions of the same weight space.",
        "",
        f"**Verdict rule** (the paper's order): *holds* when the interval lies above the control's upper bound "
        f"(and above 0) and the mean is at least {ALIGNED}; *weak* when it lies above the control with a mean in "
        f"[{WEAK}, {ALIGNED}); *negligible* when it lies above the control with a mean below {WEAK}; *no* otherwise.",
        "",
    ]

    # Models
    rec = pd.DataFrame([{"model": n, "description": describe(n), "train steps": lab[n]["record"]["steps"],
                         "train seconds": round(lab[n]["record"]["seconds"]),
                         "normalised MSE at n_train": lab[n]["record"]["eval_loss_n_train"]} for n in lab])
    if len(rec):
        lines += ["### Lab models", "", "Trained by `python -m icl_lens.lab.train --model NAME` "
                  "(normalised MSE: 0 = exact, 1 ≈ ignoring the context).", "", markdown_table(rec), ""]

    # 1. Loss curves
    if lab:
        lines += ["### 1. Loss curves: in context vs finetuning the first MLP matrix",
                  "Normalised test MSE on 32 held-out probe queries per prompt after i examples (mean over prompts, 95% CI). "
                  "*Finetuned*: the context-free model after i SGD steps on W_in (every layer), at the best rate of the "
                  "sweep (lowest error averaged over i = 1..n).", ""]
        table_rows, sweep_rows = [], []
        for name, r in lab.items():
            curves = r["curves"]
            ctx, ft = curves.errors()
            best = curves.best
            n = curves.n_context
            marks = [i for i in (0, 1, 2, 5, 10) if i < n]
            numbers["lab"].setdefault(name, {})["curves"] = {
                "examples": list(range(n + 1)), "in_context": ctx.mean(0).tolist(),
                "finetuned_best": ft[best].mean(0).tolist(), "best_lr": curves.lrs[best],
                "sweep": curves.sweep().to_dict(orient="list")}
            for method, err in (("in context", ctx), (f"finetuned, lr {curves.lrs[best]:g}", ft[best])):
                table_rows.append({"model": name, "method": method,
                                   **{f"i={i}": f"{float(err[:, i].mean()):.3f}" for i in marks},
                                   "i=n": f"{float(err[:, n].mean()):.3f}", "n": n})
            sw = curves.sweep()
            sweep_rows.append({"model": name, **{f"lr {lr:g}": (f"{v:.3g}" if v == v and v != float("inf") else "diverged")
                                                 for lr, v in zip(sw.lr, sw.test_mse_mean_over_i)}})
        lines += [markdown_table(pd.DataFrame(table_rows).fillna("")), "",
                  "Learning-rate sweep (finetuned error averaged over i = 1..n):", "",
                  markdown_table(pd.DataFrame(sweep_rows)), ""]

    # 2. Weight-space alignment
    tables = {name: r["align"].table() for name, r in lab.items()}
    lm_tables = {name: r["table"] for name, r in lm.items()}
    if tables or lm_tables:
        lines += ["### 2. Weight-space alignment by architecture",
                  "Signed mean cosine [95% CI] over prompts; *small-rate SGD*: every step taken at W₀ (the protocol "
                  "used on the language models); *query input*: one SGD step on the query's own "
                  "context-free input and label instead of the examples (absorb-order Wᵢ, cumulative); *at implicit W*: "
                  "each example's gradient taken at the implicit weights W_{i−1} the trajectory has reached (every "
                  "other layer patched), per step; *input-side cos*: cos(vᵢ, aᵢ) between the query's context-free MLP "
                  "input and the example's (a rank-1 cosine is the product of its input-side and output-side cosines).",
                  "", markdown_table(alignment_rows({**tables, **lm_tables}).fillna("–")), ""]
        for name, t in {**tables, **lm_tables}.items():
            numbers["lab" if name in tables else "lm"].setdefault(name, {})["alignment"] = {
                "summary": t.summary().to_dict(orient="records"),
                "per_layer": t.per_layer([f"sgd:{o}:{k}" for o in ("prefix", "absorb") for k in ("cumulative", "step")]
                                         + ["control:absorb:cumulative", "control:absorb:step"]).to_dict(orient="records"),
                "dim": t.dim}
        for name in [n for n in ("softmax", "gemma-3-270m", "smollm2-135m") if n in {**tables, **lm_tables}]:
            t = {**tables, **lm_tables}[name]
            keys = ["sgd:absorb:cumulative", "sgd:absorb:step", "control:absorb:cumulative", "sgd:prefix:cumulative",
                    "sgd:prefix:step", "query_input:absorb:cumulative"]
            pl = t.per_layer(keys)
            wide = pl.assign(value=[f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for m, lo, hi in zip(pl["mean"], pl.low, pl.high)])
            wide = wide.pivot(index="layer", columns="key", values="value")[keys].reset_index()
            wide.columns = ["layer", "absorb cumulative", "absorb step", "control absorb cumulative",
                            "prefix cumulative", "prefix step", "query input"]
            lines += [f"Per layer, `{name}`:", "", markdown_table(wide), ""]

    # 3. Function space
    if lab:
        rows = []
        for name, r in lab.items():
            fc = r["curves"].function_cosines()
            entry = {k: _ci_dict(_mean_ci(v[:, -1])) for k, v in fc.items()}
            numbers["lab"][name]["function_space"] = entry
            rows.append({"model": name, **{k.replace("_", " "): _fmt(_mean_ci(v[:, -1])) for k, v in fc.items()}})
        lines += ["### 3. Function-space alignment (after all n examples)",
                  "cos(Δf_ctx, Δf_sgd) over the 32 probe queries between the change of predictions caused by the "
                  "context and by the finetuning (best rate); the control pairs one prompt's Δf_ctx with the next "
                  "prompt's Δf_sgd; the last two columns give each change's cosine with the residual y − f₀.", "",
                  markdown_table(pd.DataFrame(rows)), ""]

    # 4. Where the effect lives
    eff_rows = []
    for name, r in lab.items():
        s = r["effect"].summary().set_index("variant")
        numbers["lab"][name]["effect"] = s.reset_index().to_dict(orient="records")
        eff_rows.append({"model": name, "measure": "task MSE (normalised)",
                         **{v: f"{s.task_mse[v]:.3f}" for v in ("none", "w_in", "correction", "full")},
                         "unexplained, W_in only": f"{s.unexplained['w_in']:.3f}",
                         "unexplained, corrections only": f"{s.unexplained['correction']:.3f}"})
    for name, r in lm.items():
        kl = r["effect"].kl
        un = r["effect"].unexplained()
        numbers["lm"].setdefault(name, {})["effect"] = {k: {"mean_kl": float(v.double().mean()), "unexplained": un[k]}
                                                        for k, v in kl.items()}
        eff_rows.append({"model": name, "measure": "KL to contextual (nats)",
                         **{v: f"{float(kl[v].double().mean()):.3g}" for v in ("none", "w_in", "correction", "full")},
                         "unexplained, W_in only": f"{un['w_in']:.3f}",
                         "unexplained, corrections only": f"{un['correction']:.3f}"})
    if eff_rows:
        lines += ["### 4. Where the context effect lives",
                  "The query run context-free with every layer's patch (*full*), only the W_in (W_gate, W_up) "
                  "patches, only the skip corrections, or nothing. Lab: normalised MSE to y at the query (n_train "
                  "pairs); language models: KL(contextual ‖ variant) of the next-token distribution at the prompt's "
                  "last token. *Unexplained* = Σ(variant − contextual)² / Σ(none − contextual)² (lab) or mean KL / "
                  "mean KL without patch (language models): 0 = the part reproduces the whole context effect.", "",
                  markdown_table(pd.DataFrame(eff_rows)), ""]

    # 5. Language models' setting
    if lm:
        counts = {n: r["tokens"] for n, r in lm.items()}
        lines += ["### 5. Language-model prompts",
                  f"{len(next(iter(counts.values())))} few-shot prompts, {args.lm_prompts_per_task} per task "
                  f"({', '.join(LM_TASKS)}): {DEMOS} demonstrations `query answer` and a held-out query, or the "
                  "key–value table of kv8 and one of its keys; the query is the last token. "
                  + "; ".join(f"`{n}`: {min(c)}–{max(c)} tokens, {lm[n]['seconds']:.0f} s" for n, c in counts.items())
                  + ".", ""]
        for n, r in lm.items():
            numbers["lm"][n]["tokens"] = r["tokens"]
            numbers["lm"][n]["seconds"] = r["seconds"]

    lines += ["### Reading (computed from the tables above)", "", *reading(lab, tables, lm_tables, lm), ""]
    return write_fragment(args.out, lines), numbers


def _mean_ci(values):
    from icl_lens.stats.bootstrap import bootstrap_mean

    return bootstrap_mean(values.double().numpy())


def reading(lab: dict, tables: dict, lm_tables: dict, lm: dict) -> list[str]:
    """Sentences computed from the results with the stated rules."""
    out = []
    everything = {**tables, **lm_tables}
    side = {n: t.ci("input_side:prefix:step").mean for n, t in tables.items() if "input_side:prefix:step" in t.per_prompt}
    if everything:
        by = {}
        for name, t in everything.items():
            for kind in ("cumulative", "step"):
                by.setdefault((kind, verdict(t.ci(f"sgd:absorb:{kind}"), t.ci(f"control:absorb:{kind}"))), []).append(name)
        for kind in ("step", "cumulative"):
            parts = []
            for v in ("holds", "weak", "negligible", "no"):
                names = by.get((kind, v), [])
                if names:
                    parts.append(f"*{v}* for " + ", ".join(
                        f"{n} ({everything[n].ci(f'sgd:absorb:{kind}').mean:+.3f} vs control "
                        f"{everything[n].ci(f'control:absorb:{kind}').mean:+.3f})" for n in names))
            out.append(f"- The paper's alignment claim, {'per step' if kind == 'step' else 'cumulative'} "
                       f"(absorb order): " + "; ".join(parts) + ".")
        flips = [n for n, t in everything.items()
                 if verdict(t.ci("sgd:prefix:step"), t.ci("control:prefix:step")) != verdict(t.ci("sgd:absorb:step"), t.ci("control:absorb:step"))]
        if flips:
            out.append("- The per-step verdict depends on the order for " + ", ".join(
                f"{n} (prefix {everything[n].ci('sgd:prefix:step').mean:+.3f}, absorb {everything[n].ci('sgd:absorb:step').mean:+.3f})"
                for n in flips) + ".")
        q = {n: t.ci("query_input:absorb:cumulative") for n, t in everything.items()}
        higher = [n for n in everything if q[n].low > everything[n].ci("sgd:absorb:cumulative").high]
        if higher:
            out.append("- One SGD step on the query's own input aligns better than SGD on the examples (interval above) "
                       "for " + ", ".join(f"{n} ({q[n].mean:+.3f} vs {everything[n].ci('sgd:absorb:cumulative').mean:+.3f})"
                                          for n in higher) + ".")
        if side:
            out.append("- Per-step cosine (absorb order) beside the input-side cosine cos(vᵢ, aᵢ), sorted by the latter: "
                       + ", ".join(f"{n} {everything[n].ci('sgd:absorb:step').mean:+.3f} (input side {side[n]:+.3f})"
                                   for n in sorted(side, key=side.get, reverse=True))
                       + ". A rank-1 cosine is the product of its input-side and output-side cosines; where the input "
                       "side is near 1, every context-free MLP input points the same way and the weight-space cosine "
                       "measures the output side alone.")
    if lab:
        learns, fails = [], []
        for name, r in lab.items():
            ctx, ft = r["curves"].errors()
            b = r["curves"].best
            start, end, ictx = float(ctx[:, 0].mean()), float(ft[b][:, -1].mean()), float(ctx[:, -1].mean())
            if end < 0.8 * start:
                learns.append(f"{name} ({start:.2f} → {end:.2f}; in context {ictx:.2f})")
            else:
                inputs = f"; input-side cosine {side[name]:+.3f}" if name in side else ""
                fails.append(f"{name} ({start:.2f} → {end:.2f}; in context {ictx:.2f}{inputs})")
        if fails:
            out.append("- Finetuning W_in does not lower the test error by 20% at any swept rate for: " + "; ".join(fails)
                       + ". There the loss curves cannot overlap; an input-side cosine near 1 means W_in receives "
                       "almost the same context-free input whatever the query x, so no update of W_in can fit wᵀx.")
        if learns:
            out.append("- Finetuning W_in lowers the test error (by ≥ 20%, best rate) for: " + "; ".join(learns) + ".")
        implied = []
        for name, r in lab.items():
            fc = r["curves"].function_cosines()
            implied.append(f"{name} {float(fc['same_prompt'][:, -1].mean()):+.2f} (control {float(fc['control'][:, -1].mean()):+.2f}, "
                           f"context vs residual {float(fc['context_vs_residual'][:, -1].mean()):+.2f}, finetuned vs residual "
                           f"{float(fc['finetuned_vs_residual'][:, -1].mean()):+.2f})")
        out.append("- Function space (after n examples): " + "; ".join(implied) + ". Where both changes point along the "
                   "residual y − f₀ (both reduce the error), a high function-space cosine follows from that alone.")
        corr, win = [], []
        for name, r in lab.items():
            s = r["effect"].summary().set_index("variant").unexplained
            item = f"{name} (W_in only leaves {s['w_in']:.2f}, corrections only {s['correction']:.2f})"
            (corr if s["correction"] < s["w_in"] else win).append(item)
        if corr:
            out.append("- The context effect lives mostly in the skip corrections (they alone leave less unexplained) for: "
                       + "; ".join(corr) + ".")
        if win:
            out.append("- It lives mostly in the W_in patches for: " + "; ".join(win) + ".")
    for name, r in lm.items():
        un = r["effect"].unexplained()
        where = "the skip corrections" if un["correction"] < un["w_in"] else "the W_in/W_gate patches"
        out.append(f"- {name}: W_in patches alone leave {un['w_in']:.2f} of the KL, corrections alone "
                   f"{un['correction']:.2f}, the full patch {un['full']:.1e}: the effect lives mostly in {where}.")
    return out


if __name__ == "__main__":
    main()
