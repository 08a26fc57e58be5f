"""One prepared GPU check (run by ``benchmarks/gpu_check.sh``): exactness and speed on CUDA, in one go.

Sections, each with its own numbers and a rule that reads them:

1. **Equivalence on the device**: the tiny models (every block family), the embedded
   models when their weights are on the machine, and random models of Gemma 3 270M's and
   SmolLM2-135M's exact shapes, in float32 (relative error ≤ 1e-4) and bfloat16 (error ≤
   twice the bfloat16-vs-float32 noise floor measured in the same run); batched rows vs
   single prompts.
2. **Long contexts**: a random model of Gemma 3 270M's shape at 1k, 4k and 16k tokens,
   float32 and bfloat16: plain forward with logits vs ``token_patches`` (δ, v, corrections;
   ``u`` on demand) vs ``patch_norms`` (norms only), median times, ratio, and the peak memory
   of one call of each in the same run (CUDA allocator peak counter reset per call).
3. **Batched throughput**: 64 prompts of 64 tokens: a loop of single-prompt
   ``token_patches`` vs ``patch_norms`` in batches vs a batched forward with logits.

It never downloads anything, prints progress, and stops starting sections once its time
budget is spent, writing what it has (``--budget`` seconds). ``--quick`` (CPU test mode)
shrinks every size.

    python benchmarks/gpu_check.py --device cuda --budget 270 --out reports/bench_gpu.md
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout root, for experiments.report
from common import measure, write_json  # noqa: E402

import icl_lens  # noqa: E402
from experiments.report import command, machine, write_fragment  # noqa: E402
from icl_lens.patches import noise_floor  # noqa: E402

GEMMA_270M = dict(
    vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
    layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3, max_position_embeddings=32768,
    rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
    rope_parameters={"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                     "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}},
)
SMOLLM2_135M = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
    rope_parameters={"rope_theta": 1e5, "rope_type": "default"},
)
QUICK_GEMMA = dict(GEMMA_270M, vocab_size=4096, hidden_size=64, intermediate_size=160, num_hidden_layers=6,
                   layer_types=["sliding_attention"] * 5 + ["full_attention"], head_dim=16, query_pre_attn_scalar=16,
                   sliding_window=32, max_position_embeddings=4096)
QUICK_SMOLLM = dict(SMOLLM2_135M, vocab_size=4096, hidden_size=72, intermediate_size=192, num_hidden_layers=4,
                    head_dim=8)


class Budget:
    def __init__(self, seconds: float):
        self.start, self.seconds = time.monotonic(), seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def allows(self, needed: float) -> bool:
        return self.left() >= needed


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def random_bridge(shape: dict, family: str, dtype: torch.dtype, device: str, name: str):
    """A seeded random model of ``shape`` as a bridge (byte tokenizer; ids are drawn at random).

    The same seed gives the same float32 weights for every dtype (the bridge wraps the HF
    modules in place, so each dtype gets its own freshly built model).
    """
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    from icl_lens.model import BOS_ID, EOS_ID, PAD_ID, save_byte_tokenizer
    from icl_lens.model import bridge_from_hf, cache_dir

    cls, cfg_cls = (Gemma3ForCausalLM, Gemma3TextConfig) if family == "gemma3" else (LlamaForCausalLM, LlamaConfig)
    cfg = cfg_cls(**shape, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    cfg.architectures = [cls.__name__]
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    with torch.device(device):
        hf = cls(cfg).eval().to(dtype)
    tok = save_byte_tokenizer(cache_dir() / "byte-tokenizer")
    return bridge_from_hf(hf, tok, name=name, dtype=dtype)


def random_ids(model, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(300, int(model.cfg.d_vocab), (n,), generator=g)
    ids[0] = model.tokenizer.bos_token_id
    return ids.to(model.cfg.device)


def timed(fn, device: str, repeats: int) -> tuple[float, float]:
    """Median seconds of ``fn()`` after one warm-up, and the peak memory of one more call above its start
    (MiB; CUDA allocator peak counter, or the process's reset VmHWM on CPU: :func:`common.peak_memory`)."""
    return measure(fn, device=device, repeats=repeats)


def equivalence_row(name: str, full, half, ids, results: dict) -> dict:
    """float32 identity, and the half model's identity against its own noise floor."""
    row = {"model": name, "tokens": int(ids.numel())}
    p32 = icl_lens.token_patches(full, ids)
    rep32 = icl_lens.verify_equivalence(full, ids, p32)
    row["fp32_relative_error"] = rep32.relative_error
    row["fp32_exact"] = rep32.relative_error <= 1e-4
    if half is not None:
        ph = icl_lens.token_patches(half, ids)
        reph = icl_lens.verify_equivalence(half, ids, ph)
        floor = noise_floor(half, full, ids)
        row["bf16_max_abs_err"] = float(reph.max_abs_err.max())
        row["bf16_floor"] = floor
        row["bf16_err_over_floor"] = row["bf16_max_abs_err"] / floor if floor > 0 else float("inf")
        row["bf16_exact"] = row["bf16_max_abs_err"] <= 2 * floor
    results.setdefault("equivalence", []).append(row)
    log(f"equivalence {name}: {row}")
    return row


def batched_row(name: str, model, ids_list, results: dict) -> None:
    batched = icl_lens.token_patches(model, ids_list, batch_size=len(ids_list))
    worst = 0.0
    for ids, got in zip(ids_list, batched):
        single = icl_lens.token_patches(model, ids)
        for field in ("delta", "u_in", "u_gate", "v", "correction"):
            a, b = getattr(got, field), getattr(single, field)
            if b is not None:
                worst = max(worst, float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)))
    results.setdefault("batched", []).append({"model": name, "prompts": len(ids_list), "max_relative_diff": worst,
                                              "within_1e-5": worst <= 1e-5})
    log(f"batched vs single {name}: max relative difference {worst:.2e}")


def section_equivalence(args, budget: Budget, results: dict) -> None:
    device, quick = args.device, args.quick
    n = 24 if quick else 64
    for name in ("tiny-gpt2", "tiny-llama", "tiny-gemma3"):
        full = icl_lens.load_model(name, device=device)
        half = icl_lens.load_model(name, device=device, dtype=torch.bfloat16)
        ids = full.to_tokens("In-context learning: the cat sat on the mat, then the cat sat on the hat.")[0]
        equivalence_row(name, full, half, ids.to(device), results)
        batched_row(name, full, [ids[:20].to(device), ids.to(device), ids[:7].to(device)], results)
    for name in ("gemma-3-270m", "smollm2-135m"):
        if quick or not budget.allows(150):
            results.setdefault("embedded", []).append({"model": name, "status": "not run (quick mode or time budget)"})
            continue
        try:
            full = icl_lens.load_model(name, device=device)
        except Exception as err:  # no package, no cache: say so, never download
            msg = str(err).splitlines()[0][:200]
            results.setdefault("embedded", []).append({"model": name, "status": f"weights not on this machine: {msg}"})
            log(f"{name}: not run ({msg})")
            continue
        half = icl_lens.load_model(name, device=device, dtype=torch.bfloat16)
        prompt = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
        ids = full.to_tokens(prompt)[0].to(device)
        equivalence_row(name, full, half, ids, results)
        results.setdefault("embedded", []).append({"model": name, "status": "run"})
        del full, half
    for label, shape, family in (("random Gemma 3 270M shape", QUICK_GEMMA if quick else GEMMA_270M, "gemma3"),
                                 ("random SmolLM2-135M shape", QUICK_SMOLLM if quick else SMOLLM2_135M, "llama")):
        if not budget.allows(30):
            break
        full = random_bridge(shape, family, torch.float32, device, label)
        half = random_bridge(shape, family, torch.bfloat16, device, label)
        ids = random_ids(full, n)
        equivalence_row(label, full, half, ids, results)
        batched_row(label, full, [ids, ids[: n // 2], ids[: n // 3]], results)
        del full, half
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def section_long_context(args, budget: Budget, results: dict) -> None:
    device, quick = args.device, args.quick
    shape = QUICK_GEMMA if quick else GEMMA_270M
    lengths = [64, 256] if quick else [1024, 4096, 16384]
    repeats = 1 if quick else 3
    for dtype in (torch.float32, torch.bfloat16):
        model = random_bridge(shape, "gemma3", dtype, device, "random Gemma 3 270M shape")
        for n in lengths:
            if not budget.allows(25 if not quick else 2):
                results.setdefault("skipped", []).append(f"long context {n} tokens {dtype} (time budget)")
                continue
            ids = random_ids(model, n, seed=n)
            with torch.no_grad():
                t_fwd, m_fwd = timed(lambda: model(ids[None]), device, repeats)
            t_patch, m_patch = timed(lambda: icl_lens.token_patches(model, ids), device, repeats)
            t_norms, m_norms = timed(lambda: icl_lens.patch_norms(model, [ids], progress=False), device, repeats)
            row = {"dtype": str(dtype).removeprefix("torch."), "tokens": n, "forward_ms": t_fwd * 1e3,
                   "patches_ms": t_patch * 1e3, "norms_ms": t_norms * 1e3, "patches_ratio": t_patch / t_fwd,
                   "norms_ratio": t_norms / t_fwd, "peak_mib_forward": m_fwd, "peak_mib_patches": m_patch,
                   "peak_mib_norms": m_norms}
            results.setdefault("long_context", []).append(row)
            log(f"long context {row}")
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        del model


def section_throughput(args, budget: Budget, results: dict) -> None:
    device, quick = args.device, args.quick
    n_prompts, n_tokens = (8, 16) if quick else (64, 64)
    shape = QUICK_GEMMA if quick else GEMMA_270M
    for dtype in (torch.float32, torch.bfloat16):
        if not budget.allows(20 if not quick else 2):
            results.setdefault("skipped", []).append(f"throughput {dtype} (time budget)")
            continue
        model = random_bridge(shape, "gemma3", dtype, device, "random Gemma 3 270M shape")
        prompts = [random_ids(model, n_tokens, seed=i) for i in range(n_prompts)]
        stacked = torch.stack(prompts)
        repeats = 1 if quick else 3
        t_loop, _ = timed(lambda: [icl_lens.token_patches(model, p) for p in prompts], device, 1)
        t_norms, m_norms = timed(lambda: icl_lens.patch_norms(model, prompts, batch_size=n_prompts, progress=False),
                                 device, repeats)
        t_tp, m_tp = timed(lambda: icl_lens.token_patches(model, prompts, batch_size=n_prompts), device, repeats)
        with torch.no_grad():
            t_fwd, m_fwd = timed(lambda: model(stacked), device, repeats)
        row = {"dtype": str(dtype).removeprefix("torch."), "prompts": n_prompts, "tokens": n_tokens,
               "loop_single_s": t_loop, "patch_norms_s": t_norms, "token_patches_batched_s": t_tp,
               "forward_batched_s": t_fwd, "norms_vs_loop_speedup": t_loop / t_norms,
               "norms_vs_forward_ratio": t_norms / t_fwd, "prompts_per_s_norms": n_prompts / t_norms,
               "peak_mib_norms": m_norms, "peak_mib_token_patches": m_tp, "peak_mib_forward": m_fwd}
        results.setdefault("throughput", []).append(row)
        log(f"throughput {row}")
        del model


def _fmt(x, spec=".3g") -> str:
    return "n/a" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def shell_command(args) -> str:
    env = [f"DEVICE={args.device}"] + (["ICL_LENS_GPU_CHECK_QUICK=1"] if args.quick else [])
    return " ".join(env + ["bash benchmarks/gpu_check.sh"])


def render(args, results: dict, started: float) -> list[str]:
    lines = [f"## GPU check ({args.device}{', quick mode' if args.quick else ''})", "",
             f"Command: `{shell_command(args) if args.shell else command('python benchmarks/gpu_check.py')}`  ",
             f"Machine: {results.get('machine', machine(args.device))}; versions: {results.get('versions')}; "
             f"wall time {time.monotonic() - started:.0f} s of a {args.budget:.0f} s budget.", ""]
    eq = results.get("equivalence", [])
    if eq:
        lines += ["### Equivalence on the device", "",
                  "float32: relative error of the patched kept-only logits (rule: ≤ 1e-4). bfloat16: max |logit "
                  "difference| of the patched kept-only forward vs the bfloat16 contextual forward, and the noise "
                  "floor max |bfloat16 − float32 contextual logits| from the same run (rule: error ≤ 2 × floor).", "",
                  "| model | tokens | fp32 rel. error | fp32 exact | bf16 error | bf16 floor | error / floor | bf16 exact |",
                  "|---|---:|---:|---|---:|---:|---:|---|"]
        for r in eq:
            lines.append(f"| {r['model']} | {r['tokens']} | {_fmt(r['fp32_relative_error'], '.1e')} | "
                         f"{'yes' if r['fp32_exact'] else 'NO'} | {_fmt(r.get('bf16_max_abs_err'))} | "
                         f"{_fmt(r.get('bf16_floor'))} | {_fmt(r.get('bf16_err_over_floor'), '.2f')} | "
                         f"{'yes' if r.get('bf16_exact') else 'NO'} |")
        lines.append("")
    for e in results.get("embedded", []):
        lines.append(f"- Embedded {e['model']}: {e['status']}.")
    if results.get("embedded"):
        lines.append("")
    if results.get("batched"):
        lines += ["Batched rows vs single prompts (float32, max relative difference over delta, u_in, u_gate, v, "
                  "correction; rule: ≤ 1e-5):", ""]
        lines += [f"- {b['model']}: {b['prompts']} prompts, {_fmt(b['max_relative_diff'], '.1e')} "
                  f"({'within' if b['within_1e-5'] else 'NOT within'} 1e-5)" for b in results["batched"]]
        lines.append("")
    lc = results.get("long_context", [])
    if lc:
        lines += ["### Long contexts (random model of Gemma 3 270M's shape)", "",
                  "Forward = plain forward with logits. Patches = `token_patches` (all layers × tokens; δ, v, corrections "
                  "kept, u on demand). Norms = `patch_norms` (norms only). Median of 3 after a warm-up; peak = memory "
                  "growth of one more call of each, in the same run (CUDA allocator peak counter reset before the "
                  "call, or the process's reset VmHWM on CPU).", "",
                  "| dtype | tokens | forward ms | patches ms | ratio | norms ms | ratio | peak MiB fwd | peak MiB patches | peak MiB norms |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in lc:
            lines.append(f"| {r['dtype']} | {r['tokens']} | {r['forward_ms']:.1f} | {r['patches_ms']:.1f} | "
                         f"{r['patches_ratio']:.2f} | {r['norms_ms']:.1f} | {r['norms_ratio']:.2f} | "
                         f"{_fmt(r['peak_mib_forward'], '.0f')} | {_fmt(r['peak_mib_patches'], '.0f')} | "
                         f"{_fmt(r['peak_mib_norms'], '.0f')} |")
        worst = max(r["patches_ratio"] for r in lc)
        lines += ["", f"Targets read from the table: patches ≤ 1.0× forward at every length and dtype: "
                      f"{'met' if worst <= 1.0 else 'not met'} (worst ratio {worst:.2f})."]
        top = [r for r in lc if r["dtype"] == "bfloat16" and r["tokens"] == max(x["tokens"] for x in lc)]
        if top and not args.quick:
            lines.append(f"bfloat16 at {top[0]['tokens']} tokens: patches {top[0]['patches_ms']:.1f} ms "
                         f"({'under' if top[0]['patches_ms'] < 150 else 'not under'} the 150 ms target).")
        lines.append("")
    tp = results.get("throughput", [])
    if tp:
        lines += ["### Batched throughput (random model of Gemma 3 270M's shape)", "",
                  "| dtype | prompts × tokens | loop of single token_patches s | patch_norms batched s | "
                  "token_patches batched s | forward batched s | norms vs loop | norms / forward | prompts/s (norms) |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in tp:
            lines.append(f"| {r['dtype']} | {r['prompts']} × {r['tokens']} | {r['loop_single_s']:.3f} | "
                         f"{r['patch_norms_s']:.3f} | {r['token_patches_batched_s']:.3f} | {r['forward_batched_s']:.3f} | "
                         f"{r['norms_vs_loop_speedup']:.1f}× | {r['norms_vs_forward_ratio']:.2f} | "
                         f"{r['prompts_per_s_norms']:.0f} |")
        lines.append("")
    for s in results.get("skipped", []):
        lines.append(f"- Not run: {s}.")
    for e in results.get("errors", []):
        lines.append(f"- Error in {e['section']}: `{e['error']}`")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", type=float, default=270.0, help="seconds; no section starts after that")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CPU test mode)")
    ap.add_argument("--out", default="reports/bench_gpu.md")
    ap.add_argument("--shell", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    started = time.monotonic()
    budget = Budget(args.budget)
    from icl_lens.model import check_device

    check_device(args.device)
    results: dict = {"machine": machine(args.device)}
    from importlib.metadata import version

    results["versions"] = {p: version(p) for p in ("torch", "transformers", "transformer-lens")}
    log(f"start on {results['machine']} {results['versions']}")
    outs = [Path(args.out)] + ([Path(os.environ["OUT"]) / Path(args.out).name] if os.environ.get("OUT") else [])

    def flush() -> None:
        lines = render(args, results, started)
        for path in outs:
            write_fragment(path, lines)
            write_json(path, results)

    for name, fn in (("equivalence", section_equivalence), ("long contexts", section_long_context),
                     ("throughput", section_throughput)):
        log(f"section {name} ({budget.left():.0f} s left)")
        try:
            fn(args, budget, results)
        except Exception as err:  # keep going: a later section may still run
            traceback.print_exc()
            text = " ".join(f"{type(err).__name__}: {err}".split())[:300]
            results.setdefault("errors", []).append({"section": name, "error": text})
        flush()
    log(f"done in {time.monotonic() - started:.0f} s; wrote {', '.join(map(str, outs))}")


if __name__ == "__main__":
    main()
