"""Benchmark: fit a thought patch from 32 calibration queries on Gemma 3 270M (CPU).

``python benchmarks/bench_thought.py [--model gemma-3-270m] [--task capitals] [--threads 1]``
writes ``reports/bench_thought.md``. Baselines measured in the same run on the same batch
(the 32 contextual prompts ``[BOS] + instruction + query``, right-padded): one plain
forward with logits, and the same forward with ``return_type=None``. Peak memory is the
growth of the process's peak resident set (VmHWM) during a call, reset before it (benchmarks/common.py).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout root, for experiments.report
from common import peak_memory, write_json  # noqa: E402
from experiments.report import load_average, machine, write_fragment  # noqa: E402
from icl_lens import load_model, load_task, thought_patch  # noqa: E402
from icl_lens.thought import preserve_texts  # noqa: E402
from icl_lens.model import pad_id, right_padded  # noqa: E402
from icl_lens.thought import continuation_ids, query_batch, text_ids  # noqa: E402
from icl_lens.thought import DEFAULT_ANSWER_TOKENS  # noqa: E402


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
    p.add_argument("--out", default="reports/bench_thought.md")
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
    t_fit, m_fit = _measure(lambda: thought_patch(model, task.instruction, queries), args.repeats)
    t_np, m_np = _measure(lambda: thought_patch(model, task.instruction, queries, preserve=()), args.repeats)
    t_q, m_q = _measure(lambda: thought_patch(model, task.instruction, queries, preserve=(), answer_tokens=0),
                        args.repeats)
    n_keep = len(preserve_texts(model))
    # the default fit's rows: every query token and every token of the model's own answer
    rows = batch.n_tokens + sum(map(len, continuation_ids(model, text_ids(model, task.instruction), q_ids,
                                                          DEFAULT_ANSWER_TOKENS)))
    lines = [
        "## Thought patch fitting speed (issue 5)",
        "",
        f"Command: `python benchmarks/bench_thought.py --model {args.model} --task {args.task} --n {args.n} "
        f"--threads {args.threads}`. Machine: {machine(load_before=load_before)}; float32. "
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
        f"| thought_patch fit, default (the {n_keep} preserve texts' keys, greedy answers under the instruction, "
        f"then 1 contextual pass + 2 truncated plain passes per layer, all layers) | {t_fit:.2f} | "
        f"{t_fit / t_logits:.2f} | {m_fit:.0f} |",
        f"| same fit without the preserve term (`preserve=()`) | {t_np:.2f} | {t_np / t_logits:.2f} | {m_np:.0f} |",
        f"| same, at the query tokens only (`preserve=(), answer_tokens=0`) | {t_q:.2f} | {t_q / t_logits:.2f} | "
        f"{m_q:.0f} |",
        "",
        "The fit's contextual pass stops at the last block with a hook rather than passing `return_type=None`, "
        f"which here took {t_nolog / t_logits:.2f}× the time of the forward with logits (peak {m_nolog:.0f} vs "
        f"{m_logits:.0f} MiB). Compare rows through their ratio to the plain forward of the same run.",
    ]
    print(write_fragment(args.out, lines))
    write_json(args.out, {"machine": machine(load_before=load_before), "load_average_before": load_before,
                          "model": args.model, "task": args.task, "n": args.n, "threads": args.threads,
                          "rows": {"forward_logits": [t_logits, m_logits], "forward_none": [t_nolog, m_nolog],
                                   "fit_default": [t_fit, m_fit], "fit_no_preserve": [t_np, m_np],
                                   "fit_query_tokens": [t_q, m_q]},
                          "columns": ["seconds", "peak_mib"]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
