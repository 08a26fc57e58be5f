"""Sanity check of the exact patch attribution against ablation (issue 40), on the embedded models.

``python -m experiments.attribution_ablation`` writes ``reports/eval_attribution.md`` and
``reports/eval_attribution.json``.

:func:`icl_lens.patch_attribution` splits each token patch exactly over heads and removed
context tokens (docs/design.md §7). If a token's share means anything, removing that token
alone from the context should change the query's patch more than removing another one. This
command checks that with the library's context ablation (``token_patches(..., remove=[j])``),
an independent computation: the patch of query ``t`` with context ``C`` minus token ``j`` has
``δ − δ₋ⱼ`` in place of ``δ`` (``δ₋ⱼ`` = the patch for removing ``j`` alone; the kept-only input
``a`` is the same), so its norm changes by

    change(j) = ‖v‖ · | ‖R (δ − δ₋ⱼ)‖ − ‖R δ‖ |        (‖R ·‖ = ‖W ·‖, docs/design.md §3).

**Fixed before the run.** Prompts: :data:`PROMPTS`, eight short English prompts of eight
kinds written for this check (facts, a repeated list, a story, code, arithmetic, names,
translation, an instruction), none chosen after seeing a result. Queries: every position with
at least two removed context tokens. Per query, the layer is the one where its patch norm
``‖ΔW‖`` is largest (the spike a reader would click); *top* is the source token whose share
(summed over heads) is largest there; *random* is a uniformly drawn other source token (seeded
by model, prompt and position). A query is *won* when ``change(top) > change(random)``.
Verdict per model: **passes** when at least 80% of its queries are won (the point estimate);
the interval is Wilson's over queries, and a percentile bootstrap over prompts (queries of one
prompt are not independent: 8 prompts, say so). Every count comes from :func:`win_rate`.

**Baselines that could explain it away**, scored by the same function against the same random
token: the source with the largest attention weight (summed over heads) at that layer, and the
previous token. If the attention argmax wins as often, the shares add nothing over attention for
this purpose; the report says which. A secondary count pools every (query, layer) pair.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from experiments.report import command, load_average, machine, markdown_table, write_fragment

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "eval_attribution.md"
CACHE = ROOT / ".cache" / "eval_attribution"
MODELS = ("gemma-3-270m", "smollm2-135m")
PASS = 0.8
PROMPTS = (
    ("facts", "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"),
    ("repeated list", "Repeat after me: velvet harbour quantum lantern seven. velvet harbour quantum lantern seven"),
    ("story", "Anna found a small key under the stairs. She carried the key to the old chest in the attic and"),
    ("code", "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a *"),
    ("arithmetic", "3 + 4 = 7. 5 + 2 = 7. 6 + 1 = 7. 2 + 5 ="),
    ("names", "When Maria met Tom at the station, Tom gave Maria a letter. Later that evening Maria read the letter to"),
    ("translation", "English: cat. French: chat. English: dog. French: chien. English: house. French:"),
    ("instruction", "Write the plural of each word. mouse: mice. goose: geese. child:"),
)
PICKERS = ("top share", "attention argmax", "previous token")


def win_rate(rows: list[dict], picker: str, key: str = "changes") -> dict:
    """The one count of the report: how many rows ``picker``'s token changes the patch norm more than the random
    token's, with Wilson's interval over rows and a bootstrap over prompts."""
    from icl_lens.stats import bootstrap_mean, wilson_interval

    wins = [float(r[key][picker] > r[key]["random"]) for r in rows]
    if not wins:
        return {"won": 0, "n": 0, "rate": float("nan")}
    low, high = wilson_interval(int(sum(wins)), len(wins))
    boot = bootstrap_mean(wins, groups=[r["prompt"] for r in rows])
    return {"won": int(sum(wins)), "n": len(wins), "rate": sum(wins) / len(wins), "wilson_low": low,
            "wilson_high": high, "prompt_boot_low": boot.low, "prompt_boot_high": boot.high}


@torch.no_grad()
def prompt_rows(model, name: str, k: int, kind: str, prompt: str) -> dict:
    """Every query of one prompt: its layer, the picked tokens and the patch-norm change each causes."""
    from icl_lens import patch_attribution, token_patches
    from icl_lens.model import attention_pattern

    ids = model.to_tokens(prompt)[0]
    base = token_patches(model, ids)
    n = len(base.tokens)
    queries = [t for t in range(n) if len(base.kept_positions(t)) <= t - 1]  # >= 2 removed tokens
    found = dict(zip(queries, patch_attribution(model, ids, queries)))
    removed = {j: token_patches(model, ids, remove=[j]) for j in range(n) if j not in base.kept_positions(n - 1)}
    rs = [base.weights.r(layer) for layer in range(base.n_layers)]
    v_norm = torch.linalg.vector_norm(base.v, dim=-1)  # layer pos

    def change(j: int, t: int, layer: int) -> float:
        delta = base.delta[layer, t]
        without = delta - removed[j].delta[layer, t]
        r = rs[layer]
        return float(v_norm[layer, t] * ((r @ without).norm() - (r @ delta).norm()).abs())

    patterns: dict[int, torch.Tensor] = {}
    queries_out, pairs = [], []
    for t in queries:
        at = found[t]
        sources = list(at.sources)
        layer = int(at.patch_norm.argmax())
        rng = random.Random(f"{name}|{k}|{t}")
        shares = at.source_shares(layer)
        top = sources[int(shares.argmax())]
        other = rng.choice([s for s in sources if s != top])
        if layer not in patterns:
            patterns[layer] = attention_pattern(model, ids, layer)
        weights = patterns[layer][:, t, sources].sum(0)
        picks = {"top share": top, "attention argmax": sources[int(weights.argmax())], "previous token": t - 1,
                 "random": other}
        queries_out.append({"prompt": k, "kind": kind, "position": t, "token": at.tokens[t], "layer": layer,
                            "n_sources": len(sources), "top_share": float(shares.max()), "picks": picks,
                            "changes": {p: change(j, t, layer) for p, j in picks.items()},
                            "share_residual": float(at.patch_residual.abs().max())})
        for layer_ in range(len(at.layers)):  # secondary: every (query, layer) pair, top share vs random
            shares_ = at.source_shares(layer_)
            top_ = sources[int(shares_.argmax())]
            other_ = rng.choice([s for s in sources if s != top_])
            pairs.append({"prompt": k, "position": t, "layer": layer_,
                          "changes": {"top share": change(top_, t, layer_), "random": change(other_, t, layer_)}})
    return {"queries": queries_out, "pairs": pairs, "n_tokens": n}


def run_model(name: str, prompts, progress: bool) -> dict:
    import icl_lens

    CACHE.mkdir(parents=True, exist_ok=True)
    cache_path = CACHE / f"{name}.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    model = None
    out = []
    for k, (kind, prompt) in enumerate(tqdm(prompts, desc=name, disable=not progress)):
        key = f"{k}|{prompt}"
        if key not in cache:
            model = model or icl_lens.load_model(name)
            cache[key] = prompt_rows(model, name, k, kind, prompt)
            cache_path.write_text(json.dumps(cache))
        out.append(cache[key])
    return {"queries": [q for o in out for q in o["queries"]], "pairs": [p for o in out for p in o["pairs"]]}


def report(results: dict, cmd: str, machine_line: str, seconds: float) -> tuple[list[str], dict]:
    summary = {}
    rows = []
    for name, res in results.items():
        entry = {p: win_rate(res["queries"], p) for p in PICKERS}
        entry["pairs"] = win_rate(res["pairs"], "top share")
        entry["passes"] = bool(entry["top share"]["rate"] >= PASS)
        entry["max_share_residual"] = max(q["share_residual"] for q in res["queries"])
        summary[name] = entry
        for picker in PICKERS:
            w = entry[picker]
            rows.append({"model": name, "token removed": picker, "queries won vs a random token": f"{w['won']} of {w['n']}",
                         "rate": w["rate"], "Wilson 95% (queries)": f"[{w['wilson_low']:.2f}, {w['wilson_high']:.2f}]",
                         "bootstrap 95% (prompts)": f"[{w['prompt_boot_low']:.2f}, {w['prompt_boot_high']:.2f}]"})
    import pandas as pd

    lines = ["## Who wrote the patch: attribution against ablation (issue 40)", "",
             f"Command: `{cmd}`  ", f"Machine: {machine_line}; float32; {seconds:.0f} s.", "",
             "For each query with at least two removed context tokens, at the layer where its patch norm is largest: "
             "does removing the source token with the largest share (`icl_lens.patch_attribution`, summed over "
             "heads) change the query's patch norm more than removing a random other source token? The change is "
             "measured with the library's context ablation (`token_patches(..., remove=[j])`), an independent "
             "computation. Verdict rule, fixed before the run: passes when at least 80% of a model's queries are "
             "won. Baselines, scored the same way against the same random token: the token with the largest "
             "attention weight (summed over heads) and the previous token. Prompt set: 8 short English prompts of "
             "8 kinds written for this check (`experiments/attribution_ablation.py`); queries of one prompt are "
             "not independent, so the bootstrap resamples the 8 prompts.", "",
             markdown_table(pd.DataFrame(rows), digits=3), ""]
    for name, entry in summary.items():
        top, att, prev = entry["top share"], entry["attention argmax"], entry["previous token"]
        verdict = "passes" if entry["passes"] else "does not pass"
        compare = ("the attention argmax wins as often or more, so for this check the shares add nothing over the "
                   "attention weights" if att["rate"] >= top["rate"] else
                   f"above the attention argmax ({att['rate']:.0%}) and the previous token ({prev['rate']:.0%})"
                   if prev["rate"] < top["rate"] else
                   f"above the attention argmax ({att['rate']:.0%}) but not above the previous token "
                   f"({prev['rate']:.0%})")
        lines.append(f"- **{name}**: the top-share token wins on {top['won']} of {top['n']} queries "
                     f"({top['rate']:.0%}): {verdict} the 80% rule; {compare}. Every (query, layer) pair pooled: "
                     f"{entry['pairs']['won']} of {entry['pairs']['n']} ({entry['pairs']['rate']:.0%}). Largest "
                     f"|Σ shares − 1| over the queries: {entry['max_share_residual']:.1e}.")
    return lines, summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before, start = load_average(), time.perf_counter()
    results = {name: run_model(name, PROMPTS, not args.no_progress) for name in args.models}
    cmd = command("python -m experiments.attribution_ablation", argv)
    lines, summary = report(results, cmd, machine(load_before=load_before), time.perf_counter() - start)
    out = Path(args.out)
    text = write_fragment(out, lines)
    out.with_suffix(".json").write_text(json.dumps({"rule": {"pass_rate": PASS}, "prompts": PROMPTS,
                                                    "models": summary, "queries": {n: r["queries"] for n, r in
                                                                                   results.items()}}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
