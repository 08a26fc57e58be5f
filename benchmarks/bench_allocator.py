"""Benchmark: a forward and ``token_patches`` with glibc's first heap settings and with the ones ``load_model`` sets.

``icl_lens.model._allocator``: without a pad, glibc hands the freed top of its heap back to the kernel, and each
call faults its activations onto fresh pages. In one process, per model, prompt length and thread count, the calls
run in rounds with the top pad and mmap threshold set to glibc's first values (128 KiB each; once any is set, glibc no
longer raises the threshold itself) and to ``load_model``'s (both the pad, ``set_top_pad``), the two modes
alternating call by call so a drifting load falls on both. Per call and mode: median wall time, system (kernel) time
and minor page faults; the resident set after the call and its peak during it (``VmHWM`` reset at the call's start).
The prompts are README.md's first tokens.

    python benchmarks/bench_allocator.py [--models smollm2-135m gemma-3-270m] [--lengths 256 1024] [--repeats 2]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout root, for experiments.report
from experiments.report import command, load_average, machine, write_fragment, write_json  # noqa: E402
from icl_lens import load_model, token_patches  # noqa: E402
from icl_lens.model import GLIBC_DEFAULT_PAD, keep_freed_memory, set_top_pad  # noqa: E402
from common import reset_peak_rss, status_kib, trim_heap  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "reports" / "bench_allocator.md"
TEXT = Path(__file__).resolve().parents[1] / "README.md"


def one_call(fn) -> dict[str, float]:
    """Wall and system seconds, minor faults, resident set after and peak during (MiB) of one call of ``fn``."""
    if not reset_peak_rss():
        raise SystemExit("this benchmark reads the peak resident set through /proc/self/clear_refs (Linux)")
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": wall, "sys_s": after.ru_stime - before.ru_stime, "faults": after.ru_minflt - before.ru_minflt,
            "rss_mib": status_kib("VmRSS") / 1024, "peak_mib": status_kib("VmHWM") / 1024}


def compare(fns: dict, pad: int, repeats: int) -> dict[str, dict[str, dict[str, float]]]:
    """Median of each reading per call and mode ("default", "pad"), the modes alternating call by call: each mode
    is set, the heap's free top handed back (``malloc_trim``), and the call made once unmeasured (its warm-up, in
    which the pad is taken up) and once measured."""
    modes = {"default": GLIBC_DEFAULT_PAD, "pad": pad}
    got = {name: {mode: [] for mode in modes} for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            for mode, value in modes.items():
                set_top_pad(value)
                trim_heap()
                fn()
                got[name][mode].append(one_call(fn))
    set_top_pad(pad)
    return {name: {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in by.items()}
            for name, by in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma-3-270m"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[256, 1024])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, len(os.sched_getaffinity(0))])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    load_before = load_average()
    rows = []
    for name in args.models:
        model = load_model(name)
        pad = keep_freed_memory()
        if pad is None:
            raise SystemExit("load_model set no top pad here (not glibc, ICL_LENS_TOP_PAD_MB=0, or glibc's own "
                             "MALLOC_TOP_PAD_ or MALLOC_MMAP_THRESHOLD_): nothing to compare")
        text_ids = model.to_tokens(TEXT.read_text(), truncate=False)[0]
        for n in args.lengths:
            ids = text_ids[:n]
            if ids.numel() < n:
                raise SystemExit(f"{TEXT.name} has only {ids.numel()} tokens, fewer than {n}")

            def forward(ids=ids):
                with torch.no_grad():
                    model(ids[None])

            for threads in args.threads:
                torch.set_num_threads(threads)
                got = compare({"forward": forward, "token_patches": lambda ids=ids: token_patches(model, ids)},
                              pad, args.repeats)
                for call, by in got.items():
                    rows.append({"model": name, "tokens": n, "threads": threads, "call": call,
                                 "pad_mib": pad / 2**20, **{f"{mode}_{k}": v for mode, r in by.items()
                                                            for k, v in r.items()}})
                    r = rows[-1]
                    print(f"{name} {n} tok {threads} thr {call:13s} wall {r['default_wall_s']:.2f} → "
                          f"{r['pad_wall_s']:.2f} s  sys {r['default_sys_s']:.2f} → {r['pad_sys_s']:.2f} s  "
                          f"faults {r['default_faults']:.0f} → {r['pad_faults']:.0f}  peak {r['default_peak_mib']:.0f}"
                          f" → {r['pad_peak_mib']:.0f} MiB", flush=True)
        del model
    write(args, load_before, rows)


def write(args, load_before: float, rows: list[dict]) -> None:
    pad = rows[0]["pad_mib"]
    lines = [f"## Freed memory kept mapped between forwards: glibc's first top pad and mmap threshold vs "
             f"{pad:.0f} MiB (`icl_lens.model._allocator`)", "",
             f"Command: `{command('python benchmarks/bench_allocator.py', None)}`. "
             f"Machine: {machine('cpu', load_before)}; float32.", "",
             "Per call, in one process, the two modes alternating call by call; medians of "
             f"{args.repeats} rounds, each call measured after an unmeasured one in its mode. *Default* = glibc's "
             f"first top pad and mmap threshold (128 KiB each), which `load_model` replaces with {pad:.0f} MiB "
             "(`ICL_LENS_TOP_PAD_MB`). System time is the kernel's, mostly page faults here; *peak* = the process's "
             "resident set at its highest during the call, *after* = when it returned (both MiB, the loaded model "
             "included).", "",
             "| model | tokens | threads | call | wall s: default → pad | pad / default | system s | minor faults "
             "| peak MiB | after MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['tokens']} | {r['threads']} | `{r['call']}` | {r['default_wall_s']:.2f} → "
            f"{r['pad_wall_s']:.2f} | {r['pad_wall_s'] / r['default_wall_s']:.2f}× | {r['default_sys_s']:.2f} → "
            f"{r['pad_sys_s']:.2f} | {r['default_faults']:.0f} → {r['pad_faults']:.0f} | {r['default_peak_mib']:.0f}"
            f" → {r['pad_peak_mib']:.0f} | {r['default_rss_mib']:.0f} → {r['pad_rss_mib']:.0f} |")
    text = write_fragment(args.out, lines)
    write_json(args.out, {"command": command("python benchmarks/bench_allocator.py", None), "rows": rows,
                          "load_before": load_before, "load_after": load_average()})
    print(text)


if __name__ == "__main__":
    main()
