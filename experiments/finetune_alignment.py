"""Evaluation: implicit vs explicit finetuning, measured the way Dherin et al. 2025 measure it, over training seeds.

``python -m experiments.finetune_alignment [--quick]`` writes
``reports/eval_finetune_alignment.md`` and ``reports/eval_finetune_alignment.json``.

The paper (arXiv 2507.16003, §4–5) claims that the implicit updates of a context (token
patches, and their steps as the context is consumed) track explicit finetuning on the
same examples. This command measures, with the library's functions:

1. loss curves: test error against the number of examples consumed, in context and by
   SGD on the first MLP matrix (one pair per step, a learning-rate sweep)
   (:func:`icl_lens.lab.experiments._loss_curves.loss_curves`), for every lab model;
2. weight-space alignment, cumulative and per step, in the prefix and the paper's
   absorb order, and at the end of the context (order-independent), with a
   mismatched-prompt control, variants that isolate the cause and a random-direction
   baseline (:func:`icl_lens.lab.experiments.implicit_vs_explicit`);
   2a. which of the task's two mirror solutions each seed found, and how that sets the
   sign of its alignment (:func:`icl_lens.lab.solution_signs`);
   2b. one factor at a time on the oriented single block
   (:data:`icl_lens.lab.FACTOR_MODELS`);
3. a capacity test beside one-pass SGD (:func:`icl_lens.lab.experiments.capacity_test`);
4. function-space alignment (:meth:`LossCurves.function_cosines`);
5. where the context effect lives: full patch, W_in patches only, corrections only
   (:func:`icl_lens.lab.experiments.patch_parts`,
   :func:`icl_lens.patches.context_effect`);
6. the per-token protocol on Gemma 3 270M and SmolLM2-135M
   (:func:`icl_lens.dynamics.context_alignment`), on few-shot prompts built
   from the shipped thought-patch tasks.

Every lab model is measured over its training seeds (:mod:`icl_lens.lab.seeds`; seeds not in
the cache are skipped and the JSON lists the seeds used under ``seeds``). The unit is the
seed: each seed's mean over its prompts is one value, intervals are Student-t over seeds and
every verdict, count and sentence comes from the rules of :mod:`experiments.lab_rules`, fixed
before the run. The paper ran the protocol on regression only: the language-model rows are
this project's extension of it (one model each: their interval is over prompts).
"""
from __future__ import annotations

import argparse
import json
import random
import time

import pandas as pd
import torch
from tqdm.auto import tqdm

from experiments import lab_rules as rules
from experiments.report import command, load_average, machine, markdown_table, write_fragment
from icl_lens.lab.experiments import POPULATIONS, SELECTIVE
from icl_lens.lab import seeds as lab_seeds

MAIN_LAB = ("single_block", "sb_no_attn_bias", "sb_embed", "sb_wide", "sb_task", "one_block", "one_block_skip",
            "one_block_ln", "one_block_preln", "skip_only", "softmax", "linear", "delta", "gru")
ABLATION_BASE = "sb_oriented"
FITS = 0.8  # a fit "lowers the test error" when it ends below FITS × the context-free model's error
LM_MODELS = ("gemma-3-270m", "smollm2-135m")
LM_TASKS = ("capitals", "en_fr", "en_es", "kv8")
QUICK_LAB, QUICK_LM = ("single_block", "softmax"), ("tiny-gemma3",)
ALIGNED, WEAK = rules.ALIGNED, rules.WEAK
DEMOS = 5
UNIFORM = 0.9  # an SGD step "shifts every prediction alike" when this share of its change is the same on every probe
ORDERS_KINDS = rules.CELLS


def lab_models() -> tuple[str, ...]:
    """Every lab model the command measures by default: the main table, the oriented base and its factors."""
    from icl_lens.lab import FACTOR_MODELS

    return (*MAIN_LAB, ABLATION_BASE, *FACTOR_MODELS)


def describe(name: str) -> str:
    """One line per lab model, read from its configuration and recipe."""
    from icl_lens.lab import RECIPES

    c = lab_seeds.MODELS[name]
    parts = [f"{c.n_layers} {c.arch} block{'s' if c.n_layers > 1 else ''}", f"d_model {c.d_model}",
             f"{c.n_heads} head{'s' if c.n_heads > 1 else ''}" if c.arch == "softmax" else None,
             "skip" if c.skip else "no skip", "LayerNorm" if c.layer_norm else "no LayerNorm"]
    if not c.embed:
        parts.append("no embedding, tokens [x, y]" if not c.query_flag else "no embedding")
    if not c.attn_bias:
        parts.append("no attention-output bias")
    parts.append(f"d_x {c.d_x}, up to {c.n_context_train} pairs")
    recipe = RECIPES[name]
    parts.append(f"rate {recipe['lr']:g}, {recipe['steps']} steps" + (", oriented init" if recipe.get("orient") else ""))
    return ", ".join(p for p in parts if p)


class Pooled:
    """One model's alignment tables, one per training seed. The unit is the seed: :meth:`values` is each seed's
    mean over prompts (of each prompt's mean over layers and steps); :meth:`ci` is the Student-t interval over
    seeds, or, with a single table (one seed, or a language model), the bootstrap interval over its prompts."""

    def __init__(self, tables, seeds=None):
        if not tables:
            raise ValueError("Pooled needs at least one table")
        self.tables = list(tables)
        self.seeds = list(seeds) if seeds is not None else list(range(len(self.tables)))
        self.per_prompt = self.tables[0].per_prompt
        self.dim = self.tables[0].dim

    def values(self, key: str) -> list[float]:
        return [float(t.per_prompt[key].double().mean()) for t in self.tables]

    def abs_values(self, key: str) -> list[float]:
        """Each seed's mean |cos| (of the per-prompt, per-layer values)."""
        return [float(t.per_prompt[key].double().abs().mean()) for t in self.tables]

    def ci(self, key: str):
        from icl_lens.stats import bootstrap_mean, t_interval

        if len(self.tables) >= 2:
            return t_interval(self.values(key))
        return bootstrap_mean(self.tables[0].per_prompt[key].double().mean(1).numpy())

    def cell(self, order: str, kind: str) -> dict:
        """The cell's summary by the rules (:func:`experiments.lab_rules.cell_summary`) plus its |cos| per seed."""
        sgd, ctl = f"sgd:{order}:{kind}", f"control:{order}:{kind}"
        return {**rules.cell_summary(self.values(sgd), self.values(ctl)), "abs_per_seed": self.abs_values(sgd)}

    def per_layer(self, keys):
        return self.tables[0].per_layer(keys)

    def summary(self) -> list[dict]:
        rows = []
        for key, c in self.per_prompt.items():
            comparison, order, kind = key.split(":")
            ci = self.ci(key)
            rows.append({"comparison": comparison, "order": order, "kind": kind, "mean": ci.mean, "low": ci.low,
                         "high": ci.high, "interval_over": "seeds" if len(self.tables) >= 2 else "prompts",
                         "mean_abs": sum(self.abs_values(key)) / len(self.tables),
                         "prompts": int(c.shape[0]), "seeds": len(self.tables), "per_seed": self.values(key),
                         "per_seed_abs": self.abs_values(key)})
        return rows

    def per_seed(self, key: str) -> str:
        """Each seed's mean, ``+0.39/-0.05/+0.12``."""
        return "/".join(f"{v:+.2f}" for v in self.values(key))


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
    """The language models' verdict (one model: the unit is the prompt): ``holds`` (interval above the control's
    and above 0, mean ≥ ALIGNED), ``weak`` (above the control, WEAK ≤ mean < ALIGNED), ``negligible`` (above the
    control, mean < WEAK) or ``no`` (not above the control)."""
    if same.low > max(control.high, 0.0):
        return "holds" if same.mean >= ALIGNED else "weak" if same.mean >= WEAK else "negligible"
    return "no"


def _fmt(ci) -> str:
    return f"{ci.mean:+.3f} [{ci.low:+.3f}, {ci.high:+.3f}]"


def _fmt_interval(d: dict | None, mean: float | None = None) -> str:
    if d is None:
        return f"{mean:+.3f} (1 seed)" if mean is not None else "–"
    return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


# The library modules whose code a cached (model, seed) result depends on: a change to any of them recomputes it.
RESULT_SOURCES = ("icl_lens/lab/experiments/_implicit_explicit.py", "icl_lens/lab/experiments/_loss_curves.py",
                  "icl_lens/lab/experiments/_capacity.py", "icl_lens/lab/experiments/_patch_parts.py",
                  "icl_lens/lab/experiments/_solution_signs.py", "icl_lens/lab/_mirror.py",
                  "icl_lens/lab/_regression_dynamics.py", "icl_lens/lab/_patching.py", "icl_lens/lab/_model.py",
                  "icl_lens/lab/_mixers.py", "icl_lens/dynamics/_sgd_alignment.py",
                  "icl_lens/dynamics/_explicit_finetune.py")


def _source_hash(sources=None) -> str:
    """Hash of the library source a measurement depends on (:data:`RESULT_SOURCES`)."""
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for rel in sources or RESULT_SOURCES:
        h.update((root / rel).read_bytes())
    return h.hexdigest()


_LOADED_SOURCE = _source_hash()  # the code this process imported (an edit during a run does not relabel its results)


def result_key(name: str, seed: int, record: dict, settings: dict, source: str | None = None) -> str:
    """Hash of one (model, seed) measurement: the training record (unique per training run), the settings and the
    library source it was measured with (default: the one this process loaded)."""
    import hashlib

    text = json.dumps({"name": name, "seed": seed, "record": record, "settings": settings,
                       "source": source or _LOADED_SOURCE}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_lab(names, n_prompts: int, n_probes: int, progress: bool, seeds=lab_seeds.SEEDS, full=MAIN_LAB,
            full_seeds: int = 3, results_cache=None) -> dict:
    """Per model: the runs of every cached seed. Every model: loss curves (the best rate), alignment and, for one
    softmax block, its solution's signs; the models in ``full`` also, on their first ``full_seeds`` cached seeds,
    where the effect lives and the capacity test (sections 3 and 5, which no verdict of issue 39 rests on).

    ``results_cache``: a folder where each (model, seed) measurement is kept under :func:`result_key`, so a rerun
    after more seeds were trained measures only the new ones (None: measure everything)."""
    from pathlib import Path

    from icl_lens.lab.experiments import capacity_test, implicit_vs_explicit, loss_curves, patch_parts, solution_signs

    out = {}
    bar = tqdm(total=len(names) * len(seeds), desc="lab models × seeds", disable=not progress)
    for name in names:
        runs = []
        for seed in seeds:
            bar.set_postfix_str(f"{name} s{seed}")
            bar.update()
            try:
                model, record = lab_seeds.seed_model(name, seed, train_missing=False)
            except FileNotFoundError:
                continue
            with_full = name in full and len(runs) < full_seeds
            settings = {"prompts": n_prompts, "probes": n_probes, "full": with_full}
            path = (Path(results_cache) / f"{name}-s{seed}-{result_key(name, seed, record, settings)}.pt"
                    if results_cache else None)
            if path is not None and path.exists():
                runs.append(torch.load(path, weights_only=False))  # written by this function, below
                continue
            c0 = time.process_time()
            curves = loss_curves(name, n_prompts=n_prompts, n_probes=n_probes, model=model)
            lr = curves.lrs[curves.best]
            run = {"seed": seed, "record": record, "curves": curves,
                   "align": implicit_vs_explicit(name, n_prompts=n_prompts, lr=lr, model=model)}
            if model.cfg.arch == "softmax" and model.cfg.n_layers == 1:
                run["signs"] = solution_signs(name, seed, model, record)
            if with_full:
                run["effect"] = patch_parts(name, n_prompts=n_prompts, model=model)
                run["capacity"] = capacity_test(model, curves, n_prompts=n_prompts, n_probes=n_probes)
            run["cpu_seconds"] = time.process_time() - c0  # one thread: the wall time of this run on an idle core
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save(run, path.with_suffix(".tmp"))
                path.with_suffix(".tmp").replace(path)
            runs.append(run)
        if runs:
            out[name] = {"seeds": [r["seed"] for r in runs], "runs": runs}
    bar.close()
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
    return sum(t.abs_values("random:any:any")) / len(t.tables)


def alignment_rows(tables: dict) -> pd.DataFrame:
    """One row per lab model and cell (order, kind): per-seed cosines with their signs, the mean with its
    t-interval over seeds, |cos|, the control and the difference's interval, and the verdict of the rules."""
    rows = []
    for name, t in tables.items():
        for order, kind in ORDERS_KINDS:
            c = t.cell(order, kind)
            rows.append({"model": name, "cell": f"{order} {kind}", "seeds": c["seeds"],
                         "per seed": " ".join(f"{v:+.2f}" for v in c["per_seed"]), "signs": c["signs"],
                         "mean [95% t over seeds]": _fmt_interval(c["interval"], c["mean"]),
                         "mean \\|cos\\|": f"{sum(c['abs_per_seed']) / len(c['abs_per_seed']):.3f}",
                         "control": f"{c['control_mean']:+.3f}",
                         "minus control": _fmt_interval(c["difference"]), "verdict": c["verdict"]})
    return pd.DataFrame(rows)


def sides_rows(tables: dict, lm_names=()) -> pd.DataFrame:
    """Per model and order: the diagnostics of the per-step cosine and the variants (means over seeds, or over
    prompts for the language models, with their intervals where they are a comparison of their own)."""
    rows = []
    for name, t in tables.items():
        has = lambda k: k in t.per_prompt  # noqa: E731
        mean = lambda k: t.ci(k).mean  # noqa: E731
        for order in ("absorb", "prefix"):
            row = {"model": lm_label(name) if name in lm_names else name, "order": order}
            row["output side"] = f"{mean(f'out_side:{order}:step'):+.3f}" if has(f"out_side:{order}:step") else "–"
            row["input share"] = f"{mean(f'in_share:{order}:step'):.3f}" if has(f"in_share:{order}:step") else "–"
            row["cos(v, a)"] = f"{mean(f'input_side:{order}:step'):+.3f}" if has(f"input_side:{order}:step") else "–"
            for kind in ("cumulative", "step"):
                key = f"at_implicit:{order}:{kind}"
                row[f"at implicit W {kind}"] = _fmt(t.ci(key)) if has(key) else "–"
            row["small-rate step"] = _fmt(t.ci(f"small_lr:{order}:step")) if has(f"small_lr:{order}:step") else "–"
            row["query input"] = _fmt(t.ci(f"query_input:{order}:cumulative"))
            row["end, one full-batch step (control)"] = (
                f"{_fmt(t.ci('full_batch:end:cumulative'))} ({t.ci('full_batch_control:end:cumulative').mean:+.3f})"
                if has("full_batch:end:cumulative") else "–")
            row["random \\|cos\\|"] = f"{_random_abs(t):.1e}"
            if name in lm_names:
                for kind in ("cumulative", "step"):
                    row[f"{kind} (control)"] = (f"{_fmt(t.ci(f'sgd:{order}:{kind}'))} "
                                                f"({t.ci(f'control:{order}:{kind}').mean:+.3f})")
                    row[f"verdict {kind}"] = verdict(t.ci(f"sgd:{order}:{kind}"), t.ci(f"control:{order}:{kind}"))
            rows.append(row)
    return pd.DataFrame(rows)


# --- 2a. the sign of the alignment and the solution each seed found -----------------------------------------

def seed_rows(name: str, r: dict, t: "Pooled") -> list[dict]:
    """One row per seed of a one-block softmax model: its solution (:class:`SolutionSigns`) beside its cosines."""
    rows = []
    for k, run in enumerate(r["runs"]):
        s = run["signs"]
        row = {"model": name, "seed": run["seed"], "in-context MSE": s.in_context_mse,
               "preference at init": list(s.preference_init), "preference trained": list(s.preference),
               "population": s.population, "label response ρ": s.label_response,
               "readout slope": s.readout_slope, "task slope": s.task_slope,
               "SGD uniform share": s.sgd_uniform_share}
        for order in ("absorb", "prefix"):
            row[f"output side {order}"] = t.values(f"out_side:{order}:step")[k]
        for order, kind in ORDERS_KINDS:
            row[f"{order} {kind}"] = t.values(f"sgd:{order}:{kind}")[k]
        row["end control"] = t.values("control:end:cumulative")[k]
        rows.append(row)
    return rows


def _sign(v: float) -> int:
    return (v > 0) - (v < 0)


def _pearson(a, b) -> float | None:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return None
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


def sign_summary(rows: list[dict]) -> dict:
    """What the per-seed rows of one model say about the cause of the sign (every count from the rows):
    population counts; on how many seeds the per-step cosines (both orders) and the output side share the sign
    of the label response ρ and of the readout slope; the correlation of ρ with the per-step cosines over seeds;
    on how many seeds the initial preference's sign is the trained population's."""
    n = len(rows)
    pops = {p: [r["seed"] for r in rows if r["population"] == p] for p in POPULATIONS}
    same = lambda key, ref: sum(_sign(r[key]) == _sign(r[ref]) for r in rows if r[key] is not None)  # noqa: E731
    selective = [r for r in rows if r["population"] != "unselective"]
    init_sign = lambda r: _sign(max(r["preference at init"], key=abs))  # noqa: E731
    return {"seeds": n, "populations": pops,
            "step_sign_is_rho_sign": {o: same(f"{o} step", "label response ρ") for o in ("absorb", "prefix")},
            "output_side_sign_is_rho_sign": {o: same(f"output side {o}", "label response ρ") for o in ("absorb", "prefix")},
            "readout_sign_is_rho_sign": same("readout slope", "label response ρ"),
            "readout_seeds": sum(r["readout slope"] is not None for r in rows),
            "rho_vs_step_correlation": {o: _pearson([r["label response ρ"] for r in rows], [r[f"{o} step"] for r in rows])
                                        for o in ("absorb", "prefix")},
            "selective_seeds": len(selective),
            "uniform_seeds": sum(r["SGD uniform share"] >= UNIFORM for r in rows),
            "init_sign_is_population": sum(init_sign(r) == (1 if r["population"] == "similar" else -1)
                                           for r in selective)}


def population_cells(rows: list[dict]) -> dict:
    """Per population (with ≥ 1 seed) and cell: the per-seed cosines and controls' verdict by the rules."""
    out = {}
    for pop in POPULATIONS:
        members = [r for r in rows if r["population"] == pop]
        if not members:
            continue
        out[pop] = {"seeds": [r["seed"] for r in members],
                    "in_context_mse": sum(r["in-context MSE"] for r in members) / len(members),
                    "cells": {f"{o} {k}": rules.cell_summary([r[f"{o} {k}"] for r in members],
                                                             [r["_controls"][f"{o} {k}"] for r in members])
                              for o, k in ORDERS_KINDS}}
    return out


def with_controls(rows: list[dict], t: "Pooled") -> list[dict]:
    """The seed rows with each cell's control value attached (``_controls``), for :func:`population_cells`."""
    for k, row in enumerate(rows):
        row["_controls"] = {f"{o} {kd}": t.values(f"control:{o}:{kd}")[k] for o, kd in ORDERS_KINDS}
    return rows


def cause_sentence(name: str, s: dict) -> str:
    """The measured cause of the sign for one model, every number from :func:`sign_summary`."""
    pops = "; ".join(f"{p} {len(v)} ({', '.join(map(str, v))})" for p, v in s["populations"].items() if v)
    corr = s["rho_vs_step_correlation"]
    corr_text = ", ".join(f"{o} {c:+.2f}" for o, c in corr.items() if c is not None) or "not computable"
    return (f"- {name} over {s['seeds']} seed(s): populations (seeds) {pops}. The per-step cosine has the sign of the "
            f"label response ρ on {s['step_sign_is_rho_sign']['absorb']} (absorb) and "
            f"{s['step_sign_is_rho_sign']['prefix']} (prefix) of {s['seeds']} seeds, its output side on "
            f"{s['output_side_sign_is_rho_sign']['absorb']} / {s['output_side_sign_is_rho_sign']['prefix']}"
            + (f", and the readout slope has ρ's sign on {s['readout_sign_is_rho_sign']} of {s['readout_seeds']}"
               if s["readout_seeds"] else "")
            + f"; correlation over seeds of ρ with the per-step cosine: {corr_text}. The initial preference's sign is the trained population's on "
            f"{s['init_sign_is_population']} of the {s['selective_seeds']} selective seeds. An SGD step on W_in shifts "
            f"every context-free prediction alike (uniform share ≥ {UNIFORM}) on {s['uniform_seeds']} of {s['seeds']} "
            "seeds: there its cosine with the implicit step reads how the context moves the query toward the example's "
            "label, whose sign is the solution's.")


def population_sentence(name: str, pops: dict) -> str:
    """Per population: how many seeds, the in-context MSE and the verdicts of the per-step and end cells."""
    parts = []
    for pop, e in pops.items():
        cells = "; ".join(f"{c} {_fmt_interval(v['interval'], v['mean'])} (*{v['verdict']}*)"
                          for c, v in e["cells"].items() if c in ("absorb step", "prefix step", "end cumulative"))
        parts.append(f"*{pop}* ({len(e['seeds'])} of {sum(len(x['seeds']) for x in pops.values())} seeds, "
                     f"in-context MSE {e['in_context_mse']:.3f}): {cells}")
    return f"- {name}, the populations apart: " + " — ".join(parts) + "."


# --- 2b. one factor at a time on the oriented single block -----------------------------------------------------

ABLATION_CELLS = (("absorb", "step"), ("prefix", "step"), ("end", "cumulative"))


def ablation(tables: dict, lab: dict) -> dict | None:
    """The base's own alignment per seed and, per factor and cell, the Welch interval of the variant minus the base
    over seeds and its verdict (:func:`experiments.lab_rules.factor_verdict`), at 95% and at the Bonferroni level
    over all factor × cell comparisons."""
    from icl_lens.lab import FACTOR, FACTOR_MODELS

    if ABLATION_BASE not in tables:
        return None
    base, base_runs = tables[ABLATION_BASE], lab[ABLATION_BASE]["runs"]

    def entry(name: str, t: Pooled, runs: list) -> dict:
        pops = [r["signs"].population for r in runs if "signs" in r]
        return {"seeds": [r["seed"] for r in runs], "in_context_mse": [r["record"]["eval_loss_n_train"] for r in runs],
                "populations": {p: pops.count(p) for p in POPULATIONS},
                "cells": {f"{o} {k}": t.cell(o, k) for o, k in ABLATION_CELLS}}

    out = {"base": ABLATION_BASE, **entry(ABLATION_BASE, base, base_runs), "factors": {}}
    out["above_control"] = {c: sum(d > 0 for d in [s - ctl for s, ctl in zip(
        v["per_seed"], base.values(f"control:{c.replace(' ', ':')}"))]) for c, v in out["cells"].items()}
    names = [n for n in FACTOR_MODELS if n in tables]
    m = max(1, len(names) * len(ABLATION_CELLS))
    out["m"], out["family_level"] = m, rules.family_level(m)
    for name in names:
        e = {"factor": FACTOR[name], **entry(name, tables[name], lab[name]["runs"])}
        e["change"] = {c: {**rules.factor_verdict(v["per_seed"], out["cells"][c]["per_seed"]),
                           "verdict_family": rules.factor_verdict(v["per_seed"], out["cells"][c]["per_seed"],
                                                                  out["family_level"])["verdict"]}
                       for c, v in e["cells"].items()}
        out["factors"][name] = e
    return out


def ablation_rows(abl: dict) -> pd.DataFrame:
    """One row per variant (the base first): seeds, in-context MSE, populations, and per cell the mean with its
    interval and per-seed signs, and the change from the base with its verdict."""
    rows = []
    for name, e in [(abl["base"], {**abl, "factor": "base (oriented single block)"}), *abl["factors"].items()]:
        mse = e["in_context_mse"]
        row = {"variant": name, "changed": e["factor"], "seeds": len(mse), "in-context MSE": f"{sum(mse) / len(mse):.3f}",
               "similar/opposite/unselective": "/".join(str(e["populations"][p]) for p in POPULATIONS)}
        for c, v in e["cells"].items():
            row[c] = f"{_fmt_interval(v['interval'], v['mean'])} {v['signs']}"
            ch = e.get("change", {}).get(c) if name != abl["base"] else None
            row[f"{c}: change"] = "–" if ch is None else f"{_fmt_interval(ch['difference'])} *{ch['verdict']}*"
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Implicit vs explicit finetuning (the paper's protocol)")
    ap.add_argument("--quick", action="store_true", help="small sizes for tests (not for reading)")
    ap.add_argument("--lab-prompts", type=int, default=32, help="prompts per lab model and seed")
    ap.add_argument("--lm-prompts-per-task", type=int, default=16)
    ap.add_argument("--lab-models", nargs="*", default=None, help="default: every lab model (main table, base, factors)")
    ap.add_argument("--seeds", nargs="*", type=int, default=list(lab_seeds.SEEDS),
                    help="training seeds (those cached by `python -m icl_lens.lab.seeds`; others are skipped)")
    ap.add_argument("--lm-models", nargs="*", default=list(LM_MODELS))
    ap.add_argument("--reuse-lm", default=None, metavar="JSON",
                    help="take the language-model rows from this earlier report JSON instead of re-measuring them")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for the language models (1: on a shared machine a second thread mostly spin-waits)")
    ap.add_argument("--out", default="reports/eval_finetune_alignment.md")
    ap.add_argument("--results-cache", default=None,
                    help="keep each (model, seed) measurement here and reuse it when nothing it depends on changed "
                         "(default $ICL_LENS_CACHE/lab_results; --no-results-cache measures everything)")
    ap.add_argument("--no-results-cache", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.lab_models is None:
        args.lab_models = list(lab_models())
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
    from icl_lens.model import cache_dir

    results = None if args.no_results_cache or args.quick else (args.results_cache or cache_dir() / "lab_results")
    lab = run_lab(args.lab_models, args.lab_prompts, 8 if args.quick else 32, progress, seeds=args.seeds,
                  results_cache=results)
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


def _over_seeds(values) -> "object":
    """Mean over seeds of each seed's mean over its prompts, with a t-interval over seeds (one seed: the bootstrap
    interval over its prompts)."""
    from icl_lens.stats import bootstrap_mean, t_interval

    values = [v.double() for v in values]
    if len(values) >= 2:
        return t_interval([float(v.mean()) for v in values])
    return bootstrap_mean(values[0].numpy())


def report(args, lab: dict, lm: dict, *, wall: float, cpu: float, lab_seconds: float, load_before: float,
           argv) -> tuple[str, dict]:
    """The Markdown fragment and the JSON numbers; every verdict and reading sentence computed by the rules."""
    numbers: dict = {"lab": {}, "lm": {}, "seconds": wall, "cpu_seconds": cpu, "lab_seconds": lab_seconds,
                     "results_cache": not (args.no_results_cache or args.quick),
                     "quick": bool(args.quick), "aligned_threshold": ALIGNED, "weak_threshold": WEAK,
                     "trend_slope": rules.TREND_SLOPE, "selective": SELECTIVE, "fits_threshold": FITS,
                     "main_models": [n for n in MAIN_LAB if n in lab], "ablation_base": ABLATION_BASE,
                     "seeds": {n: r["seeds"] for n, r in lab.items()}, "lm_reused_from": args.reuse_lm}
    reused = bool(args.reuse_lm)
    measure_cpu = sum(x["cpu_seconds"] for r in lab.values() for x in r["runs"])
    # a full rerun with every seed of every model: each model's mean measured CPU per seed × the seeds asked for
    full_rerun = sum(sum(x["cpu_seconds"] for x in r["runs"]) / len(r["runs"]) * len(args.seeds) for r in lab.values())
    numbers["measurement_cpu_seconds"], numbers["full_rerun_cpu_seconds"] = measure_cpu, full_rerun
    numbers["seeds_cpu_seconds"] = {name: [x["cpu_seconds"] for x in r["runs"]] for name, r in lab.items()}
    lines = [
        "## Implicit vs explicit finetuning (the paper's protocol)",
        "",
        f"Command: `{command('python -m experiments.finetune_alignment', argv)}`  ",
        f"Machine: {machine(load_before=load_before)}.  ",
        f"Run time: {wall:.0f} s wall, {cpu:.0f} s CPU (lab models {lab_seconds:.0f} s wall, one thread, from the "
        "cached checkpoints" + ("" if args.no_results_cache or args.quick else
                               ", reusing the (model, seed) measurements kept by earlier runs where nothing changed")
        + (f"; language-model rows reused from `{args.reuse_lm}`, not re-measured in this run)." if reused else
           f"; language models {args.threads} thread{'s' if args.threads > 1 else ''})."),
        f"Measuring every lab (model, seed) of this report from its checkpoint takes {measure_cpu:.0f} s of CPU on one "
        f"thread ({measure_cpu / 60:.0f} min, the time on an idle core, whatever this run reused); with all "
        f"{len(args.seeds)} seeds of every model (each model's mean per seed × {len(args.seeds)}): "
        f"{full_rerun / 60:.0f} min.",
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
        "cos(Wᵢ − Wᵢ₋₁, −η∇ℓᵢ), averaged over i; *end cumulative* = cos(Wₙ − W₀, Σ_{j≤n} −η∇ℓⱼ), the update after "
        "all n examples against the n SGD steps (the same for both orders). *Control*: the next prompt's SGD steps "
        "(other task, other examples), same seed. *Random*: cosines with uniformly random directions of the same "
        "weight space. The paper ran this protocol on regression only; the language-model rows, marked "
        "*(extension)*, are this project's extension of it.",
        "",
        f"**Unit and intervals.** The training seed is the unit: each seed's mean over its {args.lab_prompts} prompts "
        f"(and layers) is one value, and intervals are 95% Student-t intervals over seeds "
        f"({'/'.join(map(str, seed_counts))} seed(s) per model, listed in the JSON under `seeds`). Every table "
        "shows each seed's value and its sign beside the mean, and the mean |cos|.",
        "",
        f"**Verdict rules** (`experiments/lab_rules.py`, fixed before the run). A cell (model, order, kind) *holds* "
        f"when the t-intervals over seeds of its cosine and of its difference to the control both lie above 0 and the "
        f"mean is at least {ALIGNED}; *weak* the same with a mean in [{WEAK}, {ALIGNED}); *negligible* with a mean below "
        f"{WEAK}; *reversed* when both intervals lie below 0; *no* otherwise; a cell is *aligned* when it holds or is "
        "weak. The paper's claim is *reproduced* when every cell is aligned at the Bonferroni level (95% family-wise), "
        "*not reproduced* when no cell is aligned at 95%, and *reproduced only in* the aligned cells otherwise, with a "
        f"multiplicity note when they are at most {rules.FEW:.0%} of the cells. A seed's *population* is the mirror "
        f"solution of its first attention layer: *similar* / *opposite* when its most selective head's "
        f"score–similarity correlation is ≥ {SELECTIVE} / ≤ −{SELECTIVE}, else *unselective*. One factor *lowers* "
        "(*raises*) a cell when the Welch interval over seeds of the variant's mean minus the base's lies below "
        f"(above) 0. A fit *lowers the test error* when it ends below {FITS} × the context-free error.",
        "",
    ]

    # Models
    rec = pd.DataFrame([{"model": n, "description": describe(n), "seeds": ", ".join(map(str, r["seeds"])),
                         "train seconds (per seed)": ", ".join(f"{x['record']['seconds']:.0f}" for x in r["runs"]),
                         "normalised MSE at n_train (per seed)": ", ".join(f"{x['record']['eval_loss_n_train']:.3f}"
                                                                            for x in r["runs"])}
                        for n, r in lab.items()])
    for n, r in lab.items():
        numbers["lab"][n] = {"seeds": r["seeds"], "records": [x["record"] for x in r["runs"]]}
    if len(rec):
        lines += ["### Lab models", "", "Trained by `python -m icl_lens.lab.seeds` (all models and seeds in one command; "
                  "seed 0 of a shipped model is its shipped checkpoint; normalised MSE: 0 = exact, 1 ≈ ignoring the "
                  "context; train seconds on the shared machine, one thread, niced).", "",
                  markdown_table(rec), ""]

    full = {n: r for n, r in lab.items() if n in MAIN_LAB}
    with_capacity = {n: {**r, "runs": [x for x in r["runs"] if "capacity" in x]} for n, r in full.items()
                     if any("capacity" in x for x in r["runs"])}
    # 1. Loss curves (prompts of every seed pooled)
    if full:
        lines += ["### 1. Loss curves: in context vs finetuning the first MLP matrix",
                  "Normalised test MSE on 32 held-out probe queries per prompt after i examples (mean over seeds and "
                  "prompts). *Finetuned*: the context-free model after i SGD steps on W_in (every layer), at each "
                  "seed's best rate of the sweep (lowest error averaged over i = 1..n).", ""]
        table_rows, sweep_rows = [], []
        for name, r in full.items():
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
    tables = {name: Pooled([x["align"].table() for x in r["runs"]], r["seeds"]) for name, r in lab.items()}
    lm_tables = {name: (FromSummary(r["reused"]) if "reused" in r else Pooled([r["table"]])) for name, r in lm.items()}
    main_tables = {n: t for n, t in tables.items() if n in MAIN_LAB}
    for name, t in tables.items():
        cells = {f"{o} {k}": {**t.cell(o, k), "control_per_seed": t.values(f"control:{o}:{k}")} for o, k in ORDERS_KINDS}
        numbers["lab"][name]["cells"] = cells
        numbers["lab"][name]["alignment"] = {
            "summary": t.summary(), "dim": t.dim,
            "per_layer": t.per_layer([f"sgd:{o}:{k}" for o in ("prefix", "absorb") for k in ("cumulative", "step")]
                                     + ["control:absorb:cumulative", "control:absorb:step"]).to_dict(orient="records"),
            "per_layer_seed": lab[name]["seeds"][0]}
    for name, t in lm_tables.items():
        numbers["lm"].setdefault(name, {})["alignment"] = (
            lm[name]["reused"]["alignment"] if isinstance(t, FromSummary) else
            {"summary": t.summary(), "dim": t.dim,
             "per_layer": t.per_layer([f"sgd:{o}:{k}" for o in ("prefix", "absorb") for k in ("cumulative", "step")]
                                      + ["control:absorb:cumulative", "control:absorb:step"]).to_dict(orient="records")})
    if main_tables:
        lines += ["### 2. Weight-space alignment, seed by seed",
                  "Per lab model and cell: each seed's mean cosine (seeds in the order of the *Lab models* table) and "
                  "its sign, the mean with its 95% t-interval over seeds, the mean |cos|, the control's mean, the "
                  "difference to the control with its interval, and the verdict of the rules.", "",
                  markdown_table(alignment_rows(main_tables)), ""]
    if tables or lm_tables:
        lines += ["Sides and variants (means; the language models: interval over prompts, verdict by the same "
                  "thresholds with the prompt as the unit). *output side* = cos(ΔPᵢ âᵢ, gᵢ) and *input share* = "
                  "‖ΔPᵢ âᵢ‖ / ‖ΔPᵢ‖ (ΔPᵢ = Wᵢ − Wᵢ₋₁ of that order, âᵢ the unit input and gᵢ the output factor of SGD "
                  "step i): per step the per-step cosine is exactly their product; *cos(v, a)* = cos(vᵢ, aᵢ) between "
                  "the query's context-free MLP input and the example's. *at implicit W*: each example's gradient taken "
                  "at the implicit weights W_{i−1} (prefix order); *small-rate*: every step taken at W₀; *query input*: "
                  "one SGD step on the query's own context-free input and label (cumulative); *end, one full-batch "
                  "step*: cos(Wₙ − W₀, −Σⱼ∇ℓⱼ(W₀)) with its control in parentheses.", "",
                  markdown_table(sides_rows({**main_tables, **lm_tables}, lm_names=tuple(lm_tables)).fillna("–")), ""]

    # 2a. The sign: which solution each seed found
    sign_models = [n for n in (*MAIN_LAB, ABLATION_BASE) if n in lab and "signs" in lab[n]["runs"][0]]
    if sign_models:
        numbers["signs"] = {}
        detail = [n for n in ("single_block", ABLATION_BASE) if n in sign_models]
        all_rows = {}
        for name in sign_models:
            rows = with_controls(seed_rows(name, lab[name], tables[name]), tables[name])
            all_rows[name] = rows
            numbers["signs"][name] = {"rows": [{k: v for k, v in r.items() if k != "_controls"} for r in rows],
                                      "summary": sign_summary(rows), "populations": population_cells(rows)}
        shown = lambda v: (f"{v:+.3f}" if isinstance(v, float) else "/".join(f"{p:+.2f}" for p in v)  # noqa: E731
                           if isinstance(v, list) else v)
        frame = pd.DataFrame([{k: shown(v) for k, v in r.items() if k != "_controls"}
                              for n in detail for r in all_rows[n]])
        compact = pd.DataFrame([{"model": n, "seeds": s["seeds"],
                                 **{p: len(v) for p, v in s["populations"].items()},
                                 "step sign = ρ sign (absorb/prefix)":
                                     f"{s['step_sign_is_rho_sign']['absorb']}/{s['step_sign_is_rho_sign']['prefix']}",
                                 "readout sign = ρ sign": (f"{s['readout_sign_is_rho_sign']} of {s['readout_seeds']}"
                                                           if s["readout_seeds"] else "–"),
                                 "init sign = population (selective seeds)":
                                     f"{s['init_sign_is_population']} of {s['selective_seeds']}"}
                                for n in sign_models for s in [numbers["signs"][n]["summary"]]])
        lines += ["### 2a. The sign of the alignment: two mirror solutions",
                  "The task is odd (the pair (−x, −y) belongs to the same task as (x, y)), so a softmax head can solve it "
                  "by attending to the context inputs *similar* to the query and reading the label out with a positive "
                  "slope, or by attending to the *opposite* inputs and reading it out negated "
                  "(`icl_lens/lab/_mirror.py`). Per seed: the first layer's *preference* (correlation of the query's "
                  "attention scores with xⱼ·x_q, per head) at initialisation and after training; the *label response* "
                  "ρ = Σⱼ ∂ŷ_q/∂yⱼ (how the prediction moves when every context label moves together: the part of the "
                  "solution the task leaves free); the *readout slope* along the direction in which the attention "
                  "output carries the labels; the *task slope* Σŷy/Σy² (> 0: the task is solved); the *SGD uniform "
                  "share* (of the change one small SGD step on W_in makes to the context-free predictions on 64 probes, "
                  "the part that is the same on every probe: near 1, an SGD step only shifts every prediction toward "
                  "the example's label); the output side and the cosines of every cell. `sb_oriented` is the same "
                  "model and recipe with the initialisation oriented (every head that prefers opposite inputs at "
                  "initialisation has its query projection negated before training): the intervention on the cause.",
                  "", markdown_table(frame), "", "Every one-block softmax model, counted:", "",
                  markdown_table(compact), ""]

    # 2b. One factor at a time
    abl = ablation(tables, lab)
    if abl is not None:
        numbers["ablation"] = abl
        lines += ["### 2b. One factor at a time on the oriented single block",
                  f"Base: `{ABLATION_BASE}` (the paper's single block with the oriented initialisation, so that no seed "
                  "starts in the opposite basin); each variant changes ONE factor (oriented too, same recipe unless "
                  "the factor is the recipe). Per cell: the mean [95% t over seeds] and each seed's sign; *change*: "
                  f"the variant's mean minus the base's [95% Welch interval over seeds] and its verdict. {abl['m']} "
                  f"comparisons: at the Bonferroni level {abl['family_level']:.4f} the verdicts are in the JSON "
                  "(`verdict_family`). The base lies above its control on "
                  + ", ".join(f"{k} of {len(abl['seeds'])} seeds ({c})" for c, k in abl["above_control"].items()) + ".",
                  "", markdown_table(ablation_rows(abl)), ""]

    # 3. Capacity
    cap_rows = []
    if with_capacity:
        from icl_lens.lab.experiments import METHODS

        for name, r in with_capacity.items():
            entry = {}
            for m in METHODS:
                ci = _over_seeds([x["capacity"].test[m] for x in r["runs"]])
                train = [x["capacity"].train[m] for x in r["runs"] if m in x["capacity"].train]
                entry[m] = {**_ci_dict(ci), "train_mse": (float(torch.cat(train).double().mean()) if train else None)}
            numbers["lab"][name]["capacity"] = entry
            cap_rows.append({"model": name, **{m: f"{entry[m]['mean']:.3f} [{entry[m]['low']:.3f}, {entry[m]['high']:.3f}]"
                                               + (f" ({entry[m]['train_mse']:.3f})" if entry[m]["train_mse"] is not None else "")
                                               for m in METHODS}})
        c0 = with_capacity[next(iter(with_capacity))]["runs"][0]["capacity"]
        lines += ["### 3. Capacity: can any update of W_in fit the pairs?",
                  f"On the first {max(len(r['runs']) for r in with_capacity.values())} seeds of each model. "
                  "Normalised test MSE on the probes [95% t-interval over seeds] and, in parentheses, the MSE on "
                  "the prompt's own pairs. *W0*: context-free model; *SGD one pass*: the loss curves' best rate; "
                  f"*SGD small steps*: {c0.epochs} passes at 1/{c0.epochs} of that rate; *ridge least squares*: "
                  f"{c0.iterations} damped Gauss–Newton steps on every layer's W_in, each a ridge least-squares fit "
                  f"(ridge {c0.ridge:g} × the mean eigenvalue of the pairs' kernel) through the package's "
                  "`factored_least_squares` (`icl_lens.lab.experiments.capacity_test`).", "",
                  markdown_table(pd.DataFrame(cap_rows)), ""]

    # 4. Function space
    if full:
        rows = []
        for name, r in full.items():
            fcs = [x["curves"].function_cosines() for x in r["runs"]]
            entry = {k: _ci_dict(_over_seeds([fc[k][:, -1] for fc in fcs])) for k in fcs[0]}
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
    for name, r in with_capacity.items():
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
                  "pairs, mean over the seeds of section 3); language models: KL(contextual ‖ variant) of the next-token distribution "
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

    numbers["claim"] = rules.claim_wording(rules.claim_cells(numbers["lab"], MAIN_LAB)) if main_tables else None
    numbers["claim_paper_model"] = (rules.claim_wording(rules.claim_cells(numbers["lab"], ("single_block",)))
                                    if "single_block" in main_tables else None)
    numbers["reading"] = reading(lab, tables, lm_tables, numbers)
    numbers["workshop"] = {"alignment": workshop_sentence(numbers)}
    lines += ["### Reading (computed from the tables above)", "", *numbers["reading"], ""]
    return write_fragment(args.out, lines), numbers


# --- sentences, each computed from the numbers it states ---------------------------------------------------------

def claim_sentence(claim: dict, paper_model: dict | None) -> str:
    """The paper's alignment claim in the rules' words: over the main lab models, and on the paper's model."""
    text = f"- The paper's alignment claim (Dherin et al. 2025, §5) over the {claim['m']} cells of the lab models: **{claim['sentence']}**."
    if paper_model is not None:
        text += f" On the paper's model (`single_block`) alone: {paper_model['sentence']}."
    return text


def workshop_sentence(numbers: dict) -> str | None:
    """The sentence docs/workshop.md and notebook 02 quote (read from the JSON): the paper's model over its seeds,
    by population, and the claim's wording by the rules."""
    signs, claim = (numbers.get("signs") or {}).get("single_block"), numbers.get("claim_paper_model")
    if not signs or not claim:
        return None
    pops = signs["populations"]
    words = {"similar": "attend to the context inputs similar to the query", "opposite": "to the opposite ones",
             "unselective": "to neither"}
    counts = ", ".join(f"{len(pops[p]['seeds']) if p in pops else 0} {words[p]}" for p in POPULATIONS)
    steps = "; ".join(f"{p} {_fmt_interval(e['cells']['absorb step']['interval'], e['cells']['absorb step']['mean'])}"
                      for p, e in pops.items())
    return (f"Over {signs['summary']['seeds']} training seeds of the paper's single block, {counts}; the per-step "
            f"alignment with SGD (absorb order) by population: {steps}. By the rule the claim is {claim['sentence']}.")


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


def ablation_sentences(abl: dict) -> list[str]:
    """Per factor: which cells it lowers or raises (95%, and which survive the Bonferroni level), else none."""
    out = [f"- One factor at a time on `{abl['base']}` (base above its control on "
           + ", ".join(f"{k} of {len(abl['seeds'])} seeds in {c}" for c, k in abl["above_control"].items()) + "):"]
    for name, f in abl["factors"].items():
        moved = {c: v for c, v in f["change"].items() if v["verdict"] in ("lowers", "raises")}
        if moved:
            parts = [f"{v['verdict']} {c} ({_fmt_interval(v['difference'])}"
                     + (", survives Bonferroni" if v["verdict_family"] == v["verdict"] else ", not at the Bonferroni level")
                     + ")" for c, v in moved.items()]
            out.append(f"  - {f['factor']} (`{name}`): " + "; ".join(parts) + ".")
        else:
            n = len(f["seeds"])
            out.append(f"  - {f['factor']} (`{name}`): no change detected in "
                       + ", ".join(f["change"]) + f" ({n} seed{'s' if n != 1 else ''}).")
    return out


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
    if numbers.get("claim"):
        out.append(claim_sentence(numbers["claim"], numbers.get("claim_paper_model")))
    for name, entry in (numbers.get("signs") or {}).items():
        if name in ("single_block", ABLATION_BASE):  # the other one-block models: the counts table of section 2a
            out.append(cause_sentence(name, entry["summary"]))
            out.append(population_sentence(name, entry["populations"]))
    main = {n: t for n, t in tables.items() if n in MAIN_LAB}
    for order in ("absorb", "prefix"):
        items = [f"{n} {t.ci(f'sgd:{order}:step').mean:+.3f} (output side {t.ci(f'out_side:{order}:step').mean:+.3f}, "
                 f"input share {t.ci(f'in_share:{order}:step').mean:.3f})" for n, t in main.items()
                 if f"out_side:{order}:step" in t.per_prompt]
        if items:
            out.append(f"- Per-step cosine ({order} order) = output side × input share per step; means: "
                       + "; ".join(items) + ".")
    if numbers.get("ablation"):
        out.extend(ablation_sentences(numbers["ablation"]))
    if lm_tables:
        out.append("- Language models (this project's extension; the paper ran regression only; the unit is the prompt): "
                   + "; ".join(f"{n} absorb step {t.ci('sgd:absorb:step').mean:+.3f} vs control "
                               f"{t.ci('control:absorb:step').mean:+.3f} "
                               f"(*{verdict(t.ci('sgd:absorb:step'), t.ci('control:absorb:step'))}*)"
                               for n, t in lm_tables.items()) + ".")
    for name in [n for n in lab if "capacity" in numbers["lab"][n]]:
        out.append(capacity_sentence(name, numbers["lab"][name]["capacity"]))
    full = [n for n in lab if "function_space" in numbers["lab"][n]]
    if full:
        out.append(function_space_sentence({n: numbers["lab"][n]["function_space"] for n in full}))
    effect = [n for n in lab if "effect" in numbers["lab"][n]]
    if effect:
        corr, win = [], []
        for name in effect:
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


if __name__ == "__main__":
    main()
