"""Benchmark: who wrote the patch (issue 40) — the heads × tokens map of one query at every layer vs a forward.

Measures, in the same run on the same prompt (Gemma 3 270M, CPU, float32, 256 tokens by default):

- a plain forward of the whole prompt with logits (the baseline, ratio 1);
- ``icl_lens.patch_attribution`` of the last token at every layer, reusing a
  ``PatchSession`` that holds the prompt (only the query token runs, over the session's keys and
  values; then per layer a few vector–Jacobian products through the norms and the shares):
  target ≤ 0.25× the baseline;
- the same and what the patch writes at one layer (``PatchAttribution.writes``: one MLP call and
  the unembedding's Jacobian at the query), as the dashboard's panel computes them;
- the attribution without the session (a forward over the whole prompt, for scale);

at one thread and at all cores usable, interleaved, median of ``--repeats`` runs. The session's
own ``update`` (the token patches the dashboard computes anyway) is not timed. Writes
``reports/bench_attribution.md`` and ``.json``.

    PYTHONPATH=. python benchmarks/bench_attribution.py [--tokens 256] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout root, for experiments.report
from common import prompt_ids, write_json  # noqa: E402

TARGET = 0.25


def _timed(fn, cpu: list[float]) -> float:
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    cpu.append(time.process_time() - start_cpu)
    return time.perf_counter() - start


def run(model, ids, threads: int, repeats: int) -> dict:
    from icl_lens import PatchSession, patch_attribution

    torch.set_num_threads(threads)
    session = PatchSession(model, logits=False)
    session.update(ids)
    layer = model.cfg.n_layers // 2

    def forward():
        with torch.no_grad():
            model(ids[None])

    def with_session():
        return patch_attribution(model, ids, -1, session=session)

    def with_writes():
        with_session().writes(model, layers=layer, k=8)

    def without_session():
        patch_attribution(model, ids, -1)

    methods = {"plain forward of the prompt (with logits)": forward,
               "`patch_attribution`, last token, every layer, PatchSession's cache": with_session,
               "the same + what the patch writes at one layer (the dashboard panel)": with_writes,
               "`patch_attribution` without a session (forward over the prompt)": without_session}
    for fn in methods.values():  # warm-up (the dense weights' QR, autograd's first graph)
        fn()
    wall = {k: [] for k in methods}
    cpu = {k: [] for k in methods}
    for rep in range(repeats):
        for name, fn in methods.items():
            wall[name].append(_timed(fn, cpu[name]))
        print(f"{threads} thread(s), repeat {rep}: " + ", ".join(f"{statistics.median(v):.3f}s" for v in wall.values()),
              flush=True)
    at = with_session()
    return {"threads": threads, "wall_s": wall, "cpu_s": cpu, "nodes": list(at.nodes),
            "max_share_residual": float(max(at.patch_residual.abs().max(), at.correction_residual.abs().max()))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="reports/bench_attribution.md")
    args = parser.parse_args(argv)

    from experiments.report import command, load_average, machine, write_fragment
    from icl_lens import load_model

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load_before = load_average()
    model = load_model(args.model)
    ids = prompt_ids(model, args.tokens)
    results = [run(model, ids, threads, args.repeats) for threads in sorted({1, cores})]
    machine_line = machine(load_before=load_before)
    cmd = command("PYTHONPATH=. python benchmarks/bench_attribution.py", argv)
    lines = ["## Who wrote the patch: heads × tokens map of one query at every layer vs a forward", "",
             f"Command: `{cmd}`  ",
             f"Machine: {machine_line} (the thread count of each row is its own); model `{args.model}` float32, "
             f"prompt of {ids.numel()} tokens, query = the last token, {model.cfg.n_layers} layers × "
             f"{model.cfg.n_heads} heads × {ids.numel() - 2} removed context tokens.", "",
             "| threads | method | runs | median wall s | min wall s | ratio (median wall) | ratio (min wall) "
             "| ratio (median CPU) |", "|---|---|---|---|---|---|---|---|"]
    summary = []
    for res in results:
        names = list(res["wall_s"])
        base, base_min = statistics.median(res["wall_s"][names[0]]), min(res["wall_s"][names[0]])
        base_cpu = statistics.median(res["cpu_s"][names[0]])
        for name in names:
            w, c = res["wall_s"][name], res["cpu_s"][name]
            lines.append(f"| {res['threads']} | {name} | {len(w)} | {statistics.median(w):.3f} | {min(w):.3f} | "
                         f"{statistics.median(w) / base:.3f}× | {min(w) / base_min:.3f}× | "
                         f"{statistics.median(c) / base_cpu:.3f}× |")
        ratio = statistics.median(res["wall_s"][names[1]]) / base
        summary.append((res["threads"], ratio, statistics.median(res["wall_s"][names[2]]) / base))
    lines += ["", "Target (issue 40): the map for one query at every layer ≤ 0.25× a forward of the prompt, reusing "
              "the session's cache. Measured (ratio of median wall times, same run): "
              + "; ".join(f"{t} thread(s) {r:.3f}× ({'met' if r <= TARGET else 'missed'}), with what it writes at one "
                          f"layer {w:.3f}×" for t, r, w in summary) + ".",
              f"Quadrature nodes per layer (last run): {min(results[-1]['nodes'])}–{max(results[-1]['nodes'])}; "
              f"largest |Σ shares − 1|: {results[-1]['max_share_residual']:.1e}. Runs are interleaved, so a change "
              "of load affects every method.", ""]
    print(write_fragment(args.out, lines))
    write_json(args.out, {"command": cmd, "machine": machine_line, "load_average_before": load_before,
                          "tokens": int(ids.numel()), "target": TARGET, "results": results,
                          "ratios": [{"threads": t, "map": r, "map_and_writes": w} for t, r, w in summary]})


if __name__ == "__main__":
    main()
