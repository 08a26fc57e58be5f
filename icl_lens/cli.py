"""Command line: ``icl-lens patches "PROMPT"``, ``icl-lens prepare``, and the feature subcommands.

Run ``icl-lens --help`` or ``icl-lens SUBCOMMAND --help``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

import torch

# Feature modules that contribute a subcommand through ``register(subparsers)``.
SUBCOMMAND_MODULES: tuple[str, ...] = ("icl_lens.ui.thought_eval_cli",)

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _patches(args: argparse.Namespace) -> int:
    from icl_lens import load_model, token_patches, verify_equivalence

    model = load_model(args.model, device=args.device, dtype=DTYPES[args.dtype])
    patches = token_patches(model, args.prompt)
    report = verify_equivalence(model, args.prompt, patches)
    if args.out:
        from icl_lens.model.patch_export import save_patches

        save_patches(patches, args.out)
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
        }))
    else:
        frame = patches.to_frame()
        table = frame.pivot(index="layer", columns="position", values="norm")
        table.columns = [f"{p}:{t!r}" for p, t in zip(table.columns, patches.tokens)]
        print(f"model {args.model}: {patches.n_layers} layers x {patches.n_positions} tokens, "
              f"BOS kept: {patches.kept_bos}")
        print("token-patch norms ||dW||_F (rows: layer, columns: position:token)")
        print(table.round(3).to_string())
        print(f"equivalence: max |logit diff| = {float(report.max_abs_err.max()):.3g} "
              f"(relative {report.relative_error:.3g} of max |logit| {report.max_abs_logit:.3g})")
        if args.out:
            print(f"factors written to {args.out}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from icl_lens.model.loading import EMBEDDED_MODELS, prepare_embedded

    for name in args.models or list(EMBEDDED_MODELS):
        print(f"{name}: {prepare_embedded(name)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from icl_lens.model.loading import DEFAULT_MODEL, known_model_names

    parser = argparse.ArgumentParser(prog="icl-lens", description="In-context learning as weight updates.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("patches", help="token patches of every layer and token of a prompt")
    p.add_argument("prompt")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"embedded/tiny name ({', '.join(known_model_names())}), HF id or local directory")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    p.add_argument("--out", metavar="FILE.safetensors", help="write the factors as safetensors")
    p.set_defaults(func=_patches)

    p = sub.add_parser("prepare", help="dequantise and cache the embedded models (one time)")
    p.add_argument("models", nargs="*", help="embedded names (default: all)")
    p.set_defaults(func=_prepare)

    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FloatingPointError, IndexError, FileNotFoundError) as err:  # our errors carry a message for the user
        print(f"icl-lens: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
