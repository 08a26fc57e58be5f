"""Benchmark: all-layer x all-token patch extraction vs a plain forward (issue: foundation).

For each model and prompt length, in one run: time of a plain TransformerBridge forward
(with logits), time of ``token_patches`` (every layer and token, one forward), their ratio,
and peak memory of each; at 64 tokens also the naive method (one kept-only forward per
query and per layer, layers patched one by one). Writes reports/bench_patches.md.

    python benchmarks/bench_patches.py [--device cuda] [--lengths 64 256 1024] [--models ...]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import peak_memory, prompt_ids, time_it  # noqa: E402

from icl_lens import load_model, token_patches  # noqa: E402
from icl_lens.evals.report import command, machine, write_fragment  # noqa: E402
from icl_lens.model.capture import token_patches_naive  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--models", nargs="+", default=["gemma-3-270m", "smollm2-135m"])
    ap.add_argument("--naive-length", type=int, default=64)
    ap.add_argument("--out", default="reports/bench_patches.md")
    args = ap.parse_args()
    rows, naive_rows = [], []
    for name in args.models:
        model = load_model(name, device=args.device)
        for n in args.lengths:
            ids = prompt_ids(model, n).to(args.device)
            with torch.no_grad():
                with peak_memory(args.device) as mem_fwd:
                    t_fwd = time_it(lambda: model(ids[None]), device=args.device)
                with peak_memory(args.device) as mem_patch:
                    t_patch = time_it(lambda: token_patches(model, ids), device=args.device)
            rows.append((name, n, t_fwd, t_patch, t_patch / t_fwd, mem_fwd["mb"], mem_patch["mb"]))
            print(f"{name:14s} {n:5d} tokens  forward {t_fwd*1e3:8.1f} ms  patches {t_patch*1e3:8.1f} ms  "
                  f"ratio {t_patch/t_fwd:5.2f}  peak MB fwd {mem_fwd['mb']:.0f} / patches {mem_patch['mb']:.0f}", flush=True)
            if n == args.naive_length:
                start = time.perf_counter()
                naive = token_patches_naive(model, ids)
                fast = token_patches(model, ids)
                t_naive = time.perf_counter() - start
                rel = float((naive.norms() - fast.norms()).abs().max() / fast.norms().abs().max())  # noqa: E501
                naive_rows.append((name, n, t_naive, t_patch, t_naive / t_patch, rel))
                print(f"{name:14s} naive {t_naive:.1f} s vs one-pass {t_patch:.3f} s ({t_naive/t_patch:.0f}x); "
                      f"max norm difference {rel:.1e} (relative)", flush=True)
        del model
    lines = [
        f"## Token-patch extraction vs plain forward ({args.device})", "",
        f"Command: `{command('python benchmarks/bench_patches.py')}`  ",
        f"Machine: {machine(args.device)}; float32; median of 3 runs after 1 warm-up.", "",
        "Plain forward = TransformerBridge forward with logits. Patches = `token_patches` for every layer "
        "and token (one forward, hooks, stops before the unembedding). Peak memory = growth during the call "
        + ("(CUDA max allocated)." if args.device.startswith("cuda") else
           "(process RSS sampled every 2 ms, above its level at the start of the call; the allocator reuses "
           "memory freed by earlier calls, so this is the *new* memory a call needed, a lower bound)."), "",
        "| model | tokens | forward ms | patches ms | ratio | peak MB forward | peak MB patches |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {m} | {n} | {f*1e3:.1f} | {p*1e3:.1f} | {r:.2f} | {a:.0f} | {b:.0f} |" for m, n, f, p, r, a, b in rows]
    if naive_rows:
        lines += ["", "Naive method (one kept-only forward per query and per layer, earlier layers patched):", "",
                  "| model | tokens | naive s | one-pass s | speed-up | max norm difference (relative) |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {m} | {n} | {a:.1f} | {b:.3f} | {s:.0f}x | {d:.1e} |" for m, n, a, b, s, d in naive_rows]
    write_fragment(args.out, lines)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
