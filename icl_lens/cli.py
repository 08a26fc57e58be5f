"""Command line: ``icl-lens patches "PROMPT"``, ``icl-lens spikes "QUESTION"``, ``icl-lens sweep PROMPTS.jsonl``,
``icl-lens thought-eval TASK``, ``icl-lens prepare``.

Run ``icl-lens --help`` or ``icl-lens SUBCOMMAND --help``. Arguments are parsed and checked
before torch or TransformerLens is imported (this module imports neither), so ``--help`` and
a bad prompt, dtype, device, output path or input file answer in well under a second. Before
a prompt runs, ``patches`` estimates the memory it needs (:func:`estimate_patches_memory`)
and refuses one that cannot fit (``--force`` tries anyway).

Exit codes: 0 success; 1 the equivalence check of ``patches`` failed its tolerance; 2 any
error, as one line on stderr (``icl-lens: error: ...``; ``ICL_LENS_TRACEBACK=1`` shows the
traceback instead).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from icl_lens.model._names import DEFAULT_MODEL, DTYPE_NAMES, EMBEDDED_MODELS, known_model_names
from icl_lens.patches._memory import available_memory, estimate_patches_memory, format_bytes
from icl_lens.thought._defaults import CONDITIONS, DISTILL_STEPS, KINDS, ThoughtFit

# Default tolerance of the equivalence identity (relative to the largest |logit|), docs/design.md §2.
# Half precision has none fixed: it is twice the model's own noise floor, measured in the same run.
TOLERANCE = {"float32": 1e-4, "float64": 1e-9}
HALF = ("bfloat16", "float16")
DEVICE = re.compile(r"(cpu|mps|cuda)(:\d+)?")
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?b?", re.IGNORECASE)


class CommandError(ValueError):
    """A command-line input is invalid; the message says which and why."""


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error contract: one line on stderr, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -- checks that need no torch --------------------------------------------------------------------

def check_prompt(prompt: str) -> None:
    if not prompt.strip():
        raise CommandError("the prompt is empty (or only whitespace); pass some text to analyse")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:  # argv bytes that are not UTF-8 arrive as lone surrogates
        bad = prompt[err.start].encode("utf-8", "surrogateescape")
        raise CommandError(f"the prompt is not UTF-8 text (byte 0x{bad.hex()} at character {err.start}); "
                           f"pass text, not binary data") from None


def check_device_name(device: str, *, auto: bool = False) -> None:
    """Only the syntax (availability needs torch: :func:`icl_lens.model._loading.check_device`)."""
    if not (DEVICE.fullmatch(device) or (auto and device == "auto")):
        choices = "auto, cpu, cuda, cuda:N or mps" if auto else "cpu, cuda, cuda:N or mps"
        raise CommandError(f"unknown device {device!r}; use {choices}")


def _probe_writable(folder: Path, what: str) -> None:
    """Create and remove a temporary file in ``folder``, as the real write will (temp file, then rename)."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".icl-lens-probe.")
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise CommandError(f"{what}: cannot write in {folder} ({err.strerror or err})") from None


def check_out_file(out: str) -> None:
    """``--out`` of ``patches``: a new or regular file, in an existing folder this process can write."""
    if not out.strip():
        raise CommandError("--out is empty; name the file to write the factors to, or leave --out out")
    path = Path(out)
    if path.is_dir():
        raise CommandError(f"--out {out} is a directory; give a file name, e.g. {path / 'patches.safetensors'}")
    if path.exists() and not path.is_file():
        raise CommandError(f"--out {out} exists and is not a regular file")
    parent = path.parent
    if not parent.is_dir():
        raise CommandError(f"--out {out}: the folder {parent} does not exist")
    _probe_writable(parent, f"--out {out} is not writable")


def check_out_folder(out: str) -> None:
    """``--out`` of ``sweep``: a folder (created with its parents) under one this process can write."""
    if not out.strip():
        raise CommandError("--out is empty; name the folder to sweep into")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise CommandError(f"--out {out} exists and is not a folder")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise CommandError(f"--out {out}: {existing} is not a folder")
    _probe_writable(existing, f"--out {out} is not writable")


def parse_size(text: str) -> int:
    """Bytes from ``"4GB"``, ``"512M"``, ``"1.5GiB"`` or a plain number of bytes (k, M, G, T: powers of
    1000; with ``i``, of 1024)."""
    match = SIZE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}; write e.g. 4GB, 512MB or 2GiB")
    number, prefix, binary = float(match[1]), (match[2] or " ").lower(), bool(match[3])
    return int(number * (1024 if binary else 1000) ** " kmgt".index(prefix))


# -- commands --------------------------------------------------------------------------------------

def _patches(args: argparse.Namespace) -> int:
    check_prompt(args.prompt)
    if args.tolerance is not None and not args.tolerance > 0:
        raise CommandError(f"--tolerance must be > 0, got {args.tolerance}")
    check_device_name(args.device)
    if args.out is not None:
        check_out_file(args.out)

    from icl_lens import load_model, token_patches, verify_equivalence
    from icl_lens.model._loading import check_device
    from icl_lens.model._prompts import encode_prompt

    device = check_device(args.device)
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    n_tokens = encode_prompt(model, args.prompt).numel()  # a prompt beyond the context stops here
    need = estimate_patches_memory(model, n_tokens, noise_floor=args.tolerance is None and args.dtype in HALF)
    have = available_memory(device, args.max_memory)
    if need.total > have and not args.force:
        where = "--max-memory" if have == args.max_memory else f"available on {device}"
        raise CommandError(f"this prompt needs {need.describe()}, more than the {format_bytes(have)} {where}; "
                           f"shorten the prompt, or pass --force to try anyway")

    patches = token_patches(model, args.prompt, layers=args.layers)
    report = verify_equivalence(model, args.prompt, None if args.layers else patches)
    floor = None
    if args.tolerance is not None:
        tolerance = args.tolerance
    elif args.dtype in HALF:
        from icl_lens.patches._token_patches import noise_floor

        reference = load_model(args.model, device=args.device, dtype="float32")
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
    from icl_lens.sweep._lock import check_unlocked  # neither imports torch
    from icl_lens.sweep._rows import check_prompts_file

    try:
        check_prompts_file(args.prompts)
    except (OSError, ValueError) as err:
        raise CommandError(str(err)) from None
    if args.batch_size < 1:
        raise CommandError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.max_memory is not None and not args.max_memory > 0:
        raise CommandError(f"--max-memory must be > 0, got {args.max_memory}")
    if args.authors < 0:
        raise CommandError(f"--authors must be >= 0 (0: no column), got {args.authors}")
    check_device_name(args.device, auto=True)
    check_out_folder(args.out)
    check_unlocked(args.out)  # a second sweep into the same folder is refused before torch is imported

    from icl_lens.model._loading import check_device
    from icl_lens.sweep import run_sweep

    if args.device != "auto":
        check_device(args.device)
    result = run_sweep(args.prompts, model=args.model, out=args.out, batch_size=args.batch_size, dtype=args.dtype,
                       device=args.device, factors=args.factors, layers=args.layers, max_memory=args.max_memory,
                       progress=not args.quiet, authors=args.authors)
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
    from icl_lens.thought import load_task

    task = load_task(args.task)  # validate the file before loading a model
    if args.n_train is not None and not 1 <= args.n_train <= len(task.train):
        raise CommandError(f"--n-train must be in 1..{len(task.train)} for task {task.name!r}, got {args.n_train}")
    if not args.ridge >= 0:
        raise CommandError(f"--ridge must be >= 0, got {args.ridge}")
    if args.answer_tokens < 0:
        raise CommandError(f"--answer-tokens must be >= 0, got {args.answer_tokens}")
    if args.distill_steps < 1:
        raise CommandError(f"--distill-steps must be >= 1, got {args.distill_steps}")
    if not args.preserve_strength >= 0:
        raise CommandError(f"--preserve-strength must be >= 0, got {args.preserve_strength}")
    try:
        fit = ThoughtFit(kind=args.kind, eta=args.eta, ridge=args.ridge,
                         query_prefix=args.query_prefix.replace("\\n", "\n"), answer_tokens=args.answer_tokens,
                         preserve_strength=args.preserve_strength)
    except ValueError as err:
        raise CommandError(str(err)) from None
    from icl_lens import evaluate_thought, load_model
    from icl_lens.stats import wilson_interval

    model = load_model(args.model)
    result = evaluate_thought(model, task, fit, n_train=args.n_train, distill={"steps": args.distill_steps},
                              conditions=tuple(args.conditions), progress=not args.json)
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
            if out["gain_recovered"].get(cond) is not None:
                line += f"  gain recovered {out['gain_recovered'][cond]:.2f}"
            if cond in out["locality_kl"]:
                line += (f"  locality: KL {out['locality_kl'][cond]:.3g} nats, "
                         f"other task kept {out['locality_kept'][cond]:.0%}")
            print(line)
        if result.steering_layer is not None:
            print(f"  steering layer {result.steering_layer}")
        print("  seconds   " + ", ".join(f"{k} {v:.1f}" for k, v in result.seconds.items()))
    return 0


def _spikes(args: argparse.Namespace) -> int:
    check_prompt(args.prompt)
    check_device_name(args.device)
    from icl_lens.spikes._detector import shipped_detectors, spike_detector  # numpy and json only

    detector = spike_detector(args.model)
    if detector is None:
        measured = ", ".join(shipped_detectors().get("models", {})) or "none"
        raise CommandError(f"no wrong-answer detector was measured for {args.model!r} (measured: {measured}); "
                           "run python -m experiments.spikes for it")
    if args.max_new_tokens is not None and not args.max_new_tokens >= 1:
        raise CommandError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.samples < 0:
        raise CommandError(f"--samples must be >= 0, got {args.samples}")
    if detector.needs_samples:
        args.samples = max(args.samples, detector.samples)

    from icl_lens import generate_with_patches, load_model

    model = load_model(args.model, device=args.device)
    text = args.prompt if args.raw else detector.question_format.replace("{question}", args.prompt.strip())
    gen = generate_with_patches(model, text, max_new_tokens=args.max_new_tokens or detector.max_new_tokens,
                                stop=("\n",), answer_samples=args.samples)
    flag = gen.answer_flag
    if flag is None:
        raise CommandError("the prompt is too short for the detector (it reads the last prompt tokens)")
    if args.json:
        print(json.dumps({"model": args.model, "question": args.prompt, **flag.to_dict()}, ensure_ascii=False))
    else:
        p = "n/a" if flag.p_wrong != flag.p_wrong else f"{flag.p_wrong:.2f}"
        print(f"answer: {flag.answer}")
        print(f"p_wrong {p} (threshold {detector.threshold:.2f}) -> {'FLAGGED' if flag.flagged else 'not flagged'}")
        print(detector.describe())
        print("baselines (higher = more likely wrong): "
              + ", ".join(f"{k} {v:.3g}" for k, v in flag.baselines.items()))
    return 0


def _prepare(args: argparse.Namespace) -> int:
    unknown = [m for m in args.models if m not in EMBEDDED_MODELS]
    if unknown:
        raise CommandError(f"not embedded models: {', '.join(unknown)}; embedded: {', '.join(EMBEDDED_MODELS)}")
    from icl_lens.model._loading import prepare_embedded

    for name in args.models or list(EMBEDDED_MODELS):
        print(f"{name}: {prepare_embedded(name)}")
    return 0


def version_text() -> str:
    """``icl-lens X.Y.Z (torch …, transformer-lens …, transformers …, Python …)``: what a bug report needs."""
    from importlib.metadata import PackageNotFoundError, version

    from icl_lens import __version__

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    deps = ", ".join(f"{name} {installed(name)}" for name in ("torch", "transformer-lens", "transformers"))
    return f"icl-lens {__version__} ({deps}, Python {sys.version.split()[0]})"


class _Version(argparse.Action):
    """``--version``: print :func:`version_text` and exit 0 (read when asked, not on every start)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version (and torch's, TransformerLens's) and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="icl-lens", description="In-context learning as weight updates.",
                     epilog="Exit status: 0 success, 1 patches not exact (equivalence above the tolerance), "
                            "2 any error (one line on stderr).")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    model_help = f"embedded/tiny name ({', '.join(known_model_names())}), HF id or local directory"

    p = sub.add_parser("patches", help="token patches of every layer and token of a prompt")
    p.add_argument("prompt")
    p.add_argument("--model", default=DEFAULT_MODEL, help=model_help)
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="largest accepted relative equivalence error (default: 1e-4 for float32, 1e-9 for float64, "
                        "twice the measured half-vs-float32 noise floor for bfloat16/float16); "
                        "above it the command exits with status 1")
    p.add_argument("--layers", type=int, nargs="+", default=None,
                   help="only these layers (negative as Python's, e.g. -1 the last; default: all); the equivalence "
                        "check still uses every layer")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    p.add_argument("--out", metavar="FILE.safetensors",
                   help="write the factors (TokenPatches.save with u stored, so TokenPatches.load reads them without the model)")
    p.add_argument("--max-memory", type=parse_size, default=None, metavar="SIZE",
                   help="memory the run may use, e.g. 4GB (default: the available RAM, or the free memory of the "
                        "CUDA device); a prompt whose estimated need exceeds it is refused before any work")
    p.add_argument("--force", action="store_true", help="run even when the memory estimate exceeds what is available")
    p.set_defaults(func=_patches)

    p = sub.add_parser("spikes", help="answer a question and say whether the shipped detector flags the answer",
                       description="Asks the question in the detector's few-shot format (--raw: the prompt as it is), "
                                   "generates greedily up to the first newline and reads the answer with the model's "
                                   "shipped wrong-answer detector (the candidate, patch-based or a baseline, that "
                                   "ranked wrong answers best on kinds of question it never saw: python -m "
                                   "experiments.spikes; EVAL.md, 'Spike flags'); prints the one line saying what "
                                   "the flag is computed from and what token patches add. --json prints answer, "
                                   "p_wrong, flagged, detector {name, features, auroc_unseen_kinds, baseline, "
                                   "baseline_auroc_unseen_kinds, patch_adds, line, ...} and baselines {neglogp, "
                                   "neglogp_min, neglogp_first, entropy_first, length, sampling_disagreement}: "
                                   "their values for this answer.")
    p.add_argument("prompt", help="a short factual question, e.g. 'What is the capital of Peru?'")
    p.add_argument("--model", default=DEFAULT_MODEL, help="a model with a shipped detector (the embedded ones)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--raw", action="store_true", help="use the prompt as it is, without the few-shot format")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the detector's (8)")
    p.add_argument("--samples", type=int, default=5,
                   help="answers sampled at temperature 1 for the sampling-agreement baseline (default 5; 0: none, "
                        "unless the detector itself reads them)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_spikes)

    p = sub.add_parser("sweep", help="patch norms of every prompt of a JSONL file into Parquet parts (resumable)",
                       description='Rows {"id": ..., "prompt": ...}. Writes OUT/norms/part-*.parquet (id, layer, '
                                   'position, token, norm, correction_norm), OUT/manifest.json and, with --factors, '
                                   'OUT/factors/part-*.safetensors. A rerun verifies the parts against their '
                                   'checksums and skips the ids already done. A prompt over the memory budget, or one that runs out of memory or gives '
                                   'non-finite values, is a bad row. Under '
                                   '"accelerate launch --num_processes N -m icl_lens sweep ..." the prompts are split '
                                   'between the processes.')
    p.add_argument("prompts",
                   help="JSONL file, one {\"id\": ..., \"prompt\": ...} per line (or a pipe: /dev/stdin)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=model_help)
    p.add_argument("--out", required=True, help="output folder (created; reused to resume)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per padded batch (default 16)")
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    p.add_argument("--layers", type=int, nargs="+", default=None,
                   help="only these layers (negative as Python's, e.g. -1 the last; default: all)")
    p.add_argument("--factors", action="store_true", help="also write the patch factors as safetensors shards")
    p.add_argument("--max-memory", type=parse_size, default=None, metavar="SIZE",
                   help="memory the sweep may use, e.g. 4GB (default: the smallest of the available RAM and the "
                        "cgroup's limit, or the free memory of the CUDA device); a prompt whose estimated need "
                        "exceeds it is a bad row")
    p.add_argument("--authors", type=int, default=0, metavar="K",
                   help="also each row's K largest patch shares as (head, source offset, share) in the column "
                        "patch_authors (who wrote the patch; one more forward per prompt)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_sweep)

    p = sub.add_parser("thought-eval", help="evaluate a thought patch (prompt turned into weights) on a task",
                       description="Test accuracy (95%% Wilson intervals) with no instruction, with the full "
                                   "instruction in context, with the thought patch fitted on the task's train queries "
                                   "(arXiv 2510.08734) and no instruction, with context distillation into the same "
                                   "parameters, with a random control patch of the same "
                                   "per-layer norms, and with a steering vector at its best layer; locality (mean "
                                   "next-token KL on unrelated texts, other-task answers kept) of every edit.")
    p.add_argument("task", help="task .jsonl file, or the name of a shipped task (e.g. capitals)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=model_help)
    fit = ThoughtFit()  # the documented default: every option's default is its field
    p.add_argument("--kind", choices=KINDS, default=fit.kind,
                   help=f"parts to fit (default {fit.kind}; 'both' is the paper's matrix + vector)")
    p.add_argument("--eta", type=float, default=fit.eta, help=f"step size η (default {fit.eta:g})")
    p.add_argument("--ridge", type=float, default=fit.ridge,
                   help=f"scale-free ridge ≥ 0 (default {fit.ridge:g}; 0: pseudo-inverse)")
    p.add_argument("--query-prefix", default=fit.query_prefix,
                   help="text between BOS and the query when the instruction is absent (default: a newline; "
                        "write \\n for a newline, '' for none)")
    p.add_argument("--answer-tokens", type=int, default=fit.answer_tokens,
                   help="also fit at the first N tokens of the model's own answer under the instruction "
                        f"(default {fit.answer_tokens}; 0: query tokens only, as in the paper)")
    p.add_argument("--preserve-strength", type=float, default=fit.preserve_strength,
                   help="weight of the locality term (the model's own samples' keys, MEMIT-style covariance "
                        f"penalty; default {fit.preserve_strength:g}; 0: off)")
    p.add_argument("--distill-steps", type=int, default=DISTILL_STEPS,
                   help=f"Adam steps of the context-distillation baseline (default {DISTILL_STEPS})")
    p.add_argument("--n-train", type=int, default=None, help="calibration queries to use (default: all train)")
    p.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=list(CONDITIONS), metavar="CONDITION",
                   help=f"conditions to run (default: all of {' '.join(CONDITIONS)}; distillation is the slowest, "
                        "minutes on a CPU)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_thought_eval)

    p = sub.add_parser("prepare", help="dequantise and cache the embedded models (one time)")
    p.add_argument("models", nargs="*", help="embedded names (default: all)")
    p.set_defaults(func=_prepare)
    return parser


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    ours = isinstance(err, (ValueError, FloatingPointError, IndexError, LookupError, OSError))
    return text if ours else f"{type(err).__name__}: {text}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("icl-lens: interrupted", file=sys.stderr)
        return 2
    except MemoryError:
        print("icl-lens: error: out of memory; shorten the prompt or use a machine with more memory", file=sys.stderr)
        return 2
    except Exception as err:  # the contract: one line and status 2, never a traceback (1 means "not exact")
        if os.environ.get("ICL_LENS_TRACEBACK"):
            raise
        print(f"icl-lens: error: {_one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
