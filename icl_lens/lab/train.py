"""Train the lab models on in-context linear regression: ``python -m icl_lens.lab.train``.

Loss: mean squared error of the query prediction, normalised by ``d_x`` (the variance of
``y = wᵀx``), so a model that ignores the context scores about 1 and least squares 0.
Each step draws a fresh batch with a context length uniform in ``1..n_context_train``.
The named models and their recipes are in :mod:`icl_lens.lab._checkpoints`.
"""
from __future__ import annotations

import argparse
import time

import torch
from tqdm.auto import tqdm

from icl_lens.lab._checkpoints import CHECKPOINT_DIR, LAB_MODELS, RECIPES, save_checkpoint
from icl_lens.lab._mirror import orient_attention
from icl_lens.lab._model import LabConfig, RegressionModel, build_model
from icl_lens.lab._tasks import sample_prompts


def query_loss(model: RegressionModel, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Normalised MSE at the last (query) position."""
    return ((model(tokens)[:, -1] - targets) ** 2).mean() / model.cfg.d_x


def train(cfg: LabConfig, *, steps: int = 3000, batch: int = 64, lr: float = 2e-3, seed: int = 0,
          progress: bool = True, desc: str | None = None, orient: bool = False) -> tuple[RegressionModel, dict]:
    """AdamW with linear warm-up and cosine decay; returns the model and a training record.

    ``orient``: before training, every first-layer softmax head that prefers inputs opposite to the query
    has its query projection negated (:func:`icl_lens.lab.orient_attention`), so training starts in
    the similar-input basin of the task's two mirror solutions; the record lists the flipped heads."""
    if steps < 1:
        raise ValueError("steps must be ≥ 1")
    model = build_model(cfg, seed=seed)
    flipped = orient_attention(model).tolist() if orient else None
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * s / steps)).item()))
    g = torch.Generator().manual_seed(seed + 1)
    start, recent = time.perf_counter(), []
    bar = tqdm(range(steps), desc=desc or cfg.arch, disable=not progress, mininterval=1.0)
    for step in bar:
        n = int(torch.randint(1, cfg.n_context_train + 1, (1,), generator=g))
        p = sample_prompts(batch, n, cfg.d_x, generator=g, query_flag=cfg.query_flag)
        loss = query_loss(model, p.tokens, p.targets)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        recent = (recent + [loss.item()])[-100:]
        if step % 50 == 0:
            bar.set_postfix(loss=f"{sum(recent) / len(recent):.4f}")
    model.eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(10_000 + seed)
    p = sample_prompts(1024, cfg.n_context_train, cfg.d_x, generator=gen, query_flag=cfg.query_flag)
    with torch.no_grad():
        final = query_loss(model, p.tokens, p.targets).item()
    record = {"steps": steps, "batch": batch, "lr": lr, "seed": seed, "seconds": time.perf_counter() - start,
              "train_loss_last100": sum(recent) / len(recent), "eval_loss_n_train": final,
              "torch": str(torch.__version__), "threads": torch.get_num_threads(),
              **({"oriented_heads": flipped} if orient else {})}
    return model, record


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", "--arch", dest="model", choices=[*LAB_MODELS, "all"], default="all",
                    help="named lab model (icl_lens.lab._checkpoints.LAB_MODELS)")
    ap.add_argument("--steps", type=int, default=None, help="default: the model's recipe")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=None, help="default: the model's recipe")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(CHECKPOINT_DIR), help="checkpoint folder (default: the shipped one)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for these tiny models)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    for name in LAB_MODELS if args.model == "all" else (args.model,):
        recipe = RECIPES[name]
        model, record = train(LAB_MODELS[name], steps=args.steps or recipe["steps"], batch=args.batch,
                              lr=args.lr or recipe["lr"], seed=args.seed, desc=name, orient=recipe.get("orient", False))
        path = save_checkpoint(model, record, name, args.out)
        print(f"[{name}] saved {path} ({path.stat().st_size / 1024:.0f} KB): {record}", flush=True)


if __name__ == "__main__":
    main()
