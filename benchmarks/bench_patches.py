"""Benchmark: all-layer x all-token patch extraction vs a plain forward, one prompt and many.

For each model and prompt length, in one run: time of a plain TransformerBridge forward
(with logits), time of ``token_patches`` (every layer and token, one forward, all factors)
and of ``patch_norms`` (norms only), their ratios, and peak memory; at 64 tokens also the
naive method (one kept-only forward per query and per layer, layers patched one by one).
Batched: ``--prompts`` prompts of about ``--prompt-tokens`` tokens (lengths vary, so rows
are padded): a loop of single-prompt ``token_patches`` vs ``patch_norms`` and
``token_patches`` in batches of ``--batch-size`` vs a batched plain forward with logits over
the same padded batches. Writes reports/bench_patches.md.

    python benchmarks/bench_patches.py [--device cuda] [--lengths 64 256 1024] [--models ...] [--prompts 64]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout root, for experiments.report
from common import peak_memory, prompt_ids, time_it  # noqa: E402

from experiments.report import command, machine, write_fragment  # noqa: E402
from icl_lens import load_model, patch_norms, token_patches  # noqa: E402
from icl_lens.model.patches import token_patches_naive  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--models", nargs="+", default=["gemma-3-270m", "smollm2-135m"])
    ap.add_argument("--naive-length", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=64, help="batched section: number of prompts (0 skips it)")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="batched section: longest prompt")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default="reports/bench_patches.md")
    args = ap.parse_args()
    rows, naive_rows, batched_rows = [], [], []
    for name in args.models:
        model = load_model(name, device=args.device)
        for n in args.lengths:
            ids = prompt_ids(model, n).to(args.device)
            with torch.no_grad():
                with peak_memory(args.device) as mem_fwd:
                    t_fwd = time_it(lambda: model(ids[None]), device=args.device)
                with peak_memory(args.device) as mem_patch:
                    t_patch = time_it(lambda: token_patches(model, ids), device=args.device)
                with peak_memory(args.device) as mem_norms:
                    t_norms = time_it(lambda: patch_norms(model, [ids], progress=False), device=args.device)
            rows.append((name, n, t_fwd, t_patch, t_patch / t_fwd, t_norms, t_norms / t_fwd, mem_fwd["mb"],
                         mem_patch["mb"], mem_norms["mb"]))
            print(f"{name:14s} {n:5d} tokens  forward {t_fwd*1e3:8.1f} ms  patches {t_patch*1e3:8.1f} ms  "
                  f"ratio {t_patch/t_fwd:5.2f}  norms {t_norms*1e3:8.1f} ms ratio {t_norms/t_fwd:5.2f}  "
                  f"peak MB fwd {mem_fwd['mb']:.0f} / patches {mem_patch['mb']:.0f} / norms {mem_norms['mb']:.0f}",
                  flush=True)
            if n == args.naive_length:
                start = time.perf_counter()
                naive = token_patches_naive(model, ids)
                fast = token_patches(model, ids)
                t_naive = time.perf_counter() - start
                rel = float((naive.norms() - fast.norms()).abs().max() / fast.norms().abs().max())  # noqa: E501
                naive_rows.append((name, n, t_naive, t_patch, t_naive / t_patch, rel))
                print(f"{name:14s} naive {t_naive:.1f} s vs one-pass {t_patch:.3f} s ({t_naive/t_patch:.0f}x); "
                      f"max norm difference {rel:.1e} (relative)", flush=True)
        if args.prompts:
            batched_rows.append(batched(model, name, args))
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
        "| model | tokens | forward ms | patches ms | ratio | norms ms | ratio | peak MB forward | peak MB patches | "
        "peak MB norms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {m} | {n} | {f*1e3:.1f} | {p*1e3:.1f} | {r:.2f} | {q*1e3:.1f} | {rq:.2f} | {a:.0f} | {b:.0f} | {c:.0f} |"
              for m, n, f, p, r, q, rq, a, b, c in rows]
    lines += ["", "Norms = `patch_norms` (norms only, no factors kept: `‖ΔW‖ = ‖Rδ‖/‖a‖` with `R` from the QR of "
              "the stacked dense weights, see `icl_lens/model/batches.py`)."]
    if batched_rows:
        lines += ["", f"Many prompts ({args.prompts} prompts of {args.prompt_tokens - 8}..{args.prompt_tokens} tokens, "
                  f"batches of {args.batch_size}, right-padded; loop = one `token_patches` call per prompt, once; "
                  "the others median of 3 after a warm-up):", "",
                  "| model | loop s | patch_norms s | speed-up vs loop | token_patches batched s | forward batched s | "
                  "patch_norms / forward |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {m} | {lp:.2f} | {nb:.2f} | {lp/nb:.2f}x | {tb:.2f} | {fb:.2f} | {nb/fb:.2f} |"
                  for m, lp, nb, tb, fb in batched_rows]
    if naive_rows:
        lines += ["", "Naive method (one kept-only forward per query and per layer, earlier layers patched):", "",
                  "| model | tokens | naive s | one-pass s | speed-up | max norm difference (relative) |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {m} | {n} | {a:.1f} | {b:.3f} | {s:.0f}x | {d:.1e} |" for m, n, a, b, s, d in naive_rows]
    write_fragment(args.out, lines)
    print(f"wrote {args.out}")


def batched(model, name: str, args) -> tuple:
    """Loop of single prompts vs batched patch_norms / token_patches vs a batched forward with logits."""
    from icl_lens.model.batches import prompt_batch

    base = prompt_ids(model, args.prompt_tokens + args.prompts + 8).to(args.device)
    lengths = [args.prompt_tokens - (i % 9) for i in range(args.prompts)]
    prompts = [torch.cat([base[:1], base[1 + i: i + n]]) for i, n in enumerate(lengths)]
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # the batches patch_norms forms
    batches = [prompt_batch(model, [prompts[i] for i in order[s: s + args.batch_size]])
               for s in range(0, len(order), args.batch_size)]

    def forward():
        with torch.no_grad():
            for b in batches:
                model(b.ids, attention_mask=b.attention_mask)

    t_loop = time_it(lambda: [token_patches(model, p) for p in prompts], device=args.device, repeats=1, warmup=0)
    t_norms = time_it(lambda: patch_norms(model, prompts, batch_size=args.batch_size, progress=False), device=args.device)
    t_tp = time_it(lambda: token_patches(model, prompts, batch_size=args.batch_size), device=args.device)
    t_fwd = time_it(forward, device=args.device)
    print(f"{name:14s} {args.prompts} prompts: loop {t_loop:.2f} s, patch_norms {t_norms:.2f} s "
          f"({t_loop/t_norms:.2f}x faster), token_patches batched {t_tp:.2f} s, forward batched {t_fwd:.2f} s "
          f"(norms/forward {t_norms/t_fwd:.2f})", flush=True)
    return name, t_loop, t_norms, t_tp, t_fwd


if __name__ == "__main__":
    main()
