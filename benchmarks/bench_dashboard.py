"""Keystroke → figures-updated latency of the live dashboard (issues 4, 28, 41), and its memory over many edits (issue 26).

For each model and prompt size (``--sizes``, default 64 and 512 tokens): the prompt is shown,
then one token is appended (a new token each trial, so no cached result is reused); the time
from setting the text area to the figures being updated in the kernel is recorded: *figures*
(strip, heatmap, alignment matrix: phase 1), *attention*, *first paint* (every panel drawn:
predictions and the coarse trajectory) and *refined* (the full trajectory of the last token:
phase 2), each against a plain forward of the prompt timed after every append. A full recompute (a 64-token prompt sharing no prefix with the previous one)
is compared with a plain forward (with logits) of the same tokens, measured in the same
run. *Baseline*, same run: the dashboard computing its trajectory and attention with the
library's plain calls (no PatchSession reuse, full d_mlp factors, a full attention
forward), as it did before issue 28. Debounce is set to 0 here; in the UI add the
debounce (default 150 ms) after the last keystroke. Browser rendering is not included.

Memory: ``--rss-edits`` edits through the dashboard on the first model, typed at the end of
a ~1,020-token prompt (a word appended or deleted), each as soon as the previous edit's
figures are drawn, so every edit computes its patches and the previous edit's attention
and trajectory are abandoned, as in fast typing; resident set size at the start and the
end, the peak, and the analysis cache's byte total against its cap. ``--memory-only``
reruns this part alone and rewrites it into the reports beside the latency numbers of the
JSON written before.

Prints and writes ``reports/bench_dashboard.md`` and ``reports/bench_dashboard.json``.

    python benchmarks/bench_dashboard.py [--models gemma-3-270m smollm2-135m] [--trials 15] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout root, for experiments.report

REPORTS = Path(__file__).resolve().parent.parent / "reports"
OUT = REPORTS / "bench_dashboard.md"
BASE = ("In the beginning the garden was quiet. The gardener planted roses, tulips and lilies along "
        "the old stone wall, and every morning she watered them while the birds sang in the apple trees. "
        "Years later her grandchildren still remembered the smell of the roses and the sound of the birds "
        "in the early summer light, long after the house was sold and the garden")
WORDS = [" grew", " faded", " stayed", " bloomed", " slept", " waited", " sang", " changed", " lived", " dried",
         " rested", " shone", " turned", " fell", " rose", " moved", " spoke", " burned", " healed", " froze"]

# Targets (issue 41, Gemma 3 270M, one token appended to 64 and to 512): p50 ratios to a forward of the prompt.
FIGURES_X, FIRST_PAINT_X, REFINED_X, FULL_TARGET_RATIO = 0.15, 0.3, 1.0, 1.5


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _prompt_of(model, n_tokens: int, base: str = BASE) -> str:
    """Text whose tokenization (with BOS) has exactly ``n_tokens`` tokens."""
    ids = model.to_tokens(base, truncate=False)[0]
    while ids.numel() < n_tokens + 1:
        base = base + " " + base
        ids = model.to_tokens(base, truncate=False)[0]
    bos = int(ids[0]) == model.tokenizer.bos_token_id
    body = ids[1:] if bos else ids
    text = model.tokenizer.decode(body[: n_tokens - int(bos)])
    got = model.to_tokens(text, truncate=False)[0].numel()
    assert got == n_tokens, f"round trip gave {got} tokens, wanted {n_tokens}"
    return text


def _latency(d, text: str) -> dict[str, float]:
    start = time.perf_counter()
    d.set_prompt(text)
    generation = d.runner.generation
    assert d.wait(1200), "dashboard did not finish"
    assert d.last_error == "", d.last_error
    t = d.timeline[generation]
    out = {k: t[k] - start for k in ("phase1", "attention", "phase2")}
    out["first_paint"] = t.get("first_paint", t["phase2"]) - start  # every panel drawn (a coarse trajectory)
    return out


def _plain_analyzer(analyzer):
    """The analysis as before issue 28 (the baseline): plain library trajectory and attention calls."""
    from icl_lens.dynamics import NoContextError, trajectory
    from icl_lens.model import attention_pattern

    def plain_trajectory(prompt, query, order="prefix", layers=None, stale=None, steps=None, readout=False):
        def make():
            try:
                return trajectory(analyzer.model, prompt.ids, query=query, order=order)
            except NoContextError as exc:
                return str(exc)
        return analyzer.cache.get_or(("plain-trajectory", prompt.key, query, order), make)

    def plain_attention(prompt, layer, stale=None):
        return analyzer.cache.get_or(("plain-attention", prompt.key, layer),
                                     lambda: attention_pattern(analyzer.model, prompt.ids, layer))

    analyzer.trajectory, analyzer.attention = plain_trajectory, plain_attention
    analyzer.coarse_steps = lambda prompt, query: None  # no coarse drawing (issue 41)
    return analyzer


KEYS = ("phase1", "attention", "first_paint", "phase2")


def _appends(d, base: str, trials: int, model=None, ids=None) -> dict[str, list[float]]:
    """``trials`` appends of one token to ``base``; with ``model`` and ``ids``, a plain forward (with logits) of
    ``ids`` (the base prompt) after each, interleaved so that both see the same load."""
    out: dict[str, list[float]] = {k: [] for k in KEYS + ("forward", "pass", "blocks", "copies")}
    if model is not None:
        coarse = d.analyzer.coarse_steps(d.analyzer.encode(base), ids.numel() - 1)
        out["copy_rows"] = [len(coarse) if coarse is not None else ids.numel() - 1]  # else all n + 1 prefix lengths
    for k in range(trials):
        _latency(d, base)  # back to the base prompt (cached, not timed)
        t = _latency(d, base + WORDS[k % len(WORDS)] + ("" if k < len(WORDS) else f" {k}"))
        for key in KEYS:
            out[key].append(t[key])
        if model is not None:
            with torch.no_grad():
                start = time.perf_counter()
                model(ids[None])
                out["forward"].append(time.perf_counter() - start)
                # one pass: the base prompt's last token over the session's keys and values, its logits (every
                # weight read once, the unembedding of one row): what each of the keystroke's passes costs at least
                start = time.perf_counter()
                d.analyzer.session.logits_at(ids, ids.numel() - 1)
                out["pass"].append(time.perf_counter() - start)
                # the same token through the blocks only, stopped after the last one (no unembedding): what the
                # coarse trajectory's forward costs at least
                out["blocks"].append(_blocks_pass(model, d.analyzer.session, ids))
                # as many rows through the blocks as the coarse trajectory has query copies: its forward's arithmetic
                out["copies"].append(_blocks_pass(model, d.analyzer.session, ids, out["copy_rows"][0]))
    return out


def _blocks_pass(model, session, ids, rows: int = 1) -> float:
    """Seconds of the last ``rows`` tokens' forward over ``session``'s keys and values of the tokens before them,
    stopped after the last block (every block's weights read once, the unembedding not; the arithmetic of ``rows``
    rows, no hook computing anything)."""
    from icl_lens.model import activations_captured, block_family

    past, _ = session.prefix_cache(ids, ids.numel() - rows)
    last = block_family(model).resid_post(model.cfg.n_layers - 1)
    start = time.perf_counter()
    with activations_captured(model, [(last, lambda x, hook: None)], stop_after=last):
        model(ids[None, -rows:], past_key_values=past, return_type=None)
    return time.perf_counter() - start


def _fused(one: float, blocks: float, copies: float, k: int, fwd: float) -> str:
    """The other order: phase 1's token and the coarse copies in one forward save a read through the blocks, but
    the figures then wait for it. Says whether the figures and first paint targets can both hold."""
    fused = copies + one - blocks  # k rows through the blocks (the new token one more), one unembedding
    both = (one + copies) / fwd <= FIRST_PAINT_X or (copies / fwd <= FIGURES_X and fused / fwd <= FIRST_PAINT_X)
    return (f"; the new token and the {k} copies in one forward: first paint ≥ {fused / fwd:.2f}×, figures ≥ "
            f"{copies / fwd:.2f}× (they wait for it)" + ("" if both else
            f"; so figures ≤ {FIGURES_X}× and first paint ≤ {FIRST_PAINT_X}× cannot both hold here, in either order"))


def bench_model(name: str, trials: int, full_trials: int, baseline_trials: int, sizes: list[int]) -> dict:
    model = icl_lens.load_model(name)
    d = icl_lens.dashboard(model, debounce_s=0.0)
    appends = {}
    for size in sizes:
        base = _prompt_of(model, size)
        ids = model.to_tokens(base, truncate=False)[0]
        first = _latency(d, base)  # warm-up (the first keystroke of the session at the first size)
        a = _appends(d, base, trials if size == sizes[0] else max(3, trials // 3), model, ids)
        a["first_keystroke"] = first
        appends[str(size)] = a
    base = _prompt_of(model, sizes[0])
    n_base = model.to_tokens(base, truncate=False)[0].numel()
    _latency(d, base)
    stats = d.analyzer.session.last_stats
    full, forward = [], []
    for k in range(full_trials):
        other = _prompt_of(model, n_base, base=f"Note {k}: " + BASE[::-1][:200] + " " + BASE)
        ids = model.to_tokens(other, truncate=False)[0]
        with torch.no_grad():
            start = time.perf_counter()
            model(ids[None])
            forward.append(time.perf_counter() - start)
        full.append(_latency(d, other))
    d.close()
    baseline = None
    if baseline_trials:
        b = icl_lens.dashboard(model, debounce_s=0.0)
        _plain_analyzer(b.analyzer)
        _latency(b, base)
        baseline = _appends(b, base, baseline_trials)
        b.close()
    weights_gb = sum(w.numel() * w.element_size() for w in model.parameters()) / 1e9
    unembed_gb = model.W_U.numel() * model.W_U.element_size() / 1e9
    return dict(name=name, n=n_base, appends=appends, weights_gb=weights_gb, unembed_gb=unembed_gb, full={k: [f[k] for f in full] for k in full[0]},
                forward=forward, baseline=baseline, recomputed=stats.recomputed if stats else None)


def rss_over_edits(name: str, edits: int, n_tokens: int, gap: float) -> dict:
    """RSS while ``edits`` edits are typed at the end of an ``n_tokens`` prompt, each ``gap`` seconds after
    the previous edit's figures were drawn."""
    import psutil

    proc = psutil.Process()
    model = icl_lens.load_model(name)
    d = icl_lens.dashboard(model, debounce_s=0.0)
    base = _prompt_of(model, n_tokens)
    d.set_prompt(base)
    assert d.wait(1200), "dashboard did not finish"
    rss_start = proc.memory_info().rss
    peak, stop = [rss_start], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cache_peak, text, added = 0, base, []
    start = time.perf_counter()
    for k in range(edits):
        if len(added) < 6 and (k % 9 != 8 or not added):  # mostly typing, now and then a word deleted
            added.append(WORDS[k % len(WORDS)])
        else:
            added.pop()
        d.set_prompt(base + "".join(added))
        generation = d.runner.generation
        while "phase1" not in d.timeline.get(generation, {}) and not d.runner.newer_pending(generation):
            time.sleep(0.005)
            if d.last_error:
                raise RuntimeError(d.last_error)
        cache_peak = max(cache_peak, d.analyzer.cache.total_bytes)
        time.sleep(gap)
    assert d.wait(1200), "dashboard did not finish"
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    rss_end = proc.memory_info().rss
    cache = d.analyzer.cache
    out = dict(name=name, edits=edits, n_tokens=n_tokens, gap_s=gap, seconds=seconds, rss_start_mb=rss_start / 2**20,
               rss_end_mb=rss_end / 2**20, rss_peak_mb=peak[0] / 2**20, cache_cap_mb=cache.cap_bytes / 2**20,
               cache_peak_mb=max(cache_peak, cache.total_bytes) / 2**20, cache_entries=len(cache),
               drawn=len(d.runner.drawn), last_error=d.last_error.splitlines()[-1] if d.last_error else "")
    d.close()
    return out


def main() -> None:
    global torch, icl_lens
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gemma-3-270m", "smollm2-135m"])
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--full-trials", type=int, default=5)
    parser.add_argument("--baseline-trials", type=int, default=5, help="appends timed with the pre-issue-28 analysis")
    parser.add_argument("--rss-edits", type=int, default=200, help="edits of the memory run (0: skip it)")
    parser.add_argument("--rss-tokens", type=int, default=1020)
    parser.add_argument("--rss-gap", type=float, default=0.03, help="seconds between two edits of the memory run")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a shared, loaded 2-core machine a second "
                             "thread spin-waits for a core)")
    parser.add_argument("--sizes", nargs="+", type=int, default=[64, 512],
                        help="prompt lengths a token is appended to (the first also for full recomputes and the "
                             "baseline; later sizes get a third of the trials, at least 3)")
    parser.add_argument("--memory-only", action="store_true",
                        help="run the memory part only; keep the latency numbers of the JSON written before")
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
    json_path = args.out.with_suffix(".json")
    earlier = json.loads(json_path.read_text()) if args.memory_only else None
    if earlier:
        results = earlier["models"]
    else:
        results = [bench_model(m, args.trials, args.full_trials, args.baseline_trials, args.sizes) for m in args.models]
    latency_machine = earlier["machine"] if earlier else machine(load_before=load_before)
    memory_load_before = load_average()
    memory = rss_over_edits(args.models[0], args.rss_edits, args.rss_tokens, args.rss_gap) if args.rss_edits else None
    if memory:
        memory["machine"] = machine(load_before=memory_load_before)
    elif json_path.exists():  # --rss-edits 0: keep the memory run of the JSON written before
        memory = json.loads(json_path.read_text()).get("memory")
    load_after = load_average()
    ms = lambda s: f"{1000 * s:.0f}"  # noqa: E731
    p50 = lambda xs: _pct(xs, .5)  # noqa: E731
    command = earlier["command"] if earlier else (
        f"python benchmarks/bench_dashboard.py --models {' '.join(args.models)} --trials {args.trials} "
        f"--full-trials {args.full_trials} --baseline-trials {args.baseline_trials} --sizes "
        f"{' '.join(map(str, args.sizes))} --threads {args.threads}")
    memory_command = earlier_memory_command if memory and not args.rss_edits and (
        earlier_memory_command := json.loads(json_path.read_text()).get("memory_command")) else (f"python benchmarks/bench_dashboard.py --memory-only --models {args.models[0]} "
                      f"--rss-edits {args.rss_edits} --rss-tokens {args.rss_tokens} --rss-gap {args.rss_gap} "
                      f"--threads {args.threads}")
    lines = [
        "## Dashboard latency (keystroke → figures updated) and memory",
        "",
        f"Command: `{command}`  ",
        f"Machine: {latency_machine}; float32.",
        "Latency is measured in the kernel from setting the text to the widgets being updated, with debounce 0 (the "
        "UI waits its debounce, default 150 ms, after the last keystroke; browser rendering is not included). "
        "*Figures* = token strip, layer × token heatmap, alignment matrix (phase 1); *attention* adds the attention "
        "pattern; *first paint* = every panel drawn: the top-k predictions (contextual logits from phase 1's pass, "
        "the kept-only ones from the trajectory's step-0 copy, both through the unembedding at once; the identity "
        "check under them, a kept-only forward with every patch, is drawn after the refined trajectory) "
        "and the trajectory of the last token, coarse (W_i at a few log-spaced prefix lengths) where the context is "
        "long enough; *refined* = the full trajectory drawn (phase 2, in the background: the prefix lengths the "
        "coarse drawing lacks are computed and joined to it; a keystroke abandons it). *Append* = one token appended "
        "to an n-token prompt (PatchSession recomputes that position only); *forward* = a plain forward with logits "
        "of the n-token prompt, timed after each append in the same process (ratios are medians over medians). "
        "*Full* = an n-token prompt with no common prefix (first size). *Baseline* (same run, first size): appends "
        "with the trajectory and attention computed by the library's plain calls (full forward over prefix and query "
        "copies, d_mlp-sized factors, full attention forward, no coarse drawing), as before issue 28. *First "
        "keystroke*: the session's first prompt (every position new; the one-time QR of the dense weights is no "
        "longer on it).",
        "",
        "| model | tokens | forward p50 | append figures p50 (× forward) | attention p50 | first paint p50 (× forward) "
        "| refined p50 (× forward) | first keystroke (figures / first paint / refined) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    readings, floors = [], []
    verdict = lambda ok: "met" if ok else "missed"  # noqa: E731
    for r in results:
        for size, a in r["appends"].items():
            fwd = statistics.median(a["forward"])
            x = lambda key: p50(a[key]) / fwd  # noqa: E731
            first = a["first_keystroke"]
            lines.append(
                f"| {r['name']} | {size} → {int(size) + 1} | {ms(fwd)} ms | {ms(p50(a['phase1']))} ms "
                f"({x('phase1'):.2f}×) | {ms(p50(a['attention']))} ms | {ms(p50(a['first_paint']))} ms "
                f"({x('first_paint'):.2f}×) | {ms(p50(a['phase2']))} ms ({x('phase2'):.2f}×) "
                f"| {ms(first['phase1'])} / {ms(first['first_paint'])} / {ms(first['phase2'])} ms |")
            if r["name"] == "gemma-3-270m":
                def reading(what: str, key: str, target: float) -> str:
                    each = [t / f for t, f in zip(a[key], a["forward"])]  # each append against its own forward
                    return (f"{what} {x(key):.2f}× ({verdict(x(key) <= target)}; {min(each):.2f}–{max(each):.2f} "
                            f"per append)")
                readings.append(f"{size} tokens: " + ", ".join(
                    (reading("figures", "phase1", FIGURES_X), reading("first paint", "first_paint", FIRST_PAINT_X),
                     reading("refined", "phase2", REFINED_X))))
            if a.get("pass") and a.get("blocks") and a.get("copies"):
                one, blocks, copies, k = p50(a["pass"]), p50(a["blocks"]), p50(a["copies"]), a["copy_rows"][0]
                paint = one + copies  # what first paint costs at least: figures, copies, one unembedding
                below = [what for what, floor, target in (("figures", blocks, FIGURES_X),
                                                          ("first paint", paint, FIRST_PAINT_X)) if floor / fwd > target]
                floors.append(
                    f"{r['name']}, {size} tokens: one pass {ms(one)} ms = {one / fwd:.2f}× the forward, through the "
                    f"blocks {ms(blocks)} ms = {blocks / fwd:.2f}×, {k} rows through the blocks {ms(copies)} ms = "
                    f"{copies / fwd:.2f}×; figures ≥ one through the blocks = {blocks / fwd:.2f}× (measured "
                    f"{p50(a['phase1']) / blocks:.1f} of them); first paint ≥ one pass and {k} rows through the blocks "
                    f"= {paint / fwd:.2f}× (measured {p50(a['first_paint']) / paint:.1f} of that)"
                    + (f": the {' and '.join(below)} target{'s lie' if len(below) > 1 else ' lies'} below the floor"
                       if below else "")
                    + _fused(one, blocks, copies, k, fwd))
    lines += ["", "| model | tokens | full p50 (figures) | forward p50 | full / forward | full p50 (all panels) "
                  "| append p50 (figures / refined) | baseline append p50 (figures / all panels) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        f, base, a = r["full"], r["baseline"], r["appends"][str(r["n"])]
        ratio = statistics.median(f["phase1"]) / statistics.median(r["forward"])
        base_cell = f"{ms(p50(base['phase1']))} / {ms(p50(base['phase2']))} ms" if base else "–"
        lines.append(f"| {r['name']} | {r['n']} | {ms(p50(f['phase1']))} ms | {ms(statistics.median(r['forward']))} ms "
                     f"| {ratio:.2f}× | {ms(p50(f['phase2']))} ms | {ms(p50(a['phase1']))} / {ms(p50(a['phase2']))} ms "
                     f"| {base_cell} |")
        readings.append(f"{r['name']} full/forward {ratio:.2f}× ({verdict(ratio <= FULL_TARGET_RATIO)})")
    lines += ["", f"Targets (issue 41, Gemma 3 270M, one token appended to 64 and to 512 tokens, ratios to a forward "
              f"of the prompt in the same run): figures ≤ {FIGURES_X}×, all panels at first paint ≤ {FIRST_PAINT_X}×, "
              f"the refined trajectory ≤ {REFINED_X}× (issue 4: full recompute ≤ {FULL_TARGET_RATIO}× a plain "
              f"forward). Measured, on this machine at this load: " + "; ".join(readings) + ".",
              *([f"**The floor of a keystroke.** Each pass over the model reads every weight ("
                 + ", ".join(f"{r['name']} {r['weights_gb']:.2f} GB, {r['unembed_gb']:.2f} GB of it the unembedding"
                             for r in results if "weights_gb" in r)
                 + "), however few tokens run: *one pass* = the prompt's "
                 "last token over the session's keys and values with its logits, timed after each append; *through "
                 "the blocks* = the same token's forward stopped after the last block; *k rows through the blocks* = "
                 "the prompt's last k tokens' forward over the keys and values of those before them, stopped there, "
                 "with k the coarse trajectory's query copies (their arithmetic, no hook computing anything). The "
                 "figures need phase 1's update, which stops before the unembedding. First paint needs that, the "
                 "coarse trajectory's k copies through the blocks (its step-0 copy is the predictions' kept-only "
                 "forward, the query without its patch), and the unembedding once (the contextual row and that "
                 "copy's row together; the check with every patch runs after the refined trajectory): at least one "
                 "pass and k rows through the blocks. "
                 + "; ".join(floors) + ".", ""] if floors else []),
              f"Trials: {args.trials} appends at the first size, a third (at least 3) at the others; "
              f"{args.full_trials} full recomputes, {args.baseline_trials} baseline appends per model.", ""]
    if memory:
        m = memory
        lines += [
            f"**Memory over {m['edits']} rapid edits**, command `{memory_command}`, machine: {m['machine']} "
            f"({m['name']}, a {m['n_tokens']}-token prompt, a word typed or deleted at its end {1000 * m['gap_s']:.0f} ms "
            f"after the previous edit's figures were drawn, debounce 0, {m['seconds']:.0f} s in all): "
            f"RSS {m['rss_start_mb']:.0f} MB at the start, {m['rss_end_mb']:.0f} MB at the end "
            f"({m['rss_end_mb'] - m['rss_start_mb']:+.0f} MB), peak {m['rss_peak_mb']:.0f} MB; the analysis cache "
            f"held at most {m['cache_peak_mb']:.0f} MB of its {m['cache_cap_mb']:.0f} MB cap "
            f"(`dashboard(cache_bytes=...)`), {m['cache_entries']} entries at the end; {m['drawn']} updates drawn "
            f"(the others superseded).", ""]
    text = write_fragment(args.out, lines)
    print(text)
    numbers = dict(command=command, machine=latency_machine,
                   load_before=earlier["load_before"] if earlier else load_before,
                   load_after=earlier["load_after"] if earlier else load_after, threads=args.threads, models=results,
                   memory=memory, memory_command=memory_command,
                   targets=dict(figures_x=FIGURES_X, first_paint_x=FIRST_PAINT_X, refined_x=REFINED_X))
    json_path.write_text(json.dumps(numbers, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} and {json_path}")


if __name__ == "__main__":
    main()
