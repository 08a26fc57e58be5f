"""Keystroke → figures-updated latency of the live dashboard (issue 4).

For each model: a 64-token prompt is shown, then one token is appended (a new token each
trial, so no cached result is reused); the time from setting the text area to the
figures being updated in the kernel (strip, heatmap, alignment matrix: phase 1) and to
every panel being updated (trajectory of the last token and attention too: phase 2) is
recorded. A full recompute (a 64-token prompt sharing no prefix with the previous one)
is compared with a plain forward (with logits) of the same tokens, measured in the same
run. Debounce is set to 0 here; in the UI add the debounce (default 50 ms) after the
last keystroke. Browser rendering is not included.

    python benchmarks/bench_dashboard.py [--models gemma-3-270m smollm2-135m] [--trials 15] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout root, for experiments.report

OUT = Path(__file__).resolve().parent.parent / "reports" / "bench_dashboard.md"
BASE = ("In the beginning the garden was quiet. The gardener planted roses, tulips and lilies along "
        "the old stone wall, and every morning she watered them while the birds sang in the apple trees. "
        "Years later her grandchildren still remembered the smell of the roses and the sound of the birds "
        "in the early summer light, long after the house was sold and the garden")
WORDS = [" grew", " faded", " stayed", " bloomed", " slept", " waited", " sang", " changed", " lived", " dried",
         " rested", " shone", " turned", " fell", " rose", " moved", " spoke", " burned", " healed", " froze"]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


APPEND_TARGET_MS, FULL_TARGET_RATIO = 150, 1.5


def _reading(r: dict) -> str:
    """Each target checked against one model's medians: "met" or "missed"."""
    verdict = lambda ok: "met" if ok else "missed"  # noqa: E731
    ratio = statistics.median(r["full1"]) / statistics.median(r["forward"])
    text = f"{r['name']} full/forward {ratio:.2f}× ({verdict(ratio <= FULL_TARGET_RATIO)})"
    if r["name"] == "gemma-3-270m":
        p50 = 1000 * _pct(r["append1"], .5)
        text += f", append p50 {p50:.0f} ms ({verdict(p50 <= APPEND_TARGET_MS)})"
    return text


def _prompt_of(model, n_tokens: int, base: str = BASE) -> str:
    """Text whose tokenization (with BOS) has exactly ``n_tokens`` tokens."""
    ids = model.to_tokens(base, truncate=False)[0]
    bos = int(ids[0]) == model.tokenizer.bos_token_id
    body = ids[1:] if bos else ids
    text = model.tokenizer.decode(body[: n_tokens - int(bos)])
    got = model.to_tokens(text, truncate=False)[0].numel()
    assert got == n_tokens, f"round trip gave {got} tokens, wanted {n_tokens}"
    return text


def _latency(d, text: str) -> tuple[float, float]:
    start = time.perf_counter()
    d.set_prompt(text)
    generation = d.runner.generation
    assert d.wait(600), "dashboard did not finish"
    assert d.last_error == "", d.last_error
    t = d.timeline[generation]
    return t["phase1"] - start, t["phase2"] - start


def bench_model(name: str, trials: int, full_trials: int) -> dict:
    model = icl_lens.load_model(name)
    d = icl_lens.dashboard(model, debounce_s=0.0)
    base = _prompt_of(model, 64)
    n_base = model.to_tokens(base, truncate=False)[0].numel()
    _latency(d, base)  # warm-up
    append1, append2 = [], []
    for k in range(trials):
        _latency(d, base)  # back to 64 tokens (cached, not timed)
        p1, p2 = _latency(d, base + WORDS[k % len(WORDS)] + ("" if k < len(WORDS) else f" {k}"))
        append1.append(p1)
        append2.append(p2)
    stats = d.analyzer.session.last_stats
    full1, full2, forward = [], [], []
    for k in range(full_trials):
        other = _prompt_of(model, n_base, base=f"Note {k}: " + BASE[::-1][:200] + " " + BASE)
        ids = model.to_tokens(other, truncate=False)[0]
        with torch.no_grad():
            start = time.perf_counter()
            model(ids[None])
            forward.append(time.perf_counter() - start)
        p1, p2 = _latency(d, other)
        full1.append(p1)
        full2.append(p2)
    d.close()
    return dict(name=name, n=n_base, append1=append1, append2=append2, full1=full1, full2=full2,
                forward=forward, recomputed=stats.recomputed if stats else None)


def main() -> None:
    global torch, icl_lens
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gemma-3-270m", "smollm2-135m"])
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--full-trials", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2 = the cores)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    # Before torch starts: the dashboard computes in a worker thread, which takes its
    # OpenMP thread count from the environment.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    import torch

    import icl_lens
    from experiments.report import load_average, machine, write_fragment

    torch.set_num_threads(args.threads)
    load_before = load_average()
    results = [bench_model(m, args.trials, args.full_trials) for m in args.models]
    ms = lambda s: f"{1000 * s:.0f}"  # noqa: E731
    lines = [
        "## Dashboard latency (keystroke → figures updated)",
        "",
        f"Command: `python benchmarks/bench_dashboard.py --models {' '.join(args.models)} --trials {args.trials} "
        f"--full-trials {args.full_trials} --threads {args.threads}`  ",
        f"Machine: {machine(load_before=load_before)}; float32.",
        "",
        "Latency is measured in the kernel from setting the text to the widgets being updated, with debounce 0 "
        "(the UI waits its debounce, default 50 ms, after the last keystroke; browser rendering is not "
        "included). *Figures* = token strip, layer × token heatmap, alignment matrix (phase 1); *all panels* "
        "adds the trajectory of the last token and the attention pattern (phase 2). *Append* = one token "
        "appended to a 64-token prompt (PatchSession recomputes that position only); *full* = a 64-token "
        "prompt with no common prefix; *forward* = a plain forward with logits of the same 64 tokens.",
        "",
        "| model | tokens | append p50 / p95 (figures) | append p50 / p95 (all panels) | full p50 (figures) "
        "| forward p50 | full / forward | full p50 (all panels) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = statistics.median(r["full1"]) / statistics.median(r["forward"])
        lines.append(
            f"| {r['name']} | {r['n']} → {r['n'] + 1} | {ms(_pct(r['append1'], .5))} / {ms(_pct(r['append1'], .95))} ms "
            f"| {ms(_pct(r['append2'], .5))} / {ms(_pct(r['append2'], .95))} ms | {ms(statistics.median(r['full1']))} ms "
            f"| {ms(statistics.median(r['forward']))} ms | {ratio:.2f}× | {ms(statistics.median(r['full2']))} ms |")
    lines += ["", f"Targets (issue 4): append p50 ≤ {APPEND_TARGET_MS} ms on Gemma 3 270M; full recompute ≤ "
              f"{FULL_TARGET_RATIO}× a plain forward. Measured: " + "; ".join(_reading(r) for r in results) + ".",
              f"Trials: {args.trials} appends, {args.full_trials} full recomputes per model.", ""]
    print(write_fragment(args.out, lines))


if __name__ == "__main__":
    main()
