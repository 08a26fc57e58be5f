"""Evaluation: alignment of the implicit token-patch update with explicit SGD (Gemma 3 270M).

Dherin et al. 2025 (arXiv 2507.16003, §4) report that implicit updates track explicit
finetuning on linear-regression transformers. This command measures the same cosine on a
real LM, per layer, for a few prompts of three kinds (few-shot lookup, arithmetic-style,
free text), with :func:`icl_lens.finetune_alignment`, and a control: each prompt's implicit
update against the explicit update of the next prompt of the same kind. Writes
``reports/eval_finetune_alignment.md``.

    python -m icl_lens.evals.finetune_alignment [--model gemma-3-270m] [--lr 1e-3] [--steps 5]
"""
from __future__ import annotations

import argparse
import time

import torch

PROMPTS = {
    "few-shot lookup": [
        "France: Paris\nJapan: Tokyo\nItaly: Rome\nSpain: Madrid\nGermany:",
        "cat -> chat\ndog -> chien\nhouse -> maison\nbread -> pain\nwater ->",
        "apple is a fruit. carrot is a vegetable. banana is a fruit. potato is a",
    ],
    "arithmetic-style": [
        "2 + 3 = 5\n4 + 1 = 5\n6 + 2 = 8\n3 + 4 =",
        "10, 20, 30, 40, 50,",
        "double 3 is 6, double 5 is 10, double 7 is",
    ],
    "free text": [
        "The old lighthouse keeper climbed the stairs every night to light the",
        "After the long winter, the farmers finally began to plant their",
        "She opened the letter slowly, afraid of what it might",
    ],
}


def _fmt(x: float) -> str:
    return f"{x:+.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Implicit vs explicit (SGD) update alignment table")
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="reports/eval_finetune_alignment.md")
    args = parser.parse_args(argv)

    from icl_lens import finetune_alignment, load_model
    from icl_lens.evals.report import command, load_average, machine, write_fragment

    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    results = {}
    load_before, start = load_average(), time.perf_counter()
    for kind, prompts in PROMPTS.items():
        for prompt in prompts:
            t0 = time.perf_counter()
            results[(kind, prompt)] = finetune_alignment(model, prompt, lr=args.lr, steps=args.steps)
            print(f"{kind}: {prompt[:40]!r} done in {time.perf_counter() - t0:.0f}s", flush=True)
    elapsed = time.perf_counter() - start

    first = next(iter(results.values()))
    d_u, d_in = first.implicit.stacked_u().shape[-1], first.implicit.v.shape[-1]
    lines = [
        "## Implicit (token patch) vs explicit (SGD) weight updates",
        "",
        f"Command: `{command('python -m icl_lens.evals.finetune_alignment', argv)}`  ",
        f"Machine: {machine(load_before=load_before)}; model `{args.model}` float32; {len(results)} prompts in {elapsed:.0f} s.",
        "",
        "**What is compared** (per layer l, query = last token of the prompt): the implicit update "
        "`Wₙ − W₀ = [u_gate; u_in] vᵀ`, the token patch that makes the context-free input `[BOS, x_t]` "
        "reproduce the full-context output (docs/design.md §2–3), against the explicit update "
        f"`E = −lr Σ_s Σ_rows [g_gate; g_in] xᵀ` of {args.steps} SGD steps (lr = {args.lr:g}) on "
        "`W_gate` and `W_up` of all layers at once, on the same context-free input, loss = cross-entropy "
        "toward the contextual argmax token. Cosine = normalised Frobenius inner product, closed form "
        "from the factors. *all rows*: the true SGD update (gradient terms of the BOS and the query rows); "
        "*query row*: only the query row's terms `g_t x_tᵀ`. *Control*: this prompt's implicit update "
        "against the explicit update of the next prompt of the same kind (cyclic). For scale, two random "
        f"directions in this {d_u}×{d_in} space have |cosine| ≈ {(2 / 3.14159 / (d_u * d_in)) ** 0.5:.0e}.",
        "",
        "| kind | prompt | target | loss before → after | mean cos (all rows) | mean cos (query row) "
        "| min / max layer cos | control mean cos |",
        "|---|---|---|---|---|---|---|---|",
    ]
    per_kind: dict[str, list[torch.Tensor]] = {}
    controls: dict[str, list[torch.Tensor]] = {}
    for kind, prompts in PROMPTS.items():
        for j, prompt in enumerate(prompts):
            res = results[(kind, prompt)]
            other = results[(kind, prompts[(j + 1) % len(prompts)])]
            cos, cos_q = res.cosine(), res.cosine("query")
            control = res.cosine_with_explicit_of(other)
            per_kind.setdefault(kind, []).append(cos)
            controls.setdefault(kind, []).append(control)
            shown = prompt.replace("\n", "⏎ ").replace("|", "\\|")
            lines.append(
                f"| {kind} | `{shown}` | `{res.target_token.strip() or repr(res.target_token)}` | "
                f"{float(res.losses[0]):.2f} → {float(res.losses[-1]):.3f} | {_fmt(float(cos.mean()))} | "
                f"{_fmt(float(cos_q.mean()))} | {_fmt(float(cos.min()))} / {_fmt(float(cos.max()))} | "
                f"{_fmt(float(control.mean()))} |"
            )
    kinds = list(PROMPTS)
    lines += ["", "Per-layer cosine (all rows), mean over the prompts of each kind, and the control:", "",
              "| layer | " + " | ".join(kinds) + " | all prompts | control (all) |",
              "|---|" + "---|" * (len(kinds) + 2)]
    everything = torch.stack([c for k in kinds for c in per_kind[k]])
    control_all = torch.stack([c for k in kinds for c in controls[k]])
    for layer in range(everything.shape[1]):
        cells = [_fmt(float(torch.stack(per_kind[k])[:, layer].mean())) for k in kinds]
        lines.append(f"| {layer} | " + " | ".join(cells) + f" | {_fmt(float(everything[:, layer].mean()))} | "
                     f"{_fmt(float(control_all[:, layer].mean()))} |")
    lines.append(f"| mean | " + " | ".join(_fmt(float(torch.stack(per_kind[k]).mean())) for k in kinds)
                 + f" | {_fmt(float(everything.mean()))} | {_fmt(float(control_all.mean()))} |")
    pos = float((everything > 0).double().mean())
    lines += [
        "",
        f"Summary: mean cosine over all layers and prompts {_fmt(float(everything.mean()))} "
        f"(|cos| mean {float(everything.abs().mean()):.3f}, {pos:.0%} of layer×prompt cosines positive); "
        f"mismatched-prompt control {_fmt(float(control_all.mean()))} (|cos| mean {float(control_all.abs().mean()):.3f}). "
        "Read the numbers as measured: they are what this model, these prompts and this SGD setting give.",
        "",
    ]
    print(write_fragment(args.out, lines))


if __name__ == "__main__":
    main()
