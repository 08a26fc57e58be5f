"""Benchmark: fit a thought patch from 32 calibration queries on Gemma 3 270M (CPU).

``python benchmarks/bench_thought.py [--model gemma-3-270m] [--task capitals] [--threads 1]``
writes ``reports/bench_thought.md`` (at all cores: ``--threads 2 --out reports/bench_thought_all_cores.md`` on a
2-core machine). Baselines measured in the same run on the same batch
(the 32 contextual prompts ``[BOS] + instruction + query``, right-padded): one plain
forward with logits, and the same forward with ``return_type=None``. Peak memory is the
growth of the process's peak resident set (VmHWM) during a call, reset before it (benchmarks/common.py).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout root, for experiments.report
from common import peak_memory, write_json  # noqa: E402
from experiments.report import load_average, machine, write_fragment  # noqa: E402
from icl_lens import load_model, load_task, thought_patch  # noqa: E402
from icl_lens.thought import preserve_texts  # noqa: E402
from icl_lens.model import activations_captured, pad_id, right_padded  # noqa: E402
from icl_lens.thought import continuation_ids, query_batch, text_ids  # noqa: E402
from icl_lens.thought import DEFAULT_ANSWER_TOKENS  # noqa: E402


OUT, OUT_ALL_CORES = "reports/bench_thought.md", "reports/bench_thought_all_cores.md"


def _measure(fn, repeats: int) -> tuple[float, float]:
    """Best wall time of ``repeats`` calls and the largest peak memory growth of one call (:func:`common.peak_memory`)."""
    best, peak = float("inf"), 0.0
    for _ in range(repeats):
        with peak_memory() as mem:
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        peak = max(peak, mem["mb"])
    return best, peak


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--task", default="capitals")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=OUT, help=f"the fragment ({OUT}; at all cores: {OUT_ALL_CORES})")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = load_average()
    model = load_model(args.model)
    task = load_task(args.task)
    queries = [q for q, _ in task.train[: args.n]]
    q_ids = [text_ids(model, q) for q in queries]
    batch = query_batch(model, q_ids, prefix=text_ids(model, task.instruction))
    ids = right_padded(batch.sequences, pad_id(model), model.cfg.device)
    with torch.no_grad():
        t_logits, m_logits = _measure(lambda: model(ids), args.repeats)
        t_nolog, m_nolog = _measure(lambda: model(ids, return_type=None), args.repeats)
    # What the default fit cannot avoid, each timed alone: the model's greedy answers under the instruction (the fit
    # takes its contextual reads in the same run) and one forward over the preserve texts (stopped after the last
    # block), with the preserve covariances of every layer; and, for comparison, the contextual pass over the batch
    # with the answers that the fit ran before issue 41 took the reads from the greedy run.
    instr = text_ids(model, task.instruction)
    answers = continuation_ids(model, instr, q_ids, DEFAULT_ANSWER_TOKENS)
    ctx = query_batch(model, [q + a for q, a in zip(q_ids, answers)], prefix=instr)
    keep = [text_ids(model, t) for t in preserve_texts(model)]
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"

    def stopped(batch, size):
        for start in range(0, len(batch.sequences), size):
            chunk = right_padded(batch.sequences[start:start + size], pad_id(model), model.cfg.device)
            with torch.no_grad(), activations_captured(model, [last], stop_after=last):
                model(chunk, return_type=None)

    t_greedy, _ = _measure(lambda: continuation_ids(model, instr, q_ids, DEFAULT_ANSWER_TOKENS), args.repeats)
    t_ctx, _ = _measure(lambda: stopped(ctx, 16), args.repeats)
    t_keep, _ = _measure(lambda: stopped(query_batch(model, keep), 4), args.repeats)
    n_keep_tokens = sum(map(len, keep))
    cov_flops = 2 * n_keep_tokens * model.cfg.n_layers * (model.cfg.d_model ** 2 + model.cfg.d_mlp ** 2)
    # The default fit twice: cold (the preserve covariances computed and written to an empty disk cache before every
    # call) and warm (read back from it: icl_lens.thought._preserved_keys), the same patch either way.
    cache = Path(tempfile.mkdtemp(prefix="bench_thought_"))
    os.environ["ICL_LENS_PRESERVE_CACHE"] = str(cache)

    def cold():
        shutil.rmtree(cache, ignore_errors=True)
        return thought_patch(model, task.instruction, queries)

    t_fit, m_fit = _measure(cold, args.repeats)
    t_warm, m_warm = _measure(lambda: thought_patch(model, task.instruction, queries), args.repeats)
    cache_mib = sum(f.stat().st_size for f in cache.rglob("*.pt")) / 2**20
    shutil.rmtree(cache, ignore_errors=True)
    t_np, m_np = _measure(lambda: thought_patch(model, task.instruction, queries, preserve=()), args.repeats)
    t_q, m_q = _measure(lambda: thought_patch(model, task.instruction, queries, preserve=(), answer_tokens=0),
                        args.repeats)
    n_keep = len(preserve_texts(model))
    # the default fit's rows: every query token and every token of the model's own answer
    rows = batch.n_tokens + sum(map(len, continuation_ids(model, text_ids(model, task.instruction), q_ids,
                                                          DEFAULT_ANSWER_TOKENS)))
    lines = [
        f"## Thought patch fitting speed (issues 5, 41): {args.threads} thread(s)",
        "",
        f"Command: `python benchmarks/bench_thought.py --model {args.model} --task {args.task} --n {args.n} "
        f"--threads {args.threads}{'' if args.out == OUT else ' --out ' + args.out}`. Machine: {machine(load_before=load_before)}; float32. "
        f"Best of {args.repeats}; peak = memory growth of a call: the process's peak resident set (VmHWM), "
        "reset before the call, above the resident set at its start (the loaded model not counted).",
        "",
        f"Batch: {len(queries)} calibration queries of task `{args.task}`, contextual prompts "
        f"{ids.shape[0]} × {ids.shape[1]} tokens (right-padded), {batch.n_tokens} query tokens ({rows} rows with the default "
        f"answer tokens {DEFAULT_ANSWER_TOKENS}).",
        "",
        "| what | seconds | × plain forward | peak MiB (growth) |",
        "|---|---|---|---|",
        f"| plain forward of the contextual batch, with logits | {t_logits:.2f} | 1.00 | {m_logits:.0f} |",
        f"| same forward, `return_type=None` | {t_nolog:.2f} | {t_nolog / t_logits:.2f} | {m_nolog:.0f} |",
        f"| thought_patch fit, default (the {n_keep} preserve texts' keys, greedy answers under the instruction "
        f"with the contextual reads taken as they are written, then the query-only batch and the preserve texts "
        f"through the blocks once, "
        f"all layers), the covariances computed (an empty disk cache) | {t_fit:.2f} | {t_fit / t_logits:.2f} | "
        f"{m_fit:.0f} |",
        f"| same default fit, the preserve covariances read from the disk cache (any later fit with these weights; "
        f"{cache_mib:.0f} MiB on disk) | {t_warm:.2f} | {t_warm / t_logits:.2f} | {m_warm:.0f} |",
        f"| same fit without the preserve term (`preserve=()`) | {t_np:.2f} | {t_np / t_logits:.2f} | {m_np:.0f} |",
        f"| same, at the query tokens only (`preserve=(), answer_tokens=0`) | {t_q:.2f} | {t_q / t_logits:.2f} | "
        f"{m_q:.0f} |",
        f"| *parts of the default fit, each alone:* greedy answers ({DEFAULT_ANSWER_TOKENS} tokens) under the "
        f"instruction | {t_greedy:.2f} | {t_greedy / t_logits:.2f} | |",
        f"| one forward over the {n_keep} preserve texts ({n_keep_tokens} tokens after BOS, 4 a batch), stopped after "
        f"the last block | {t_keep:.2f} | {t_keep / t_logits:.2f} | |",
        f"| sum of these two (the fit's floor before its own arithmetic, covariances computed) | "
        f"{t_greedy + t_keep:.2f} | {(t_greedy + t_keep) / t_logits:.2f} | |",
        f"| *not run by the fit:* the contextual pass over the batch with the answers, stopped after the last block "
        f"(the fit takes these reads in the greedy run) | {t_ctx:.2f} | {t_ctx / t_logits:.2f} | |",
        "",
        "A fit that reads the preserve covariances from the disk cache never runs the preserve texts: its floor is "
        f"the greedy answers, {t_greedy / t_logits:.2f}×. The preserve covariances add {cov_flops / 1e9:.0f} GFLOP "
        "(every layer's `K₀ᵀK₀` of the MLP inputs and hidden activations) on top of the preserve forward.",
        "",
        "A fit without answer rows (`answer_tokens=0`) reads a contextual pass that stops at the last block with a "
        f"hook rather than passing `return_type=None`, which here took {t_nolog / t_logits:.2f}× the time of the "
        f"forward with logits (peak {m_nolog:.0f} vs {m_logits:.0f} MiB). Compare rows through their ratio to the "
        "plain forward of the same run.",
    ]
    print(write_fragment(args.out, lines))
    write_json(args.out, {"machine": machine(load_before=load_before), "load_average_before": load_before,
                          "model": args.model, "task": args.task, "n": args.n, "threads": args.threads,
                          "rows": {"forward_logits": [t_logits, m_logits], "forward_none": [t_nolog, m_nolog],
                                   "fit_default": [t_fit, m_fit],
                                   "fit_default_cached_covariances": [t_warm, m_warm], "fit_no_preserve": [t_np, m_np],
                                   "fit_query_tokens": [t_q, m_q], "greedy_answers": [t_greedy, None],
                                   "contextual_pass": [t_ctx, None], "preserve_forward": [t_keep, None]},
                          "preserve_tokens": n_keep_tokens, "preserve_cache_mib": cache_mib, "preserve_covariance_gflop": cov_flops / 1e9,
                          "columns": ["seconds", "peak_mib"]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
