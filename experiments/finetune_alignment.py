"""Evaluation: implicit vs explicit finetuning, measured the way Dherin et al. 2025 measure it.

``python -m experiments.finetune_alignment [--quick]`` writes
``reports/eval_finetune_alignment.md`` and ``reports/eval_finetune_alignment.json``.

The paper (arXiv 2507.16003, §4–5) claims that the implicit updates of a context (token
patches, and their steps as the context is consumed) track explicit finetuning on the
same examples. This command measures, with the library's functions:

1. loss curves: test error against the number of examples consumed, in context and by
   SGD on the first MLP matrix (one pair per step, a learning-rate sweep)
   (:func:`icl_lens.lab.experiments._loss_curves.loss_curves`), for every lab model;
2. weight-space alignment, cumulative and per step, in the prefix and the paper's
   absorb order, with a mismatched-prompt control, variants that isolate the cause and a
   random-direction baseline (:func:`icl_lens.lab.experiments._implicit_explicit.implicit_vs_explicit`);
3. function-space alignment (:meth:`LossCurves.function_cosines`);
4. where the context effect lives: full patch, W_in patches only, corrections only
   (:func:`icl_lens.lab.experiments._patch_parts.patch_parts`,
   :func:`icl_lens.patches._context_effect.context_effect`);
5. the per-token protocol on Gemma 3 270M and SmolLM2-135M
   (:func:`icl_lens.dynamics._context_alignment.context_alignment`), on few-shot prompts built
   from the shipped thought-patch tasks.

6. a capacity test beside one-pass SGD (:func:`icl_lens.lab.experiments._capacity.capacity_test`):
   a damped ridge least-squares fit of ``W_in`` on the same pairs and small-step SGD;
7. a one-factor-at-a-time ablation from ``single_block`` toward ``one_block``
   (:data:`icl_lens.lab._checkpoints.ABLATION_MODELS`).

Every lab model is measured over its training seeds (:mod:`icl_lens.lab.seeds`; seeds not
in the cache are skipped and the JSON lists the seeds used under ``seeds``); intervals
resample seeds, then prompts (:func:`icl_lens.stats._bootstrap.bootstrap_mean_nested`).
The paper (arXiv 2507.16003) ran the protocol on regression only: the language-model rows
are this project's extension of it. Every sentence of the reading is computed from the
numbers with the rules stated in it.
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

ABLATION = ("single_block", "sb_no_attn_bias", "sb_embed", "sb_wide", "sb_task", "one_block")
LAB_MODELS = (*ABLATION, "one_block_skip", "one_block_ln", "one_block_preln", "skip_only", "softmax", "linear", "delta",
              "gru")
SEEDS = (0, 1, 2)
FITS = 0.8  # a fit "lowers the test error" when it ends below FITS × the context-free model's error
LM_MODELS = ("gemma-3-270m", "smollm2-135m")
LM_TASKS = ("capitals", "en_fr", "en_es", "kv8")
QUICK_LAB, QUICK_LM = ("single_block", "softmax"), ("tiny-gemma3",)
ALIGNED = 0.5  # a mean cosine from which updates count as aligned ("highly aligned" in the paper's words)
WEAK = 0.1  # below this, a cosine that is above the control still counts as negligible
DEMOS = 5


def describe(name: str) -> str:
    """One line per lab model, read from its configuration."""
    from icl_lens.lab import seeds as lab_seeds

    c = lab_seeds.MODELS[name]
    parts = [f"{c.n_layers} {c.arch} block{'s' if c.n_layers > 1 else ''}", f"d_model {c.d_model}",
             "skip" if c.skip else "no skip", "LayerNorm" if c.layer_norm else "no LayerNorm"]
    if not c.embed:
        parts.append("no embedding, tokens [x, y]" if not c.query_flag else "no embedding")
    if not c.attn_bias:
        parts.append("no attention-output bias")
    parts.append(f"d_x {c.d_x}, up to {c.n_context_train} pairs")
    return ", ".join(parts)


class Pooled:
    """The alignment tables of one model's seeds: ``ci(key)`` resamples seeds, then prompts."""

    def __init__(self, tables):
        if not tables:
            raise ValueError("Pooled needs at least one table")
        self.tables = list(tables)
        self.per_prompt = self.tables[0].per_prompt
        self.dim = self.tables[0].dim

    def values(self, key: str) -> list:
        return [t.per_prompt[key].double().mean(1).numpy() for t in self.tables]

    def ci(self, key: str):
        from icl_lens.stats import bootstrap_mean_nested

        return bootstrap_mean_nested(self.values(key))

    def per_layer(self, keys):
        return self.tables[0].per_layer(keys)

    def summary(self) -> list[dict]:
        rows = []
        for key, c in self.per_prompt.items():
            comparison, order, kind = key.split(":")
            ci = self.ci(key)
            rows.append({"comparison": comparison, "order": order, "kind": kind, "mean": ci.mean, "low": ci.low,
                         "high": ci.high, "mean_abs": float(sum(float(t.per_prompt[key].abs().double().mean())
                                                                for t in self.tables) / len(self.tables)),
                         "prompts": int(c.shape[0]), "seeds": len(self.tables),
                         "per_seed": [float(v.mean()) for v in self.values(key)]})
        return rows

    def per_seed(self, key: str) -> str:
        """Each seed's mean, ``+0.39/-0.05/+0.12``."""
        return "/".join(f"{float(v.mean()):+.2f}" for v in self.values(key))


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


def run_lab(names, n_prompts: int, n_probes: int, progress: bool, seeds=SEEDS) -> dict:
    """Per model: the runs of every cached seed (loss curves, alignment, where the effect lives, capacity)."""
    from icl_lens.lab.experiments import capacity_test
    from icl_lens.lab.experiments import implicit_vs_explicit
    from icl_lens.lab.experiments import loss_curves
    from icl_lens.lab.experiments import patch_parts
    from icl_lens.lab import seeds as lab_seeds

    out = {}
    for name in tqdm(names, desc="lab models", disable=not progress):
        runs = []
        for seed in seeds:
            try:
                model, record = lab_seeds.seed_model(name, seed, train_missing=False)
            except FileNotFoundError:
                continue
            curves = loss_curves(name, n_prompts=n_prompts, n_probes=n_probes, model=model)
            lr = curves.lrs[curves.best]
            runs.append({"seed": seed, "record": record, "curves": curves,
                         "align": implicit_vs_explicit(name, n_prompts=n_prompts, lr=lr, model=model),
                         "effect": patch_parts(name, n_prompts=n_prompts, model=model),
                         "capacity": capacity_test(model, curves, n_prompts=n_prompts, n_probes=n_probes)})
        if runs:
            out[name] = {"seeds": [r["seed"] for r in runs], "runs": runs}
    return out


def run_lm(names, n_per_task: int, progress: bool) -> dict:
    from icl_lens import load_model
    from icl_lens.dynamics import context_alignment
    from icl_lens.patches import context_effect

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


class FromSummary:
    """A language model's alignment rows read back from an earlier report's JSON (``--reuse-lm``)."""

    def __init__(self, entry: dict):
        from icl_lens.stats import MeanCI

        self.rows = {f"{r['comparison']}:{r['order']}:{r['kind']}": r for r in entry["alignment"]["summary"]}
        self.per_prompt = dict.fromkeys(self.rows)
        self.dim = entry["alignment"]["dim"]
        self._ci = lambda r: MeanCI(r["mean"], r["low"], r["high"], r.get("prompts", 0))  # noqa: E731
        self._per_layer = entry["alignment"].get("per_layer", [])

    def ci(self, key: str):
        return self._ci(self.rows[key])

    def summary(self) -> list[dict]:
        return list(self.rows.values())

    def mean_abs(self, key: str) -> float:
        return self.rows[key]["mean_abs"]

    def per_layer(self, keys):
        frame = pd.DataFrame(self._per_layer)
        return frame[frame.key.isin(keys)] if len(frame) else frame


def lm_label(name: str) -> str:
    return f"{name} (extension)"


def _random_abs(t) -> float:
    if isinstance(t, FromSummary):
        return t.mean_abs("random:any:any")
    return float(sum(float(x.per_prompt["random:any:any"].abs().mean()) for x in t.tables) / len(t.tables))


def alignment_rows(tables: dict, lm_names=()) -> pd.DataFrame:
    """One row per model and order: the cumulative and per-step cosines beside their controls, the per-step
    cosine's output side and input share, and the variants (means, 95% CIs over seeds and prompts)."""
    rows = []
    for name, t in tables.items():
        for order in ("absorb", "prefix"):
            has = lambda k: k in t.per_prompt  # noqa: E731
            row = {"model": lm_label(name) if name in lm_names else name, "order": order}
            for kind in ("cumulative", "step"):
                row[kind] = _fmt(t.ci(f"sgd:{order}:{kind}"))
                row[f"control {kind}"] = _fmt(t.ci(f"control:{order}:{kind}"))
            row["output side"] = f"{t.ci(f'out_side:{order}:step').mean:+.3f}" if has(f"out_side:{order}:step") else "–"
            row["input share"] = f"{t.ci(f'in_share:{order}:step').mean:.3f}" if has(f"in_share:{order}:step") else "–"
            row["cos(v, a)"] = f"{t.ci(f'input_side:{order}:step').mean:+.3f}" if has(f"input_side:{order}:step") else "–"
            for kind in ("cumulative", "step"):
                key = f"at_implicit:{order}:{kind}"
                row[f"at implicit W {kind}"] = _fmt(t.ci(key)) if has(key) else "–"
            row["small-rate step"] = _fmt(t.ci(f"small_lr:{order}:step")) if has(f"small_lr:{order}:step") else "–"
            row["query input"] = _fmt(t.ci(f"query_input:{order}:cumulative"))
            row["random |cos|"] = f"{_random_abs(t):.1e}"
            for kind in ("cumulative", "step"):
                row[f"verdict {kind}"] = verdict(t.ci(f"sgd:{order}:{kind}"), t.ci(f"control:{order}:{kind}"))
            rows.append(row)
    return pd.DataFrame(rows)


def ablation_rows(tables: dict, lab: dict) -> pd.DataFrame:
    """The single block, each one-factor variant and one_block: every cosine beside its own control."""
    from icl_lens.lab import ABLATION_FACTOR

    rows = []
    for name in [n for n in ABLATION if n in tables]:
        t = tables[name]
        factor = ("reference" if name == "single_block" else "all of one_block's factors" if name == "one_block"
                  else ABLATION_FACTOR[name])
        ctx = [float(r["curves"].errors()[0][:, -1].mean()) for r in lab[name]["runs"]]
        row = {"variant": name, "changed from single_block": factor, "seeds": len(lab[name]["runs"]),
               "in-context MSE at n": f"{sum(ctx) / len(ctx):.3f}"}
        for order in ("absorb", "prefix"):
            for kind in ("step", "cumulative"):
                row[f"{order} {kind} (control)"] = (f"{_fmt(t.ci(f'sgd:{order}:{kind}'))} "
                                                    f"({t.ci(f'control:{order}:{kind}').mean:+.3f})")
            row[f"{order} step verdict"] = verdict(t.ci(f"sgd:{order}:step"), t.ci(f"control:{order}:step"))
            row[f"{order} step per seed"] = t.per_seed(f"sgd:{order}:step")
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Implicit vs explicit finetuning (the paper's protocol)")
    ap.add_argument("--quick", action="store_true", help="small sizes for tests (not for reading)")
    ap.add_argument("--lab-prompts", type=int, default=64)
    ap.add_argument("--lm-prompts-per-task", type=int, default=16)
    ap.add_argument("--lab-models", nargs="*", default=list(LAB_MODELS))
    ap.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS),
                    help="training seeds (those cached by `python -m icl_lens.lab.seeds`; others are skipped)")
    ap.add_argument("--lm-models", nargs="*", default=list(LM_MODELS))
    ap.add_argument("--reuse-lm", default=None, metavar="JSON",
                    help="take the language-model rows from this earlier report JSON instead of re-measuring them")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for the language models (1: on a shared machine a second thread mostly spin-waits)")
    ap.add_argument("--out", default="reports/eval_finetune_alignment.md")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:  # a smoke test of every code path: two lab models, a tiny random language model
        args.lab_prompts, args.lm_prompts_per_task = 4, 1
        args.lab_models = [m for m in args.lab_models if m in QUICK_LAB] or list(QUICK_LAB)
        args.lm_models = list(QUICK_LM) if not args.reuse_lm else args.lm_models
        args.seeds = args.seeds[:1]
    if args.lab_prompts < 2 or args.lm_prompts_per_task * len(LM_TASKS) < 2 and args.lm_models:
        raise SystemExit("need at least 2 prompts per experiment (the control pairs each prompt with the next)")
    progress = not args.no_progress
    load_before, t0, c0 = load_average(), time.perf_counter(), time.process_time()
    torch.set_num_threads(1)  # the lab models are tiny: one thread is fastest
    t_lab = time.perf_counter()
    lab = run_lab(args.lab_models, args.lab_prompts, 8 if args.quick else 32, progress, seeds=args.seeds)
    t_lab = time.perf_counter() - t_lab
    torch.set_num_threads(args.threads)
    if args.reuse_lm:
        with open(args.reuse_lm, encoding="utf-8") as f:
            earlier = json.load(f)["lm"]
        lm = {n: {"reused": earlier[n]} for n in args.lm_models if n in earlier}
    else:
        lm = run_lm(args.lm_models, args.lm_prompts_per_task, progress)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    text, numbers = report(args, lab, lm, wall=wall, cpu=cpu, lab_seconds=t_lab, load_before=load_before, argv=argv)
    json_path = args.out[:-3] + ".json" if args.out.endswith(".md") else args.out + ".json"
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(numbers, f, indent=1)
    print(text)


def _ci_dict(ci) -> dict:
    return {"mean": ci.mean, "low": ci.low, "high": ci.high, "n": ci.n}


def _nested(values) -> "object":
    from icl_lens.stats import bootstrap_mean_nested

    return bootstrap_mean_nested([v.double().numpy() for v in values])


def report(args, lab: dict, lm: dict, *, wall: float, cpu: float, lab_seconds: float, load_before: float,
           argv) -> tuple[str, dict]:
    """The Markdown fragment and the JSON numbers; every reading sentence computed from the numbers."""
    numbers: dict = {"lab": {}, "lm": {}, "seconds": wall, "cpu_seconds": cpu, "lab_seconds": lab_seconds,
                     "quick": bool(args.quick), "aligned_threshold": ALIGNED, "weak_threshold": WEAK,
                     "fits_threshold": FITS, "seeds": {n: r["seeds"] for n, r in lab.items()},
                     "lm_reused_from": args.reuse_lm}
    reused = bool(args.reuse_lm)
    lines = [
        "## Implicit vs explicit finetuning (the paper's protocol)",
        "",
        f"Command: `{command('python -m experiments.finetune_alignment', argv)}`  ",
        f"Machine: {machine(load_before=load_before)}.  ",
        f"Run time: {wall:.0f} s wall, {cpu:.0f} s CPU (lab models {lab_seconds:.0f} s wall, one thread"
        + (f"; language-model rows reused from `{args.reuse_lm}`, not re-measured in this run)." if reused else
           f"; language models {args.threads} thread{'s' if args.threads > 1 else ''})."),
        "",
    ]
    if args.quick:
        lines += ["**Quick mode: sizes for the tests, not for reading.**", ""]
    seed_counts = sorted({len(r["seeds"]) for r in lab.values()})
    lines += [
        "**Protocol** (Dherin et al. 2025, arXiv 2507.16003, §5; definitions in docs/design.md §3). For a prompt with "
        "examples c₁..cₙ and a query, the implicit weights Wᵢ of the query's first MLP matrix after i examples come "
        "in two orders: *prefix* (the query sees c₁..cᵢ) and *absorb*, the paper's (c₁..cᵢ absorbed into the "
        "weights, c_{i+1}..cₙ still in context); both start at W₀ and end at the full token patch Wₙ. The explicit "
        "side is SGD on the context-free model, one example per step in the same order, loss ½(ŷ − y)² (lab) or "
        "the cross-entropy of `[BOS, cⱼ]` toward the next prompt token (language models, gradients at W₀: the "
        "small-rate limit). Per layer: *cumulative* = cos(Wᵢ − W₀, Σ_{j≤i} −η∇ℓⱼ), *per step* = "
        "cos(Wᵢ − Wᵢ₋₁, −η∇ℓᵢ), averaged over i; tables give the signed mean (each prompt's mean over layers, "
        "averaged over prompts and training seeds) with its 95% two-stage bootstrap interval (seeds resampled, then "
        f"prompts within each; {'/'.join(map(str, seed_counts))} seed(s) per model, listed in the JSON under `seeds`). "
        "*Control*: the next prompt's SGD steps (other task, other examples). *Random*: cosines with uniformly "
        "random directions of the same weight space. The paper ran this protocol on regression only; the "
        "language-model rows, marked *(extension)*, are this project's extension of it.",
        "",
        f"**Verdict rule** (decided before the run, for each order and kind): *holds* when the interval lies above "
        f"the control's upper bound (and above 0) and the mean is at least {ALIGNED}; *weak* when it lies above the "
        f"control with a mean in [{WEAK}, {ALIGNED}); *negligible* when it lies above the control with a mean below "
        f"{WEAK}; *no* otherwise. A fit *lowers the test error* when it ends below {FITS} × the context-free error.",
        "",
    ]

    # Models
    rec = pd.DataFrame([{"model": n, "description": describe(n), "seeds": ", ".join(map(str, r["seeds"])),
                         "train steps": r["runs"][0]["record"]["steps"],
                         "train seconds (per seed)": ", ".join(f"{x['record']['seconds']:.0f}" for x in r["runs"]),
                         "normalised MSE at n_train (per seed)": ", ".join(f"{x['record']['eval_loss_n_train']:.3f}"
                                                                            for x in r["runs"])}
                        for n, r in lab.items()])
    for n, r in lab.items():
        numbers["lab"][n] = {"seeds": r["seeds"], "records": [x["record"] for x in r["runs"]]}
    if len(rec):
        lines += ["### Lab models", "", "Trained by `python -m icl_lens.lab.seeds` (seed 0 of a shipped model is its "
                  "shipped checkpoint; normalised MSE: 0 = exact, 1 ≈ ignoring the context).", "",
                  markdown_table(rec), ""]

    # 1. Loss curves (prompts of every seed pooled)
    if lab:
        lines += ["### 1. Loss curves: in context vs finetuning the first MLP matrix",
                  "Normalised test MSE on 32 held-out probe queries per prompt after i examples (mean over seeds and "
                  "prompts). *Finetuned*: the context-free model after i SGD steps on W_in (every layer), at each "
                  "seed's best rate of the sweep (lowest error averaged over i = 1..n).", ""]
        table_rows, sweep_rows = [], []
        for name, r in lab.items():
            errs = [x["curves"].errors() for x in r["runs"]]
            ctx = torch.cat([e[0] for e in errs])
            ft = torch.cat([e[1][x["curves"].best] for e, x in zip(errs, r["runs"])])
            n = r["runs"][0]["curves"].n_context
            marks = [i for i in (0, 1, 2, 5, 10) if i < n]
            best = [x["curves"].lrs[x["curves"].best] for x in r["runs"]]
            numbers["lab"][name]["curves"] = {
                "examples": list(range(n + 1)), "in_context": ctx.mean(0).tolist(), "finetuned_best": ft.mean(0).tolist(),
                "best_lr": best, "sweep": [x["curves"].sweep().to_dict(orient="list") for x in r["runs"]]}
            for method, err in (("in context", ctx), (f"finetuned, lr {'/'.join(f'{b:g}' for b in best)}", ft)):
                table_rows.append({"model": name, "method": method,
                                   **{f"i={i}": f"{float(err[:, i].mean()):.3f}" for i in marks},
                                   "i=n": f"{float(err[:, n].mean()):.3f}", "n": n})
            sw = [x["curves"].sweep() for x in r["runs"]]
            mean_over_i = sum(torch.tensor(x.test_mse_mean_over_i.to_numpy()) for x in sw) / len(sw)
            sweep_rows.append({"model": name, **{f"lr {lr:g}": (f"{float(v):.3g}" if torch.isfinite(v) else "diverged")
                                                 for lr, v in zip(sw[0].lr, mean_over_i)}})
        lines += [markdown_table(pd.DataFrame(table_rows).fillna("")), "",
                  "Learning-rate sweep (finetuned error averaged over i = 1..n, mean over seeds):", "",
                  markdown_table(pd.DataFrame(sweep_rows)), ""]

    # 2. Weight-space alignment
    tables = {name: Pooled([x["align"].table() for x in r["runs"]]) for name, r in lab.items()}
    lm_tables = {name: (FromSummary(r["reused"]) if "reused" in r else Pooled([r["table"]])) for name, r in lm.items()}
    everything = {**tables, **lm_tables}
    if everything:
        lines += ["### 2. Weight-space alignment, each order beside its own sides and controls",
                  "Signed mean cosine [95% CI]. *output side* = cos(ΔPᵢ âᵢ, gᵢ) and *input share* = ‖ΔPᵢ âᵢ‖ / ‖ΔPᵢ‖ "
                  "(ΔPᵢ = Wᵢ − Wᵢ₋₁ of that order, âᵢ the unit input and gᵢ the output factor of SGD step i): per step "
                  "the per-step cosine is exactly their product (the table shows each one's mean over steps); "
                  "*cos(v, a)* = cos(vᵢ, aᵢ) between the query's context-free MLP input and the example's (it is the "
                  "input share only where ΔPᵢ is rank-1). *at implicit W*: each example's gradient taken at the "
                  "implicit weights W_{i−1} the trajectory has reached (every other layer patched; prefix order); "
                  "*small-rate*: every step taken at W₀ (the language models' protocol); *query input*: one SGD step on "
                  "the query's own context-free input and label (cumulative).", "",
                  markdown_table(alignment_rows(everything, lm_names=tuple(lm_tables)).fillna("–")), ""]
        for name, t in everything.items():
            if isinstance(t, FromSummary):
                numbers["lm"].setdefault(name, {})["alignment"] = lm[name]["reused"]["alignment"]
                continue
            numbers["lab" if name in tables else "lm"].setdefault(name, {})["alignment"] = {
                "summary": t.summary(),
                "per_layer": t.per_layer([f"sgd:{o}:{k}" for o in ("prefix", "absorb") for k in ("cumulative", "step")]
                                         + ["control:absorb:cumulative", "control:absorb:step"]).to_dict(orient="records"),
                "per_layer_seed": r_seed0(lab, name), "dim": t.dim}
        abl = ablation_rows(tables, lab)
        if len(abl) > 1:
            numbers["ablation"] = abl.to_dict(orient="records")
            lines += ["### 2b. One factor at a time: from the single block toward one_block",
                      "Each variant changes ONE factor of `single_block` toward `one_block` (same recipe as the single "
                      "block); `one_block` changes all of them (and trains 4 heads at rate 2e-3). Each cosine [95% CI] "
                      "with its own control's mean in parentheses; *per seed*: each training seed's mean (seeds in the "
                      "order of the JSON's `seeds`).", "", markdown_table(abl), ""]
        if "softmax" in everything:
            t = everything["softmax"]
            keys = ["sgd:absorb:cumulative", "sgd:absorb:step", "control:absorb:cumulative", "sgd:prefix:cumulative",
                    "sgd:prefix:step"]
            pl = t.per_layer(keys)
            wide = pl.assign(value=[f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for m, lo, hi in zip(pl["mean"], pl.low, pl.high)])
            wide = wide.pivot(index="layer", columns="key", values="value")[keys].reset_index()
            wide.columns = ["layer", "absorb cumulative", "absorb step", "control absorb cumulative",
                            "prefix cumulative", "prefix step"]
            lines += [f"Per layer, `softmax` (seed {lab['softmax']['seeds'][0]}, interval over prompts):", "",
                      markdown_table(wide), ""]

    # 3. Capacity
    cap_rows = []
    if lab:
        from icl_lens.lab.experiments import METHODS

        for name, r in lab.items():
            entry = {}
            for m in METHODS:
                ci = _nested([x["capacity"].test[m] for x in r["runs"]])
                train = [x["capacity"].train[m] for x in r["runs"] if m in x["capacity"].train]
                entry[m] = {**_ci_dict(ci), "train_mse": (float(torch.cat(train).double().mean()) if train else None)}
            numbers["lab"][name]["capacity"] = entry
            cap_rows.append({"model": name, **{m: f"{entry[m]['mean']:.3f} [{entry[m]['low']:.3f}, {entry[m]['high']:.3f}]"
                                               + (f" ({entry[m]['train_mse']:.3f})" if entry[m]["train_mse"] is not None else "")
                                               for m in METHODS}})
        c0 = lab[next(iter(lab))]["runs"][0]["capacity"]
        lines += ["### 3. Capacity: can any update of W_in fit the pairs?",
                  "Normalised test MSE on the probes [95% CI over seeds and prompts] and, in parentheses, the MSE on "
                  "the prompt's own pairs. *W0*: context-free model; *SGD one pass*: the loss curves' best rate; "
                  f"*SGD small steps*: {c0.epochs} passes at 1/{c0.epochs} of that rate; *ridge least squares*: "
                  f"{c0.iterations} damped Gauss–Newton steps on every layer's W_in, each a ridge least-squares fit "
                  f"(ridge {c0.ridge:g} × the mean eigenvalue of the pairs' kernel) through the package's "
                  "`factored_least_squares` (`icl_lens.lab.experiments.capacity_test`).", "",
                  markdown_table(pd.DataFrame(cap_rows)), ""]

    # 4. Function space
    if lab:
        rows = []
        for name, r in lab.items():
            fcs = [x["curves"].function_cosines() for x in r["runs"]]
            entry = {k: _ci_dict(_nested([fc[k][:, -1] for fc in fcs])) for k in fcs[0]}
            numbers["lab"][name]["function_space"] = entry
            rows.append({"model": name, **{k.replace("_", " "): f"{v['mean']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}]"
                                           for k, v in entry.items()}})
        lines += ["### 4. Function-space alignment (after all n examples)",
                  "cos(Δf_ctx, Δf_sgd) over the 32 probe queries between the change of predictions caused by the "
                  "context and by the finetuning (best rate); the control pairs one prompt's Δf_ctx with the next "
                  "prompt's Δf_sgd; the last two columns give each change's cosine with the residual y − f₀.", "",
                  markdown_table(pd.DataFrame(rows)), ""]

    # 5. Where the effect lives
    eff_rows = []
    for name, r in lab.items():
        frames = [x["effect"].summary().set_index("variant") for x in r["runs"]]
        s = sum(f[["task_mse", "unexplained"]] for f in frames) / len(frames)
        numbers["lab"][name]["effect"] = s.reset_index().to_dict(orient="records")
        eff_rows.append({"model": name, "measure": "task MSE (normalised)",
                         **{v: f"{s.task_mse[v]:.3f}" for v in ("none", "w_in", "correction", "full")},
                         "unexplained, W_in only": f"{s.unexplained['w_in']:.3f}",
                         "unexplained, corrections only": f"{s.unexplained['correction']:.3f}"})
    for name, r in lm.items():
        if "reused" in r:
            eff = r["reused"]["effect"]
            numbers["lm"][name]["effect"] = eff
            kl = {k: v["mean_kl"] for k, v in eff.items()}
            un = {k: v["unexplained"] for k, v in eff.items()}
        else:
            kl = {k: float(v.double().mean()) for k, v in r["effect"].kl.items()}
            un = r["effect"].unexplained()
            numbers["lm"].setdefault(name, {})["effect"] = {k: {"mean_kl": kl[k], "unexplained": un[k]} for k in kl}
        eff_rows.append({"model": lm_label(name), "measure": "KL to contextual (nats)",
                         **{v: f"{kl[v]:.3g}" for v in ("none", "w_in", "correction", "full")},
                         "unexplained, W_in only": f"{un['w_in']:.3f}",
                         "unexplained, corrections only": f"{un['correction']:.3f}"})
    if eff_rows:
        lines += ["### 5. Where the context effect lives",
                  "The query run context-free with every layer's patch (*full*), only the W_in (W_gate, W_up) "
                  "patches, only the skip corrections, or nothing. Lab: normalised MSE to y at the query (n_train "
                  "pairs, mean over seeds); language models: KL(contextual ‖ variant) of the next-token distribution "
                  "at the prompt's last token. *Unexplained* = Σ(variant − contextual)² / Σ(none − contextual)² (lab) "
                  "or mean KL / mean KL without patch (language models): 0 = the part reproduces the whole context "
                  "effect.", "", markdown_table(pd.DataFrame(eff_rows)), ""]

    # 6. Language models' setting
    if lm:
        for n, r in lm.items():
            src = r.get("reused", r)
            numbers["lm"][n]["tokens"] = src["tokens"]
            numbers["lm"][n]["seconds"] = src["seconds"]
        counts = {n: numbers["lm"][n]["tokens"] for n in lm}
        lines += ["### 6. Language-model prompts (this project's extension)",
                  f"{len(next(iter(counts.values())))} few-shot prompts, {len(next(iter(counts.values()))) // len(LM_TASKS)} per task "
                  f"({', '.join(LM_TASKS)}): {DEMOS} demonstrations `query answer` and a held-out query, or the "
                  "key–value table of kv8 and one of its keys; the query is the last token. Both models are the "
                  "embedded 4-bit GGUF checkpoints dequantised to float32. "
                  + "; ".join(f"`{n}`: {min(c)}–{max(c)} tokens, {numbers['lm'][n]['seconds']:.0f} s"
                              for n, c in counts.items()) + ".", ""]

    numbers["reading"] = reading(lab, tables, lm_tables, numbers)
    lines += ["### Reading (computed from the tables above)", "", *numbers["reading"], ""]
    return write_fragment(args.out, lines), numbers


def r_seed0(lab: dict, name: str) -> int | None:
    """The seed whose per-layer table is stored (the first measured)."""
    return lab[name]["seeds"][0] if name in lab else None


# --- sentences, each computed from the numbers it states ---------------------------------------------------------

def range_sentence(entries: list[tuple[str, object, object]]) -> str:
    """The paper's claim over every (variant, order, kind): the range of the mean cosine and the verdicts.

    ``entries``: ``(label, ci, control_ci)``.
    """
    if not entries:
        raise ValueError("range_sentence needs at least one entry")
    lo = min(entries, key=lambda e: e[1].mean)
    hi = max(entries, key=lambda e: e[1].mean)
    by: dict[str, list[str]] = {}
    for label, ci, ctl in entries:
        by.setdefault(verdict(ci, ctl), []).append(label)
    parts = [f"*{v}* for {len(by[v])} ({', '.join(by[v])})" for v in ("holds", "weak", "negligible", "no") if v in by]
    return (f"- The paper's alignment claim on the lab models (Dherin et al. 2025, §5), over {len(entries)} "
            f"model × order × kind cells: the mean cosine ranges from {lo[1].mean:+.3f} ({lo[0]}) to "
            f"{hi[1].mean:+.3f} ({hi[0]}); verdicts: " + "; ".join(parts) + ".")


def capacity_sentence(name: str, cap: dict, fits: float = FITS) -> str:
    """Whether one-pass SGD, small-step SGD and the ridge fit lower the test error (below ``fits`` × W0's)."""
    w0 = cap["W0"]["mean"]
    verbs = {m: ("lowers" if cap[m]["mean"] < fits * w0 else "does not lower")
             for m in ("SGD one pass", "SGD small steps", "ridge least squares")}
    pairs = cap["ridge least squares"]["train_mse"]
    return (f"- {name}: from the context-free test MSE {w0:.3f}, one-pass SGD {verbs['SGD one pass']} it "
            f"({cap['SGD one pass']['mean']:.3f}), small-step SGD {verbs['SGD small steps']} it "
            f"({cap['SGD small steps']['mean']:.3f}) and the ridge least-squares fit of W_in "
            f"{verbs['ridge least squares']} it ({cap['ridge least squares']['mean']:.3f}; MSE on the pairs "
            f"{cap['W0']['train_mse']:.3f} → {pairs:.3f}); in context {cap['in context']['mean']:.3f}.")


def ablation_sentence(tables: dict, order: str = "absorb", kind: str = "step") -> str | None:
    """Which single factor moves the cosine furthest from the single block's, and whether its interval leaves
    the single block's."""
    if "single_block" not in tables:
        return None
    key = f"sgd:{order}:{kind}"
    ref = tables["single_block"].ci(key)
    variants = [n for n in ABLATION[1:] if n in tables]
    if not variants:
        return None
    moves = {n: tables[n].ci(key) for n in variants}
    far = max(moves, key=lambda n: abs(moves[n].mean - ref.mean))
    apart = [n for n in variants if moves[n].high < ref.low or moves[n].low > ref.high]
    return (f"- One factor at a time ({order} {kind}): single_block {ref.mean:+.3f}; "
            + ", ".join(f"{n} {moves[n].mean:+.3f}" for n in variants)
            + f". The change furthest from the single block is {far} ({moves[far].mean - ref.mean:+.3f}); "
            + (f"intervals disjoint from the single block's: {', '.join(apart)}." if apart
               else "every interval overlaps the single block's."))


RESIDUAL = 0.8  # both changes' cosine with the residual y − f₀ from which they "both point along it"


def function_space_sentence(entries: dict) -> str:
    """Function-space cosines beside their controls, and for which models both changes point along the residual
    (cosine ≥ RESIDUAL each), where a high function-space cosine follows from both reducing the error."""
    items = [f"{n} {fs['same_prompt']['mean']:+.2f} (control {fs['control']['mean']:+.2f}, context vs residual "
             f"{fs['context_vs_residual']['mean']:+.2f}, finetuned vs residual {fs['finetuned_vs_residual']['mean']:+.2f})"
             for n, fs in entries.items()]
    along = [n for n, fs in entries.items()
             if min(fs["context_vs_residual"]["mean"], fs["finetuned_vs_residual"]["mean"]) >= RESIDUAL]
    tail = (f" Both changes point along the residual y − f₀ (cosines ≥ {RESIDUAL}) for {', '.join(along)}: there a "
            "high function-space cosine follows from both reducing the error." if along else
            f" For no model do both changes point along the residual y − f₀ (cosines ≥ {RESIDUAL}).")
    return "- Function space (after n examples): " + "; ".join(items) + "." + tail


def reading(lab: dict, tables: dict, lm_tables: dict, numbers: dict) -> list[str]:
    """Sentences computed from the results with the stated rules."""
    out = []
    if tables:
        entries = [(f"{n} {o} {k}", t.ci(f"sgd:{o}:{k}"), t.ci(f"control:{o}:{k}"))
                   for n, t in tables.items() for o in ("absorb", "prefix") for k in ("cumulative", "step")]
        out.append(range_sentence(entries))
        for order in ("absorb", "prefix"):
            out.append(f"- Per-step cosine ({order} order) = output side × input share per step; means: " + "; ".join(
                f"{n} {t.ci(f'sgd:{order}:step').mean:+.3f} (output side {t.ci(f'out_side:{order}:step').mean:+.3f}, "
                f"input share {t.ci(f'in_share:{order}:step').mean:.3f})" for n, t in tables.items()
                if f"out_side:{order}:step" in t.per_prompt) + ".")
        for order, kind in (("absorb", "step"), ("prefix", "step"), ("absorb", "cumulative")):
            s = ablation_sentence(tables, order, kind)
            if s:
                out.append(s)
    if lm_tables:
        out.append("- Language models (this project's extension; the paper ran regression only): " + "; ".join(
            f"{n} absorb step {t.ci('sgd:absorb:step').mean:+.3f} vs control {t.ci('control:absorb:step').mean:+.3f} "
            f"(*{verdict(t.ci('sgd:absorb:step'), t.ci('control:absorb:step'))}*)" for n, t in lm_tables.items()) + ".")
    for name in lab:
        out.append(capacity_sentence(name, numbers["lab"][name]["capacity"]))
    if lab:
        out.append(function_space_sentence({n: numbers["lab"][n]["function_space"] for n in lab}))
        corr, win = [], []
        for name in lab:
            s = {r["variant"]: r["unexplained"] for r in numbers["lab"][name]["effect"]}
            item = f"{name} (W_in only leaves {s['w_in']:.2f}, corrections only {s['correction']:.2f})"
            (corr if s["correction"] < s["w_in"] else win).append(item)
        if corr:
            out.append("- The context effect lives mostly in the skip corrections (they alone leave less unexplained) for: "
                       + "; ".join(corr) + ".")
        if win:
            out.append("- It lives mostly in the W_in patches for: " + "; ".join(win) + ".")
    for name in lm_tables:
        un = {k: v["unexplained"] for k, v in numbers["lm"][name]["effect"].items()}
        where = "the skip corrections" if un["correction"] < un["w_in"] else "the W_in/W_gate patches"
        out.append(f"- {name} (extension): W_in patches alone leave {un['w_in']:.2f} of the KL, corrections alone "
                   f"{un['correction']:.2f}, the full patch {un['full']:.1e}: the effect lives mostly in {where}.")
    return out


def _mean_ci(values):
    from icl_lens.stats import bootstrap_mean

    return bootstrap_mean(values.double().numpy())


if __name__ == "__main__":
    main()
