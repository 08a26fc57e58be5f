"""Command line: ``icl-lens patches "PROMPT"``, ``icl-lens sweep PROMPTS.jsonl``, ``icl-lens thought-eval TASK``, ``icl-lens prepare``.

Run ``icl-lens --help`` or ``icl-lens SUBCOMMAND --help``. Inputs are validated before
any model is loaded, so a bad prompt or task file fails in well under a second. Exit
codes: 0 success, 1 the equivalence check of ``patches`` failed its tolerance, 2 bad
input or another error with a message.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Default tolerance of the equivalence identity (relative to the largest |logit|), docs/design.md §2.
# Half precision has none fixed: it is twice the model's own noise floor, measured in the same run.
TOLERANCE = {"float32": 1e-4, "float64": 1e-9}
HALF = ("bfloat16", "float16")


class CommandError(ValueError):
    """A command-line input is invalid; the message says which and why."""


def _patches(args: argparse.Namespace) -> int:
    if not args.prompt.strip():
        raise CommandError("the prompt is empty (or only whitespace); pass some text to analyse")
    if args.tolerance is not None and not args.tolerance > 0:
        raise CommandError(f"--tolerance must be > 0, got {args.tolerance}")
    from icl_lens import load_model, token_patches, verify_equivalence
    from icl_lens.model.loading import check_device

    check_device(args.device)
    model = load_model(args.model, device=args.device, dtype=DTYPES[args.dtype])
    patches = token_patches(model, args.prompt)
    report = verify_equivalence(model, args.prompt, patches)
    floor = None
    if args.tolerance is not None:
        tolerance = args.tolerance
    elif args.dtype in HALF:
        from icl_lens.model.patches import noise_floor

        reference = load_model(args.model, device=args.device, dtype=torch.float32)
        floor = noise_floor(model, reference, args.prompt)
        tolerance = 2 * floor / report.max_abs_logit
    else:
        tolerance = TOLERANCE[args.dtype]
    exact = report.relative_error <= tolerance
    if args.out:
        patches.save(args.out, with_u=True)  # a file read without the model: u stored beside δ
    if args.json:
        print(json.dumps({
            "model": args.model,
            "tokens": list(patches.tokens),
            "token_ids": patches.token_ids.tolist(),
            "kept_bos": patches.kept_bos,
            "norms": patches.norms().double().cpu().tolist(),
            "correction_norms": patches.correction_norms().double().cpu().tolist(),
            "equivalence_max_abs_err": float(report.max_abs_err.max()),
            "max_abs_logit": report.max_abs_logit,
            "relative_error": report.relative_error,
            "tolerance": tolerance,
            "noise_floor": floor,
            "exact": exact,
        }))
    else:
        frame = patches.to_frame()
        table = frame.pivot(index="layer", columns="position", values="norm")
        table.columns = [f"{p}:{t!r}" for p, t in zip(table.columns, patches.tokens)]
        print(f"model {args.model}: {patches.n_layers} layers x {patches.n_positions} tokens, "
              f"BOS kept: {patches.kept_bos}")
        print("token-patch norms ||dW||_F (rows: layer, columns: position:token)")
        print(table.round(3).to_string())
        if floor is not None:
            print(f"{args.dtype} noise floor: max |logit({args.dtype}) - logit(float32)| = {floor:.3g}; "
                  f"tolerance = twice that")
        print(f"equivalence: max |logit diff| = {float(report.max_abs_err.max()):.3g} "
              f"(relative {report.relative_error:.3g} of max |logit| {report.max_abs_logit:.3g}; "
              f"tolerance {tolerance:.0e}: {'exact' if exact else 'NOT exact'})")
        if args.out:
            print(f"factors written to {args.out}")
    if not exact:
        print(f"icl-lens: equivalence error {report.relative_error:.3g} exceeds the tolerance {tolerance:.0e}",
              file=sys.stderr)
        return 1
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from icl_lens.model.loading import check_device

    if not Path(args.prompts).is_file():
        raise CommandError(f"prompts file {args.prompts} does not exist")
    if args.batch_size < 1:
        raise CommandError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.device != "auto":
        check_device(args.device)
    from icl_lens.sweep import run_sweep

    result = run_sweep(args.prompts, model=args.model, out=args.out, batch_size=args.batch_size, dtype=args.dtype,
                       device=args.device, factors=args.factors, layers=args.layers, progress=not args.quiet)
    m = result.manifest
    if result.main_process:  # one report, however many processes
        c = m["counts"]
        print(f"sweep {m['model']} ({m['dtype']}, {m['device']}, {m['processes']} process(es)): "
              f"{c['done']} of {c['good']} prompts done ({c['done_now']} now, {c['done_before']} before), "
              f"{c['bad']} bad row(s), {m['seconds']:.1f} s -> {args.out}")
        for bad in m["bad_rows"][:10]:
            print(f"  bad row line {bad['line']} (id {bad['id']}): {bad['reason']}")
    return 0


def _thought_eval(args: argparse.Namespace) -> int:
    from icl_lens.thought import evaluate_thought, load_task

    task = load_task(args.task)  # validate the file before loading a model
    if args.n_train is not None and not 1 <= args.n_train <= len(task.train):
        raise CommandError(f"--n-train must be in 1..{len(task.train)} for task {task.name!r}, got {args.n_train}")
    if not args.ridge >= 0:
        raise CommandError(f"--ridge must be >= 0, got {args.ridge}")
    if args.answer_tokens < 0:
        raise CommandError(f"--answer-tokens must be >= 0, got {args.answer_tokens}")
    from icl_lens import load_model
    from icl_lens.stats import wilson_interval

    model = load_model(args.model)
    result = evaluate_thought(model, task, kind=args.kind, eta=args.eta, ridge=args.ridge, n_train=args.n_train,
                              query_prefix=args.query_prefix.replace("\\n", "\n"), answer_tokens=args.answer_tokens)
    out = result.to_dict()
    out["interval95"] = {c: list(wilson_interval(out["correct"][c], result.n_test)) for c in out["correct"]}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"task {result.task} | model {result.model} | {result.n_train} calibration queries | "
              f"{result.n_test} test queries | kind {result.kind}, ridge {result.ridge:g}, "
              f"query prefix {result.query_prefix!r}, answer tokens {result.answer_tokens}")
        for cond, acc in result.accuracy.items():
            low, high = out["interval95"][cond]
            line = f"  {cond:<9} {acc:6.1%}  [95% {low:.0%}–{high:.0%}]"
            if cond in out["agreement_with_full"]:
                line += f"  same answer as full {out['agreement_with_full'][cond]:.0%}"
            if cond in out["locality_kl"]:
                line += (f"  locality: KL {out['locality_kl'][cond]:.3g} nats, "
                         f"other task kept {out['locality_accuracy'][cond]:.0%}")
            print(line)
        if result.steering_layer is not None:
            print(f"  steering layer {result.steering_layer}")
        print(f"  seconds   {result.seconds:.1f}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from icl_lens.model.loading import EMBEDDED_MODELS, prepare_embedded

    unknown = [m for m in args.models if m not in EMBEDDED_MODELS]
    if unknown:
        raise CommandError(f"not embedded models: {', '.join(unknown)}; embedded: {', '.join(EMBEDDED_MODELS)}")
    for name in args.models or list(EMBEDDED_MODELS):
        print(f"{name}: {prepare_embedded(name)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from icl_lens.model.loading import DEFAULT_MODEL, known_model_names
    from icl_lens.thought.fit import DEFAULT_ANSWER_TOKENS, DEFAULT_KIND, DEFAULT_QUERY_PREFIX, DEFAULT_RIDGE, KINDS

    parser = argparse.ArgumentParser(prog="icl-lens", description="In-context learning as weight updates.")
    sub = parser.add_subparsers(dest="command", required=True)
    model_help = f"embedded/tiny name ({', '.join(known_model_names())}), HF id or local directory"

    p = sub.add_parser("patches", help="token patches of every layer and token of a prompt")
    p.add_argument("prompt")
    p.add_argument("--model", default=DEFAULT_MODEL, help=model_help)
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="largest accepted relative equivalence error (default: 1e-4 for float32, 1e-9 for float64, "
                        "twice the measured half-vs-float32 noise floor for bfloat16/float16); "
                        "above it the command exits with status 1")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    p.add_argument("--out", metavar="FILE.safetensors",
                   help="write the factors (TokenPatches.save with u stored, so TokenPatches.load reads them without the model)")
    p.set_defaults(func=_patches)

    p = sub.add_parser("sweep", help="patch norms of every prompt of a JSONL file into Parquet parts (resumable)",
                       description='Rows {"id": ..., "prompt": ...}. Writes OUT/norms/part-*.parquet (id, layer, '
                                   'position, token, norm, correction_norm), OUT/manifest.json and, with --factors, '
                                   'OUT/factors/part-*.safetensors. A rerun skips the ids already done. Under '
                                   '"accelerate launch --num_processes N -m icl_lens sweep ..." the prompts are split '
                                   'between the processes.')
    p.add_argument("prompts", help="JSONL file, one {\"id\": ..., \"prompt\": ...} per line")
    p.add_argument("--model", default=DEFAULT_MODEL, help=model_help)
    p.add_argument("--out", required=True, help="output folder (created; reused to resume)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per padded batch (default 16)")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="only these layers (default: all)")
    p.add_argument("--factors", action="store_true", help="also write the patch factors as safetensors shards")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_sweep)

    p = sub.add_parser("thought-eval", help="evaluate a thought patch (prompt turned into weights) on a task",
                       description="Test accuracy (95%% Wilson intervals) with no instruction, with the full "
                                   "instruction in context, with the thought patch fitted on the task's train queries "
                                   "(arXiv 2510.08734) and no instruction, with a random control patch of the same "
                                   "per-layer norms, and with a steering vector at its best layer; locality (mean "
                                   "next-token KL on unrelated texts, other-task answers kept) of every edit.")
    p.add_argument("task", help="task .jsonl file, or the name of a shipped task (e.g. capitals)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=model_help)
    p.add_argument("--kind", choices=KINDS, default=DEFAULT_KIND,
                   help=f"parts to fit (default {DEFAULT_KIND}; 'both' is the paper's matrix + vector)")
    p.add_argument("--eta", type=float, default=1.0, help="step size η (default 1)")
    p.add_argument("--ridge", type=float, default=DEFAULT_RIDGE,
                   help=f"scale-free ridge ≥ 0 (default {DEFAULT_RIDGE:g}; 0: pseudo-inverse)")
    p.add_argument("--query-prefix", default=DEFAULT_QUERY_PREFIX,
                   help="text between BOS and the query when the instruction is absent (default: a newline; "
                        "write \\n for a newline, '' for none)")
    p.add_argument("--answer-tokens", type=int, default=DEFAULT_ANSWER_TOKENS,
                   help="also fit at the first N tokens of the model's own answer under the instruction "
                        f"(default {DEFAULT_ANSWER_TOKENS}; 0: query tokens only, as in the paper)")
    p.add_argument("--n-train", type=int, default=None, help="calibration queries to use (default: all train)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_thought_eval)

    p = sub.add_parser("prepare", help="dequantise and cache the embedded models (one time)")
    p.add_argument("models", nargs="*", help="embedded names (default: all)")
    p.set_defaults(func=_prepare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FloatingPointError, IndexError, FileNotFoundError) as err:  # our errors carry a message
        print(f"icl-lens: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
