"""Benchmark: implicit trajectory of the last token vs one plain forward of the prompt.

Measures, in the same run on the same prompt (Gemma 3 270M, CPU, float32):

- plain forward of the whole prompt with logits (the baseline, ratio 1),
- ``icl_lens.trajectory`` for the last token (one batched forward over the prompt prefix
  plus n+1 query copies sharing its keys/values; target ≤ 3× the baseline),
- the naive method, n+1 separate forwards over the prefixes ``[BOS, c₁..cᵢ, x_t]``
  (``trajectory_naive``), with the same capture hooks,

interleaved, median of ``--repeats`` runs (the naive method once by default: it is
O(n²)), and checks that the batched and naive trajectories agree. Writes
``reports/bench_trajectory.md``.

    python benchmarks/bench_trajectory.py [--tokens 128] [--repeats 3] [--naive-repeats 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout root, for experiments.report
from common import peak_memory, write_json  # noqa: E402

TEXT = (
    "In-context learning lets a language model pick up a task from examples in its prompt. "
    "Translate English to French: cat -> chat, dog -> chien, house -> maison, tree -> arbre, "
    "water -> eau, bread -> pain, book -> livre, car -> voiture, sun -> soleil, moon -> lune. "
    "Capitals: France -> Paris, Japan -> Tokyo, Italy -> Rome, Spain -> Madrid, Peru -> Lima, "
    "Kenya -> Nairobi, Egypt -> Cairo, Chile -> Santiago, Norway -> Oslo, Canada -> Ottawa. "
    "Arithmetic: 3 + 4 = 7, 5 + 2 = 7, 6 + 1 = 7, 8 + 3 = 11, 9 + 9 = 18, 7 + 5 = 12, 2 + 2 = 4. "
    "The quick brown fox jumps over the lazy dog while the patient researcher watches the weights move."
)


def _prompt_ids(model, n_tokens: int) -> torch.Tensor:
    ids = model.to_tokens(TEXT)[0]
    while ids.numel() < n_tokens:
        ids = torch.cat([ids, model.to_tokens(TEXT, prepend_bos=False)[0]])
    return ids[:n_tokens]


def _timed(fn, cpu: list[float]) -> float:
    """Wall seconds of ``fn()``; its process CPU seconds (all threads) are appended to ``cpu``."""
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    cpu.append(time.process_time() - start_cpu)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--naive-repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="reports/bench_trajectory.md")
    args = parser.parse_args(argv)

    from experiments.report import command, load_average, machine, write_fragment
    from icl_lens import load_model, trajectory
    from icl_lens.dynamics import trajectory_naive

    torch.set_num_threads(args.threads)
    load_before = load_average()
    model = load_model(args.model)
    ids = _prompt_ids(model, args.tokens)
    with torch.no_grad():
        model(ids[None])  # warm-up
    trajectory(model, ids)

    plain, batched, naive = [], [], []
    cpu: dict[str, list[float]] = {"plain": [], "batched": [], "naive": []}
    for rep in range(args.repeats):
        with torch.no_grad():
            plain.append(_timed(lambda: model(ids[None]), cpu["plain"]))
        batched.append(_timed(lambda: trajectory(model, ids), cpu["batched"]))
        print(f"repeat {rep}: plain {plain[-1]:.2f}s (cpu {cpu['plain'][-1]:.2f}s), "
              f"trajectory {batched[-1]:.2f}s (cpu {cpu['batched'][-1]:.2f}s)", flush=True)
    with torch.no_grad(), peak_memory() as mem_plain:  # one more call of each, peak reset before it
        model(ids[None])
    with peak_memory() as mem_batched:
        fast = trajectory(model, ids)
    peaks = {"plain": mem_plain["mb"], "batched": mem_batched["mb"]}
    slow = None
    for rep in range(args.naive_repeats):
        box: list[object] = []
        naive.append(_timed(lambda: box.append(trajectory_naive(model, ids)), cpu["naive"]))
        slow = box[0]
        print(f"naive {rep}: {naive[-1]:.2f}s (cpu {cpu['naive'][-1]:.2f}s)", flush=True)
    agree = float("nan")
    if slow is not None:
        u_f, u_s = fast.stacked_u(), slow.stacked_u()  # a trajectory keeps its steps' u (n+1 of them)
        agree = float((u_f - u_s).abs().max() / u_s.abs().max())

    base = statistics.median(plain)
    rows = [("plain forward of the prompt (with logits)", plain, cpu["plain"], peaks["plain"]),
            ("`trajectory` (batched, shared prefix)", batched, cpu["batched"], peaks["batched"])]
    if naive:
        rows.append(("naive: n+1 prefix forwards (`trajectory_naive`)", naive, cpu["naive"], float("nan")))
    base_cpu = statistics.median(cpu["plain"])
    n = fast.n_context
    lines = [
        "## Trajectory of one query: batched prefixes vs plain forward",
        "",
        f"Command: `{command('PYTHONPATH=. python benchmarks/bench_trajectory.py', argv)}`  ",
        f"Machine: {machine(load_before=load_before)}; model `{args.model}` float32, prompt of {ids.numel()} tokens "
        f"(query = last token, n = {n} context tokens, {len(fast.layers)} layers).",
        "",
        "| method | runs | median wall s | min wall s | median CPU s | ratio (median wall) | ratio (min wall) "
        "| ratio (median CPU) | peak MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, times, cpus, peak in rows:
        med, med_cpu = statistics.median(times), statistics.median(cpus)
        lines.append(f"| {label} | {len(times)} | {med:.2f} | {min(times):.2f} | {med_cpu:.2f} | {med / base:.2f}× | "
                     f"{min(times) / min(plain):.2f}× | {med_cpu / base_cpu:.2f}× | "
                     f"{'n/a' if peak != peak else f'{peak:.0f}'} |")
    lines += [
        "",
        f"Target: trajectory ≤ 3× the plain forward; measured {statistics.median(batched) / base:.2f}× "
        f"(ratio of median wall times), {min(batched) / min(plain):.2f}× (ratio of minima), "
        f"{statistics.median(cpu['batched']) / base_cpu:.2f}× (ratio of median process CPU times, the least "
        "sensitive to other jobs on the machine). "
        + (f"The naive method costs {statistics.median(naive) / statistics.median(batched):.1f}× the batched one. "
           if naive else "")
        + (f"Batched and naive trajectories agree to {agree:.1e} (max |Δu| / max |u|)." if naive else ""),
        "",
        "The batched method runs one forward over the prompt prefix plus n+1 copies of the query "
        f"(≈ {ids.numel() - 1 + n + 1} tokens, no unembedding); the plain forward computes logits over the "
        f"{model.cfg.d_vocab}-token vocabulary. Runs are interleaved, so a change of load affects all methods. "
        "Peak = memory growth of one more call of each, in the same run (the process's peak resident set, reset "
        "before the call through /proc/self/clear_refs, above the resident set at its start).",
        "",
    ]
    print(write_fragment(args.out, lines))
    write_json(args.out, {"command": command("PYTHONPATH=. python benchmarks/bench_trajectory.py", argv),
                          "machine": machine(load_before=load_before), "load_average_before": load_before,
                          "tokens": int(ids.numel()), "n_context": n,
                          "rows": [{"method": label, "wall_s": times, "cpu_s": cpus, "peak_mib": peak}
                                   for label, times, cpus, peak in rows], "agreement": agree})


if __name__ == "__main__":
    main()
