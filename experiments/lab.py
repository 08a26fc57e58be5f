"""``python -m experiments.lab``: run the six ICL-lab experiments, write ``reports/eval_lab.md`` and ``.json``.

Uses the shipped checkpoints and, for convergence, every training seed in the seed cache
(:mod:`icl_lens.lab.seeds`; no training here). Sizes are chosen so the whole run takes a
few minutes on 2 CPU cores; ``--quick`` shrinks them further for a smoke test. The
convergence verdict is the trend rule of :mod:`experiments.lab_rules` (drift(n → 2n) inside
the trained length, whole implicit update, slope over seeds), fixed before the run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from experiments import lab_rules as rules
from experiments.report import load_average, machine, markdown_table, write_fragment
from icl_lens.lab import ARCHITECTURES, training_record
from icl_lens.lab.experiments import (attention_as_regression, convergence_by_architecture, memory_and_cost,
                                      numerical_equivalence, static_thought_patch)
from icl_lens.lab import seeds as lab_seeds


# Reading rules: each finding says on which side of these thresholds the measured numbers fall.
EXACT = {"float64": 1e-10, "float32": 1e-4}  # relative error under which an identity counts as holding
LEARNS = 0.2  # normalised in-context MSE at n_train below this: the layer learns the task in context


CLAIM_WORDS = {"reproduced": "reproduced", "partly": "partly reproduced", "not": "not reproduced"}


def trend_entries(conv) -> dict:
    """Per architecture: the doublings ``ns``, each seed's mean log drift(n → 2n) and slope, and the trend verdict
    (:func:`experiments.lab_rules.trend_verdict`)."""
    out = {}
    for arch in conv.step_norms:
        ns, log_drift, slope = conv.trend(arch)
        out[arch] = {"ns": list(ns), "seeds": list(conv.seeds(arch)), "log_drift": log_drift.tolist(),
                     "drift_mean": log_drift.exp().mean(0).tolist(), "slopes": slope.tolist(),
                     **rules.trend_verdict(slope.tolist())}
    return out


def _slope(e: dict) -> str:
    ci = e["interval"]
    return (f"{ci['mean']:+.2f} [{ci['low']:+.2f}, {ci['high']:+.2f}]" if ci else f"{e['slopes'][0]:+.2f} (1 seed)")


def convergence_sentences(trend: dict, claim: dict, desc: pd.DataFrame, n_train: int, n_max: int,
                          state_constant: bool) -> list[str]:
    """The convergence findings: the trend verdict per architecture and the papers' claims, each attributed."""
    drift = "; ".join(f"{a} slope {_slope(e)} ({e['verdict']}; drift " + ", ".join(
        f"{n}→{2 * n} {d:.2f}" for n, d in zip(e["ns"], e["drift_mean"])) + f"; {len(e['seeds'])} seed(s))"
                      for a, e in trend.items())
    out = [f"- 3: slope of log drift(n → 2n) against log n, n = {', '.join(map(str, next(iter(trend.values()))['ns']))} "
           f"(inside the {n_train} trained pairs, whole implicit update) [95% t over seeds]: {drift}."]
    if claim.get("verdict") != "not tested":
        diff = claim["difference"]
        out.append(
            "- Dherin et al. 2025 (arXiv 2507.16003, §5: attention's implicit updates settle, an RNN's do not): softmax "
            f"{claim['softmax']['verdict']}, GRU {claim['gru']['verdict']}"
            + (f"; softmax's slope minus the GRU's {diff['mean']:+.2f} [{diff['low']:+.2f}, {diff['high']:+.2f}] (Welch)"
               if diff else "")
            + f": **{CLAIM_WORDS[claim['verdict']]}** by the rule.")
    if "delta" in desc.index:
        mse = desc.loc["delta", "norm_mse_at_n_train"]
        learns = mse < LEARNS
        out.append(
            f"- McDermott, Heath, Parhi 2026 (arXiv 2606.25342: a fixed-state parametric layer can learn in context "
            f"with constant memory): the delta rule's in-context MSE at {n_train} pairs is {mse:.3f} "
            f"({'below' if learns else 'not below'} {LEARNS}; softmax {desc.loc['softmax', 'norm_mse_at_n_train']:.3f}) "
            f"with a state that {'stays constant' if state_constant else '**does not** stay constant'} (section 5): "
            f"{'supported' if learns and state_constant else '**not** supported'} here.")
    return out


def workshop_sentence(trend: dict, claim: dict, n_train: int) -> str | None:
    """The convergence sentence docs/workshop.md quotes (read from the JSON)."""
    if claim.get("verdict") == "not tested":
        return None
    return (f"Inside the {n_train} trained pairs the drift of the whole implicit update (W_in patches and skip "
            f"corrections) falls with n at the log-log slope {_slope(trend['softmax'])} for softmax "
            f"({claim['softmax']['verdict']}) and {_slope(trend['gru'])} for the GRU ({claim['gru']['verdict']}; "
            f"a running average gives −0.5, the rule asks ≤ {rules.TREND_SLOPE}): Dherin et al.'s convergence claim is "
            f"{CLAIM_WORDS[claim['verdict']]} by the trend rule.")


def findings(eq, conv, trend, claim, tp, mc, rv) -> list[str]:
    """Short statements, each computed from the results it summarises with the rules above (``conv``: the
    descriptive convergence run of the shipped seed; ``trend`` and ``claim``: :func:`trend_entries` and
    :func:`experiments.lab_rules.settling_claim` over every cached seed)."""
    e = eq.to_frame()
    worst = lambda d: e[e.dtype == d][["rel_error_prediction", "rel_error_residual"]].to_numpy().max()  # noqa: E731
    exact = worst("float64") < EXACT["float64"] and worst("float32") < EXACT["float32"]
    c = conv.summary().set_index("arch")
    t = tp.summary().set_index("K")
    k0, k1 = t.index.min(), t.index.max()
    gap0, gap1 = t.test_mse[k0] - t.train_mse[k0], t.test_mse[k1] - t.train_mse[k1]
    side = lambda x, y: "below" if x < y else "above"  # noqa: E731
    m = mc.to_frame()
    lo, hi = m.context_length.min(), m.context_length.max()
    grow = mc.bytes_at("softmax", hi) / mc.bytes_at("softmax", lo)
    fixed = ("linear", "delta", "gru")
    constant = all(mc.bytes_at(a, hi) == mc.bytes_at(a, lo) for a in fixed)
    tmin = m.set_index(["arch", "context_length"]).us_per_token_min
    tratio = lambda a: tmin[(a, hi)] / tmin[(a, lo)]  # noqa: E731
    identity = max(r["max_rel_error"] for r in rv.rows)
    return [
        f"Rules: an identity holds when its relative error is below {EXACT['float64']:.0e} (float64) / "
        f"{EXACT['float32']:.0e} (float32); the implicit weights *converge* when the 95% t-interval over training "
        f"seeds of the slope of log drift(n → 2n) against log n (inside the trained length, whole implicit update) "
        f"lies at or below {rules.TREND_SLOPE} (a running average of noisy steps gives −0.5, steps that do not "
        f"average out 0), *do not converge* when it lies above, else *undecided* (`experiments/lab_rules.py`, fixed "
        f"before the run); a layer *learns in context* when its normalised MSE at n_train is below {LEARNS}. "
        "The decay exponent α only describes the steps: steps ∝ i^−α with α ≤ 1 do not sum.", "",
        f"- 1: the patched context-free forward {'reproduces' if exact else '**does not** reproduce'} the contextual "
        f"one for the {e.arch.nunique()} contextual layers: worst relative error {worst('float64'):.1e} at float64, "
        f"{worst('float32'):.1e} at float32.",
        "- 2: implicit vs explicit finetuning is measured with the paper's protocol in its own section "
        "(`python -m experiments.finetune_alignment`).",
        *convergence_sentences(trend, claim, c, conv.n_train, conv.n_max, constant),
        f"- 4: the thought patch's train–test gap {'shrinks' if gap1 < gap0 else 'does not shrink'}: "
        f"{gap0:.3f} (K={k0}) to {gap1:.3f} (K={k1}); at K={k1} the test error {t.test_mse[k1]:.3f} is "
        f"{side(t.test_mse[k1], t.no_context_test_mse[k1])} no context ({t.no_context_test_mse[k1]:.3f}) and "
        f"{side(t.test_mse[k1], t.contextual_test_mse[k1])} the prompt in context ({t.contextual_test_mse[k1]:.3f}).",
        f"- 5: the KV cache grows {grow:.0f}× from {lo} to {hi} tokens ({mc.bytes_at('softmax', hi)} bytes); the "
        f"fixed states {'stay' if constant else 'do not stay constant; they end'} at {mc.bytes_at('linear', hi)} "
        f"(linear), {mc.bytes_at('delta', hi)} (delta), {mc.bytes_at('gru', hi)} (GRU) bytes. Per-token time "
        f"(minimum over the window) changes by {tratio('softmax'):.2f}× from {lo} to {hi} tokens for softmax and by "
        f"{min(tratio(a) for a in fixed):.2f}–{max(tratio(a) for a in fixed):.2f}× for the fixed-state layers.",
        f"- 6: every identity {'holds' if identity < EXACT['float64'] else '**does not** hold'}: worst relative "
        f"error {identity:.1e} (float64).",
    ]


STAGES = ("equivalence", "convergence", "thought patch", "memory and cost", "attention as regression")


def run(quick: bool = False, out: str = "reports/eval_lab.md", progress: bool = True) -> str:
    s = (lambda full, small: small if quick else full)  # noqa: E731
    bar = tqdm(total=len(STAGES), desc="lab eval", unit="experiment", disable=not progress)

    def stage(name, experiment):
        bar.set_postfix_str(name)
        result = experiment()
        bar.update()
        return result

    t0, load_before = time.perf_counter(), load_average()
    parts = ["## ICL lab: linear-regression experiments (attention vs parametric and recurrent layers)", "",
             f"Command: `python -m experiments.lab{' --quick' if quick else ''}` (shipped checkpoints and the seed cache of `python -m icl_lens.lab.seeds`, no training).",
             f"Machine: {machine(load_before=load_before)}.", ""]

    rec = pd.DataFrame([{"arch": a, **{k: training_record(a)[k] for k in ("steps", "batch", "seconds", "eval_loss_n_train")},
                         "seeds": ", ".join(str(x) for x in lab_seeds.SEEDS if lab_seeds.is_cached(a, x))} for a in ARCHITECTURES])
    parts += ["### Models",
              "10-layer Pre-LN blocks (d_model 32, d_mlp 128, 4 heads, GELU MLP), tokens `[x, y, is_query]`, d_x = 4, "
              "trained on context lengths 1..16 (`python -m icl_lens.lab.seeds`; seed 0 is the shipped checkpoint, whose "
              "record is shown). `eval_loss_n_train` = normalised MSE at the query with 16 pairs (0 = least squares, "
              "1 = ignoring the context); *seeds*: the training seeds in the cache, all used by section 3's trend.", "",
              markdown_table(rec), ""]

    eq = stage("equivalence", lambda: numerical_equivalence(n_prompts=s(64, 8)))
    parts += ["### 1. Numerical equivalence (contextual vs patched context-free forward)",
              "Every token run alone with its per-layer rank-1 patch of W_in plus the skip-connection bias; "
              "relative error = max |difference| / max |contextual| over all prompts × 17 positions.", "",
              markdown_table(eq.to_frame()), ""]

    parts += ["### 2. Implicit trajectory vs explicit SGD on the same examples",
              "Measured with the paper's protocol (loss curves, cumulative and per-step alignment in both orders, "
              "controls, where the context effect lives) by `python -m experiments.finetune_alignment`: see the "
              "section *Implicit vs explicit finetuning (the paper's protocol)*.", ""]

    def convergence():
        desc = convergence_by_architecture(n_prompts=s(16, 3), n_max=s(64, 32), seeds=(0,))
        n_train = desc.n_train
        runs = convergence_by_architecture(n_prompts=s(16, 3), n_max=n_train, seeds=lab_seeds.SEEDS)
        return desc, runs

    conv, conv_seeds = stage("convergence", convergence)
    trend = trend_entries(conv_seeds)
    claim = rules.settling_claim({a: e["slopes"] for a, e in trend.items()})
    cs = conv.summary()
    trend_table = pd.DataFrame([{"arch": a, "seeds": len(e["seeds"]),
                                 **{f"drift {n}→{2 * n}": f"{d:.3f}" for n, d in zip(e["ns"], e["drift_mean"])},
                                 "slope per seed": " ".join(f"{x:+.2f}" for x in e["slopes"]),
                                 "slope [95% t over seeds]": _slope(e), "verdict": e["verdict"]}
                                for a, e in trend.items()])
    desc_table = pd.DataFrame({"arch": cs.arch, f"drift {conv.n_train}→{conv.n_max}": cs.drift_train_to_max,
                               "α (from 4)": cs.alpha_mean_curve, f"α (from {conv.n_train})": cs.alpha_beyond_train,
                               "late/early": cs.late_over_early, f"MSE at {conv.n_train}": cs.norm_mse_at_n_train,
                               f"MSE at {conv.n_max}": cs.norm_mse_at_n_max})
    parts += ["### 3. Convergence by architecture (do the implicit weights settle?)",
              f"The whole implicit update W(i) of the query after i pairs (every layer's W_in patch and its skip "
              f"correction). *drift n→2n* = max over n < m ≤ 2n of ‖W(m) − W(n)‖/‖W(n) − W(0)‖ (how far the weights "
              f"still move, relative to how far they came), for n = 2, 4, … inside the {conv.n_train} trained pairs "
              "(geometric mean over prompts, mean over seeds); *slope*: per training seed, the least-squares slope of "
              "the mean log drift against log n (`ConvergenceResult.trend`), with its 95% t-interval over seeds; "
              "verdict by the rule below.", "", markdown_table(trend_table), "",
              f"Beyond the trained length (description only, shipped seed 0, up to {conv.n_max} pairs): α is the "
              "power-law fit of the W_in step norm g(i) ≈ c·i^(−α) (`icl_lens.core.power_law_fit`); late/early = mean step "
              f"over the last quarter / over the first {conv.n_train}; MSE: normalised in-context error of the query.",
              "", markdown_table(desc_table), ""]

    tp = stage("thought patch", lambda: static_thought_patch(n_prompts=s(8, 2), ks=s((1, 2, 4, 8, 16, 32, 64), (1, 8, 64))))
    parts += ["### 4. Static thought patch (softmax model)",
              "One (Δ_l, b_l) per layer from K calibration queries (Algorithm 1 of arXiv 2510.08734, ridge 1e-2), "
              "then the query alone: normalised MSE to y on the calibration queries (train) and 256 fresh queries "
              "(test), and to the contextual model's predictions (fidelity); mean over prompts.", "",
              markdown_table(tp.summary()), ""]

    mc = stage("memory and cost", lambda: memory_and_cost(lengths=s((32, 128, 512, 2048), (32, 64, 256))))
    parts += ["### 5. Memory and time per token (token-by-token decoding, batch 1, float32)",
              "State bytes measured from the tensors held after T tokens (KV cache for softmax, fixed state otherwise); "
              "time per token = minimum (and, in the frame, median) wall time over the 32 tokens before T.", "",
              markdown_table(mc.to_frame().pivot(index="context_length", columns="arch", values="state_bytes")
                             .reset_index().rename_axis(None, axis=1)), "",
              "Microseconds per token (minimum over the window; the median, more sensitive to other load, is in "
              "`memory_and_cost().to_frame()`):", "",
              markdown_table(mc.to_frame().pivot(index="context_length", columns="arch", values="us_per_token_min")
                             .reset_index().rename_axis(None, axis=1)), ""]

    rv = stage("attention as regression", lambda: attention_as_regression(n_prompts=s(8, 2)))
    parts += ["### 6. Attention as regression (float64, every layer and head)", "",
              markdown_table(rv.to_frame().fillna("")), ""]
    found = findings(eq, conv, trend, claim, tp, mc, rv)
    parts += ["### Findings (numbers from the tables above)", "", *found, ""]
    bar.close()
    seconds = time.perf_counter() - t0
    parts += [f"Total run time: {seconds:.0f} s.", ""]
    numbers = {"quick": quick, "seconds": seconds,
               "rules": {"exact": EXACT, "trend_slope": rules.TREND_SLOPE, "learns": LEARNS},
               "seeds": {a: e["seeds"] for a, e in trend.items()}, "models": rec.to_dict(orient="records"),
               "equivalence": eq.to_frame().to_dict(orient="records"),
               "convergence": {"n_train": conv.n_train, "n_max": conv.n_max, "summary": cs.to_dict(orient="records"),
                               "trend": trend, "claim": claim},
               "thought_patch": tp.summary().to_dict(orient="records"),
               "memory_cost": mc.to_frame().to_dict(orient="records"),
               "attention_regression": [{k: v for k, v in r.items()} for r in rv.rows], "findings": found,
               "workshop": {"convergence": workshop_sentence(trend, claim, conv.n_train)}}
    Path(out).with_suffix(".json").write_text(json.dumps(numbers, indent=1, default=float) + "\n", encoding="utf-8")
    return write_fragment(out, parts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--out", default="reports/eval_lab.md")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for these tiny models)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.stdout.write(run(args.quick, args.out, progress=not args.no_progress))


if __name__ == "__main__":
    main()
