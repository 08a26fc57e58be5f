"""Benchmark: all-layer x all-token patch extraction vs a plain forward, one prompt and many.

For each model and prompt length, in one run: time of a plain TransformerBridge forward
(with logits), time of ``token_patches`` (every layer and token, one forward; δ, v and
corrections kept, ``u`` on demand) and of ``patch_norms`` (norms only), their ratios, and
the peak memory of each call (allocator peak on CUDA, reset VmHWM on CPU); at 64 tokens also the
naive method (one kept-only forward per query and per layer, layers patched one by one).
Batched: ``--prompts`` prompts of about ``--prompt-tokens`` tokens (lengths vary, so rows
are padded): a loop of single-prompt ``token_patches`` vs ``patch_norms`` and
``token_patches`` in batches of ``--batch-size`` vs a batched plain forward with logits over
the same padded batches. Writes reports/bench_patches.md and reports/bench_patches.json.

``--floor`` also times the work the definitions ask for without the capture, and ``--ops`` lists, operator by
operator (torch.profiler), what the capture does beyond it.

    python benchmarks/bench_patches.py [--device cuda] [--lengths 64 256 1024] [--models ...] [--prompts 64]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout root, for experiments.report
from common import (CLOCKS, flops, measure, op_difference, op_times, peak_memory, prompt_ids, time_it,  # noqa: E402
                    time_rounds, write_json)

from experiments.report import command, load_average, machine, write_fragment  # noqa: E402
from icl_lens import load_model, patch_norms, token_patches  # noqa: E402
from icl_lens.core import bos_and_self_output, input_pseudo_inverse  # noqa: E402
from icl_lens.model import activations_captured, block_family  # noqa: E402
from icl_lens.patches import QUERY_CHUNK, token_patches_naive  # noqa: E402


def read_sites(model) -> list[str]:
    """The hook points ``token_patches`` reads, five per layer: residual, values, scores, attention output, MLP
    input."""
    family = block_family(model)
    return [site for layer in range(model.cfg.n_layers)
            for site in (family.resid_pre(layer), family.values(layer), family.scores(layer),
                         family.attn_out(layer), family.mlp_input(layer))]


def floor_calls(model, ids):
    """The work the definitions ask for, without the capture: the contextual pass stopped where the patches stop
    (after the last block's MLP input, no hook reading anything; a prompt longer than ``QUERY_CHUNK`` in the same
    forwards of that many queries over a key/value cache as ``token_patches`` runs), and each layer's two
    context-free pieces on tensors of the prompt's shape (the kept-only attention output ``attn_0`` through the
    output projection and any post-attention norm, and the MLP input ``a`` through the block's norm).

    Two more, for the floor of a capture through hook points: *read*, the same stopped pass with a hook doing
    nothing at each of the five sites per layer the capture reads (residual, values, scores, attention output,
    MLP input: what reading them through TransformerLens's hook points costs), and *element-wise*, each layer's
    element-wise work of the definitions on tensors of the prompt's (or chunk's) shape, written into the result's
    buffers (``z⁰`` renormalised over the BOS and the query itself from the scores and values, ``δ = A − a``,
    ``v = a/‖a‖²``, ``correction = attn_C − attn_0``)."""
    family, cfg = block_family(model), model.cfg
    last = family.mlp_input(cfg.n_layers - 1)
    n, d, dtype, device = ids.numel(), cfg.d_model, cfg.dtype, ids.device
    z0 = torch.randn(n, cfg.n_heads, cfg.d_head, dtype=dtype, device=device)
    r = torch.randn(n, d, dtype=dtype, device=device)
    step = QUERY_CHUNK if n > QUERY_CHUNK else n
    reads = [(site, lambda x, hook: None) for site in read_sites(model)]

    def pass_with(hooks):
        cache = DynamicCache() if n > step else None
        for start in range(0, n, step):
            with activations_captured(model, hooks, stop_after=last):
                model(ids[None, start:start + step], past_key_values=cache, return_type=None)

    def stopped():
        pass_with([(last, lambda x, hook: None)])

    def pieces():
        for layer in range(cfg.n_layers):
            block = model.blocks[layer]
            attn_0 = family.kept_attention_output(block, z0)
            family.context_free_mlp_input(block, r, attn_0, r)

    kv_heads = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    scores = torch.randn(1, cfg.n_heads, step, step, dtype=dtype, device=device)
    values = torch.randn(1, step, kv_heads, cfg.d_head, dtype=dtype, device=device)
    A, a, attn_C, attn_0 = (torch.randn(n, d, dtype=dtype, device=device) for _ in range(4))

    def elementwise():
        delta, v, correction = (torch.empty(cfg.n_layers, n, d, dtype=dtype, device=device) for _ in range(3))
        for layer in range(cfg.n_layers):
            for start in range(0, n, step):
                bos_and_self_output(scores, values, keep_bos=True)
            torch.sub(A, a, out=delta[layer])
            v[layer] = input_pseudo_inverse(a)[0]
            torch.sub(attn_C, attn_0, out=correction[layer])
    return stopped, pieces, lambda: pass_with(reads), elementwise


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--models", nargs="*", default=["gemma-3-270m", "smollm2-135m"],
                    help="embedded or tiny models (tiny-gpt2, tiny-llama, tiny-gemma3, ...: every block family)")
    ap.add_argument("--tiny-models", nargs="*", default=[],
                    help="more models measured at --tiny-lengths only (e.g. one tiny model per block family)")
    ap.add_argument("--tiny-lengths", type=int, nargs="+", default=[64])
    ap.add_argument("--naive-length", type=int, default=64, help="prompt length of the naive check (0 skips it)")
    ap.add_argument("--prompts", type=int, default=64, help="batched section: number of prompts (0 skips it)")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="batched section: longest prompt")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs (median), after --warmup runs")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--clock", choices=["cpu", "wall"], default=None,
                    help="cpu: the process's CPU time (default on CPU: a shared machine's other jobs hardly "
                         "inflate it); wall: wall time (default on GPU)")
    ap.add_argument("--floor", action="store_true",
                    help="also time the definitions' work without the capture (the stopped contextual pass and the "
                         "context-free pieces): the floor the patches' ratio is read against")
    ap.add_argument("--ops", action="store_true",
                    help="with --floor: profile one call of the patches and one of stopped + pieces (torch.profiler) "
                         "and list the operators whose self time differs most: what the capture does beyond them")
    ap.add_argument("--out", default="reports/bench_patches.md")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's own, every core); the report's machine line says which")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock is None:
        args.clock = "wall" if args.device.startswith("cuda") else "cpu"
    load_before = load_average()
    rows, naive_rows, batched_rows = [], [], []
    runs = [(name, args.lengths) for name in args.models] + [(name, args.tiny_lengths) for name in args.tiny_models]
    for name, lengths in runs:
        model = load_model(name, device=args.device)
        for n in lengths:
            ids = prompt_ids(model, n).to(args.device)
            with torch.no_grad():
                rep = dict(device=args.device, repeats=args.repeats, warmup=args.warmup, clock=args.clock)
                t_fwd, m_fwd = measure(lambda: model(ids[None]), **rep)
                t_patch, m_patch = measure(lambda: token_patches(model, ids), **rep)
                t_norms, m_norms = measure(lambda: patch_norms(model, [ids], progress=False), **rep)
                floor = {}
                if args.floor:  # the four timed again in rounds (a drifting load falls on all alike)
                    stopped, pieces, read, elementwise = floor_calls(model, ids)
                    t = time_rounds({"forward": lambda: model(ids[None]), "stopped": stopped, "pieces": pieces,
                                     "read": read, "elementwise": elementwise,
                                     "patches": lambda: token_patches(model, ids)}, **rep)
                    with peak_memory(args.device) as mem_stopped:
                        stopped()
                    held = token_patches(model, ids)
                    factors_mib = sum(x.numel() * x.element_size() for x in (held.delta, held.v, held.correction))
                    del held
                    floor = {"rounds_forward_s": t["forward"], "rounds_patches_s": t["patches"],
                             "peak_mib_stopped": mem_stopped["mb"], "factors_mib": factors_mib / 2**20,
                             "memory_over_floor": m_patch / (mem_stopped["mb"] + factors_mib / 2**20),
                             "stopped_s": t["stopped"], "pieces_s": t["pieces"],
                             "floor_ratio": (t["stopped"] + t["pieces"]) / t["forward"],
                             "rounds_patches_ratio": t["patches"] / t["forward"],
                             "over_floor": t["patches"] / (t["stopped"] + t["pieces"]),
                             "read_s": t["read"], "elementwise_s": t["elementwise"],
                             "read_floor_ratio": (t["read"] + t["pieces"] + t["elementwise"]) / t["forward"],
                             "over_read_floor": t["patches"] / (t["read"] + t["pieces"] + t["elementwise"])}
                    if args.ops:
                        ours = op_times(lambda: token_patches(model, ids), args.device)
                        theirs = op_times(lambda: (stopped(), pieces()), args.device)
                        floor.update({"ops": op_difference(ours, theirs), "ops_s": sum(v[0] for v in ours.values()),
                                      "ops_floor_s": sum(v[0] for v in theirs.values())})
            f_fwd, f_patch = flops(lambda: model(ids[None])), flops(lambda: token_patches(model, ids))
            rows.append({"model": name, "tokens": n, "forward_s": t_fwd, "patches_s": t_patch,
                         "patches_ratio": t_patch / t_fwd, "norms_s": t_norms, "norms_ratio": t_norms / t_fwd,
                         "peak_mib_forward": m_fwd, "peak_mib_patches": m_patch, "peak_mib_norms": m_norms,
                         "flops_forward": f_fwd, "flops_patches": f_patch, "flops_ratio": f_patch / f_fwd,
                         "load_average": load_average(), **floor})
            print(f"{name:14s} {n:5d} tokens  forward {t_fwd*1e3:8.1f} ms  patches {t_patch*1e3:8.1f} ms  "
                  f"ratio {t_patch/t_fwd:5.2f} (arithmetic {f_patch/f_fwd:4.2f})  norms {t_norms*1e3:8.1f} ms ratio {t_norms/t_fwd:5.2f}  "
                  f"peak MiB fwd {m_fwd:.0f} / patches {m_patch:.0f} / norms {m_norms:.0f}  "
                  f"(load {load_average():.1f})", flush=True)
            write(args, load_before, rows, batched_rows, naive_rows)  # what is measured so far, never lost
            if n == args.naive_length:
                start = CLOCKS[args.clock]()
                naive = token_patches_naive(model, ids)
                t_naive = CLOCKS[args.clock]() - start
                fast = token_patches(model, ids)
                diff = float((naive.norms() - fast.norms()).abs().max())
                # relative to the larger method's largest norm: a parallel block's patches are exactly 0
                # one-pass and rounding noise naively, so neither alone is a scale
                scale = max(float(naive.norms().abs().max()), float(fast.norms().abs().max()))
                rel = diff / scale if scale > 0 else 0.0
                naive_rows.append({"model": name, "tokens": n, "naive_s": t_naive, "one_pass_s": t_patch,
                                   "speed_up": t_naive / t_patch, "max_norm_abs_diff": diff,
                                   "max_norm_rel_diff": rel, "max_norm": scale})
                print(f"{name:14s} naive {t_naive:.1f} s vs one-pass {t_patch:.3f} s ({t_naive/t_patch:.0f}x); "
                      f"max norm difference {rel:.1e} (relative)", flush=True)
        if args.prompts and name in args.models:
            batched_rows.append(batched(model, name, args))
        del model
    write(args, load_before, rows, batched_rows, naive_rows)
    print(f"wrote {args.out} and its .json")


def write(args, load_before: float, rows: list, batched_rows: list, naive_rows: list) -> None:
    """The Markdown fragment and its JSON, from the rows measured so far (written after every row)."""
    cuda = args.device.startswith("cuda")
    lines = [
        f"## Token-patch extraction vs plain forward ({args.device}; {', '.join(map(str, args.lengths))} tokens)", "",
        f"Command: `{command('python benchmarks/bench_patches.py')}`  ",
        f"Machine: {machine(args.device, load_before)}; float32; median of {args.repeats} run(s) after "
        f"{args.warmup} warm-up(s). Times are "
        + ("the process's CPU time over all its threads (`time.process_time`), which other jobs on a shared "
           "machine inflate far less than wall time. " if args.clock == "cpu" else "wall time. ")
        + "Ratios are within one run; each row's load average is in the JSON.", "",
        "Plain forward = TransformerBridge forward with logits. Patches = `token_patches` for every layer "
        "and token (one forward, hooks, stops before the unembedding; keeps δ, v and the correction, "
        "`u = Wδ` is formed only when asked for). Peak = memory growth during one more call, measured "
        "in the same run for the forward, the patches and the norms: "
        + ("the CUDA allocator's peak counter, reset before the call, above the memory allocated at its start."
           if cuda else
           "the process's peak resident set (VmHWM) reset before the call (`/proc/self/clear_refs`, after "
           "`malloc_trim`), above the resident set at its start. tracemalloc cannot see torch's CPU tensors."), "",
        f"| model | tokens | forward ms ({args.clock}) | patches ms | ratio | norms ms | ratio | peak MiB forward | peak MiB patches | "
        "peak MiB norms | arithmetic ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {r['model']} | {r['tokens']} | {r['forward_s']*1e3:.1f} | {r['patches_s']*1e3:.1f} | "
              f"{r['patches_ratio']:.2f} | {r['norms_s']*1e3:.1f} | {r['norms_ratio']:.2f} | "
              f"{r['peak_mib_forward']:.0f} | {r['peak_mib_patches']:.0f} | {r['peak_mib_norms']:.0f} | {r['flops_ratio']:.3f} |" for r in rows]
    lines += ["", "Arithmetic ratio = matrix-product operations of `token_patches` / those of the forward (element-wise "
              "operations are not counted), counted by torch's `FlopCounterMode` in the same run: what the ratio would be if time followed arithmetic alone. "
              "The patches need every layer's contextual attention and every MLP but the last, plus the kept-only "
              "attention output (its output projection once more per layer); they skip the unembedding and the "
              "last MLP. A prompt longer than `QUERY_CHUNK` "
              f"({QUERY_CHUNK}) tokens runs in forwards of that many queries over a key/value cache, which skip the "
              "masked upper triangle of scores the forward computes: its arithmetic ratio falls with the length. A "
              "time ratio above the arithmetic ratio is overhead (hooks, small tensor operations); below it "
              "would take less arithmetic than the definitions ask for."]
    floors = [r for r in rows if "stopped_s" in r]
    if floors:
        lines += ["", "**Against the work the definitions ask for** (`--floor`, same run; forward, stopped, pieces and "
                  "patches timed again in rounds, one call of each per round, medians): *stopped* = the contextual "
                  "pass alone, stopped where the patches stop (after the last block's MLP input, no hook reading "
                  "anything; past the chunk, in the same chunks over a key/value cache); *pieces* = each layer's "
                  "context-free pieces (`attn_0` through the output projection and any post-attention norm, `a` through the block's norm) on tensors of the prompt's shape; *floor* = "
                  "(stopped + pieces) / forward, the ratio no capture can go below on this implementation of "
                  "attention (the bridge's eager attention: its mask, scaling and softmax over n² scores are "
                  "element-wise work the forward does too, which the arithmetic ratio does not count). The target "
                  "`≤ 1.05 × arithmetic ratio` is out of reach where the floor is above it. Memory the same way: "
                  "*peak stopped* = the stopped pass's growth (measured like the others), *factors* = the bytes of "
                  "what the result keeps (δ, v and the correction of every layer and position); no capture can grow "
                  "less than their sum.", "",
                  "A capture that reads through hook points pays two more: *read* = the stopped pass with a hook "
                  "doing nothing at each of the five sites per layer the capture reads (residual, values, scores, "
                  "attention output, MLP input), *element-wise* = each layer's element-wise work of the definitions on "
                  "tensors of the prompt's shape, written into the result's buffers (`z⁰` over the BOS and the query "
                  "from the scores and values, `δ = A − a`, `v = a/‖a‖²`, `correction = attn_C − attn_0`); *floor "
                  "with reads* = (read + pieces + element-wise) / forward. What the patches take beyond it is the "
                  "capture's own: its Python per layer, the finite checks, the rows' bookkeeping.", "",
                  "| model | tokens | forward ms | stopped ms | pieces ms | floor | read ms | element-wise ms | floor "
                  "with reads | 1.05 × arithmetic | patches ratio | patches / (stopped + pieces) | patches / (read + "
                  "pieces + element-wise) | peak MiB stopped | factors MiB | peak MiB patches / (stopped + factors) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['model']} | {r['tokens']} | {r['rounds_forward_s']*1e3:.1f} | {r['stopped_s']*1e3:.1f} | "
                  f"{r['pieces_s']*1e3:.1f} | {r['floor_ratio']:.3f} | {r['read_s']*1e3:.1f} | "
                  f"{r['elementwise_s']*1e3:.1f} | {r['read_floor_ratio']:.3f} | {1.05 * r['flops_ratio']:.3f} | "
                  f"{r['rounds_patches_ratio']:.3f} | {r['over_floor']:.3f} | {r['over_read_floor']:.3f} | "
                  f"{r['peak_mib_stopped']:.0f} | {r['factors_mib']:.0f} | {r['memory_over_floor']:.3f} |"
                  for r in floors]
    for r in (r for r in floors if "ops" in r):
        gap = r["ops_s"] - r["ops_floor_s"]
        lines += ["", f"Operators, {r['model']} at {r['tokens']} tokens (`--ops`: torch.profiler, one call each, self "
                  f"time): the patches {r['ops_s']*1e3:.0f} ms, stopped + pieces {r['ops_floor_s']*1e3:.0f} ms, "
                  f"{gap*1e3:+.0f} ms ({gap / r['ops_floor_s']:+.1%}); the operators that differ most (one call each: "
                  f"an operator called as often on both sides, at another time, shows the run's variation):", "",
                  "| operator | patches ms (calls) | stopped + pieces ms (calls) | difference ms |",
                  "|---|---:|---:|---:|"]
        lines += [f"| `{o['op']}` | {o['seconds']*1e3:.1f} ({o['calls']}) | {o['seconds_other']*1e3:.1f} "
                  f"({o['calls_other']}) | {(o['seconds'] - o['seconds_other'])*1e3:+.1f} |" for o in r["ops"]]
    lines += ["", "Norms = `patch_norms` (norms only, no factors kept: `‖ΔW‖ = ‖Rδ‖/‖a‖` with `R` from the QR of "
              "the stacked dense weights, see `icl_lens/patches/_batches.py`; `TokenPatches.norms` uses the same `R`)."]
    if batched_rows:
        lines += ["", f"Many prompts ({args.prompts} prompts of {args.prompt_tokens - 8}..{args.prompt_tokens} tokens, "
                  f"batches of {args.batch_size}, right-padded; loop = one `token_patches` call per prompt, once; "
                  "the others median of 3 after a warm-up; same clock as above):", "",
                  "| model | loop s | patch_norms s | speed-up vs loop | token_patches batched s | forward batched s | "
                  "patch_norms / forward |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {b['model']} | {b['loop_s']:.2f} | {b['norms_s']:.2f} | {b['loop_s']/b['norms_s']:.2f}x | "
                  f"{b['token_patches_s']:.2f} | {b['forward_s']:.2f} | {b['norms_s']/b['forward_s']:.2f} |"
                  for b in batched_rows]
    if naive_rows:
        lines += ["", "Naive method (one kept-only forward per query and per layer, earlier layers patched):", "",
                  "| model | tokens | naive s | one-pass s | speed-up | largest norm | max norm difference | relative |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['model']} | {r['tokens']} | {r['naive_s']:.1f} | {r['one_pass_s']:.3f} | {r['speed_up']:.0f}x | "
                  f"{r['max_norm']:.1e} | {r['max_norm_abs_diff']:.1e} | {r['max_norm_rel_diff']:.1e} |" for r in naive_rows]
        lines += ["", "Relative = max difference / the larger method's largest norm. A parallel block (gpt-neox) "
                  "has patches exactly 0 (its MLP reads the same norm as attention, docs/design.md); the naive "
                  "method's are rounding noise there."]
    write_fragment(args.out, lines)
    write_json(args.out, {"command": command("python benchmarks/bench_patches.py"),
                          "machine": machine(args.device, load_before), "device": args.device, "clock": args.clock,
                          "load_average_before": load_before, "load_average_after": load_average(),
                          "single": rows, "batched": batched_rows, "naive": naive_rows})


def batched(model, name: str, args) -> tuple:
    """Loop of single prompts vs batched patch_norms / token_patches vs a batched forward with logits."""
    from icl_lens.patches import prompt_batch

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

    timed = dict(device=args.device, clock=args.clock)
    t_loop = time_it(lambda: [token_patches(model, p) for p in prompts], repeats=1, warmup=0, **timed)
    t_norms = time_it(lambda: patch_norms(model, prompts, batch_size=args.batch_size, progress=False), **timed)
    t_tp = time_it(lambda: token_patches(model, prompts, batch_size=args.batch_size), **timed)
    t_fwd = time_it(forward, **timed)
    print(f"{name:14s} {args.prompts} prompts: loop {t_loop:.2f} s, patch_norms {t_norms:.2f} s "
          f"({t_loop/t_norms:.2f}x faster), token_patches batched {t_tp:.2f} s, forward batched {t_fwd:.2f} s "
          f"(norms/forward {t_norms/t_fwd:.2f})", flush=True)
    return {"model": name, "loop_s": t_loop, "norms_s": t_norms, "token_patches_s": t_tp, "forward_s": t_fwd}


if __name__ == "__main__":
    main()
