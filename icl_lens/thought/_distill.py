"""Context distillation: the baseline a thought patch is measured against (gradient steps instead of one fit).

Context distillation (Askell et al. 2021, arXiv 2112.00861; Snell, Klein, Zhong 2022,
arXiv 2209.15189) trains the model without the prompt to imitate the model with it. Here
it trains *the same parameters a thought patch edits* (:mod:`icl_lens.thought._fit`,
kind ``both+down`` by default), on the same calibration rows, and applies the result
through the same mechanism (:class:`~icl_lens.thought._result.ThoughtPatch`, i.e.
:mod:`icl_lens.model._weight_edits`), so the two differ only in how the edit is found:

- per patched layer ``l``: the input map ``M[l]`` (``d_model × d_model``; every first dense
  weight ``W_d`` changes by ``W_d M[l]``), the vector ``c[l]`` (the MLP-branch bias, or
  the post-FFN norm gain on Gemma-style blocks) and a dense down-projection change
  ``ΔW_out[l]`` (``d_model × d_mlp``, one per layer; stored as the factors
  ``down_u[l] = I``, ``down_v[l] = ΔW_out[l]``); kind ``both`` drops the last, ``matrix`` /
  ``vector`` keep one part; all start at zero (the unpatched model);
- rows: for every calibration query ``x`` and the full model's own greedy answer ``y``
  (its first ``answer_tokens`` tokens, up to its first newline, as the fit reads them),
  every position of ``x y``;
- loss: the mean over those positions of ``KL(P_full ‖ P_edited)`` between the next-token
  distributions of ``[BOS, I, x, y]`` (fixed, computed once) and of the edited model on
  ``[BOS, p, x, y]`` (``p``: the query prefix);
- schedule (:mod:`icl_lens.thought._defaults`: ``DISTILL_STEPS``, ``DISTILL_LR``, ``DISTILL_BATCH``,
  ``DISTILL_WARMUP``): Adam
  (β = 0.9, 0.999), ``steps`` steps of ``batch`` queries each (the queries shuffled
  once per pass, seeded), learning rate warmed up linearly over the first 10% of the
  steps, then cosine-decayed to 0. The model's own weights are frozen
  (``requires_grad`` restored afterwards).

*On equal terms with the patch* (issue 38): ``preserve_weight = w > 0`` adds the patch's
locality term to the loss, on the same preserve texts (``fit.preserve``; ``None``: the
shipped :func:`~icl_lens.thought.preserve_texts`, fit half), as the mean next-token
``KL(unpatched ‖ edited)`` over every position of ``batch`` of them per step (cycled,
seeded; the unpatched side computed once per text, without the edit):
``loss = KL_answer + w · KL_preserve``. With ``validation`` queries and ``held_out`` texts
(token ids, BOS included), every ``eval_every`` steps the edit is scored on held-out data by
the same objective, ``answer_kl(validation) + w · text_kl(held_out)``, and the best
checkpoint is returned (early stopping: the run ends after ``patience`` checkpoints without a
better one); ``settings`` records the checkpoints and the chosen step. What does not depend on
the edit is computed once: the teacher, and the reference sides of the preserve term and of the
held-out scores (:class:`~icl_lens.thought._divergence.KLReference`). ``w`` itself is chosen
like the patch's preserve strength (``experiments/thought/method.py``).

A tqdm bar shows the steps and the running loss (``progress=False`` hides it).
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch
from tqdm import tqdm

from icl_lens.model._block_family import block_family
from icl_lens.model._greedy import tail_logits
from icl_lens.model._prompts import pad_id, right_padded
from icl_lens.model._types import patch_dtype
from icl_lens.model._weight_edits import edits_applied
from icl_lens.thought._defaults import (
    DISTILL_BATCH,
    DISTILL_LR,
    DISTILL_STEPS,
    DISTILL_WARMUP,
    KIND_PARTS,
    ThoughtFit,
)
from icl_lens.thought._divergence import answer_reference, text_reference
from icl_lens.thought._instruction_batches import calibration_ids, continuation_ids, text_ids, with_bos
from icl_lens.thought._preserve import preserve_texts
from icl_lens.thought._result import ThoughtPatch, thought_edits

def learning_rate(step: int, steps: int, lr: float) -> float:
    """Linear warm-up over the first ``DISTILL_WARMUP`` share of the steps, then cosine decay to 0."""
    warm = max(1, int(DISTILL_WARMUP * steps))
    if step < warm:
        return lr * (step + 1) / warm
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def distill_patch(
    model, instruction: str, queries: Sequence[str], fit: ThoughtFit | None = None, *, steps: int = DISTILL_STEPS,
    lr: float = DISTILL_LR, batch: int = DISTILL_BATCH, seed: int = 0, progress: bool = True,
    preserve_weight: float = 0.0, validation: Sequence[str] | None = None,
    held_out: Sequence[Sequence[int]] | None = None, eval_every: int = 10, patience: int = 3, **settings,
) -> ThoughtPatch:
    """Context distillation of ``instruction`` into the thought patch's parameters (see the module docstring).

    ``fit``, ``settings``: a :class:`~icl_lens.thought.ThoughtFit` and keyword arguments replacing its fields, as
    :func:`~icl_lens.thought.thought_patch` takes them; the distillation reads its ``kind`` (which parameters
    train), ``query_prefix``, ``answer_tokens`` and ``layers`` (the least-squares settings do not apply).
    ``steps``, ``lr``, ``batch``, ``seed``: the optimiser's (the documented schedule). ``preserve_weight``,
    ``validation``, ``held_out``, ``eval_every``, ``patience``: the locality term and early stopping (the module
    docstring); without ``validation`` the last step's edit is returned.
    """
    fit = ThoughtFit.of(fit, **settings)
    kind, query_prefix, answer_tokens, layers = fit.kind, fit.query_prefix, fit.answer_tokens, fit.layers
    for name, value in (("steps", steps), ("batch", batch)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if not (isinstance(preserve_weight, (int, float)) and math.isfinite(preserve_weight) and preserve_weight >= 0):
        raise ValueError(f"preserve_weight must be a finite number >= 0, got {preserve_weight!r}")
    for name, value in (("eval_every", eval_every), ("patience", patience)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if validation is not None and not list(validation):
        raise ValueError("validation must hold at least one query")
    if preserve_weight and validation is not None and not held_out:
        raise ValueError("early stopping with a preserve term needs held_out texts")
    instr, q_ids, pre = calibration_ids(model, instruction, queries, query_prefix)
    cfg, family, dtype = model.cfg, block_family(model), patch_dtype(model)
    chosen = list(range(cfg.n_layers)) if layers is None else sorted({int(l) for l in layers})
    if not chosen or not all(0 <= l < cfg.n_layers for l in chosen):
        raise ValueError(f"layers must be a non-empty subset of 0..{cfg.n_layers - 1}, got {layers}")
    answers = continuation_ids(model, instr, q_ids, answer_tokens) if answer_tokens else [[] for _ in q_ids]
    rows = [q + a for q, a in zip(q_ids, answers)]
    # The teacher: next-token log-probabilities of the full prompt at every position of x y (fixed).
    teacher = [t.double().log_softmax(-1).to(dtype) for t in
               tail_logits(model, [with_bos(model, instr + r) for r in rows], [len(r) for r in rows])]
    student = [with_bos(model, pre + r) for r in rows]
    parts = KIND_PARTS[kind]
    d, dev = cfg.d_model, cfg.device
    n = cfg.n_layers
    params = {"maps": torch.zeros(n, d, d, dtype=dtype, device=dev, requires_grad="matrix" in parts),
              "vectors": torch.zeros(n, d, dtype=dtype, device=dev, requires_grad="vector" in parts),
              "down": torch.zeros(n, d, cfg.d_mlp, dtype=dtype, device=dev, requires_grad="down" in parts)}
    trained = [p for p in params.values() if p.requires_grad]
    eye = torch.eye(d, dtype=dtype, device=dev)

    def edits():
        # unbind, not params[k][l]: one backward stacks the layers' gradients, where indexing would fill and add a
        # zero gradient of the whole stack per layer
        maps, vecs, down = (params[k].unbind(0) for k in ("maps", "vectors", "down"))
        return thought_edits({l: maps[l] for l in chosen} if "matrix" in parts else {},
                             {l: vecs[l] for l in chosen} if "vector" in parts else {}, family.vector_site,
                             {l: (eye, down[l]) for l in chosen} if "down" in parts else {})

    keep = []  # the preserve texts ([BOS] + ids), for the locality term
    if preserve_weight:
        texts = fit.preserve if fit.preserve is not None else preserve_texts(model)
        keep = [with_bos(model, text_ids(model, t, what=f"preserve text {i}")) for i, t in enumerate(texts)]
        if not keep:
            raise ValueError("preserve_weight > 0 needs preserve texts")
    keep_ref = text_reference(model, keep) if keep else None  # the unedited side of the preserve term, once
    if validation is not None:  # the reference side of the held-out objective, computed once
        answer_ref = answer_reference(model, instruction, validation, query_prefix=query_prefix,
                                      answer_tokens=answer_tokens)
        text_ref = text_reference(model, held_out) if preserve_weight else None

    def result(values: dict, record: dict) -> ThoughtPatch:
        with torch.no_grad():
            maps, vecs, down = (values[k].detach().clone() for k in ("maps", "vectors", "down"))
            down_u = eye.expand(n, d, d).clone() if "down" in parts else torch.zeros(n, 0, d, dtype=dtype, device=dev)
            down_v = down if "down" in parts else torch.zeros(n, 0, cfg.d_mlp, dtype=dtype, device=dev)
            for l in range(n):
                if l not in chosen and "down" in parts:
                    down_u[l] = 0
        zeros = torch.zeros(n, dtype=torch.float64)
        return ThoughtPatch(
            model_name=cfg.model_name, family=family.name, vector_site=family.vector_site, instruction=instruction,
            queries=tuple(queries), kind=kind, eta=1.0, ridge=0.0, iterations=1, layers=tuple(chosen),
            query_prefix=query_prefix, maps=maps, vectors=vecs, down_u=down_u, down_v=down_v,
            matrix_residual=zeros, vector_residual=zeros, down_residual=zeros.clone(),
            n_tokens=sum(len(r) for r in rows), answer_tokens=answer_tokens, model=model, method="distill",
            settings=record, fit=fit)

    def held_out_score(values: dict) -> dict:
        edit = result(values, {})
        answer = answer_ref.kl(edit)
        text = text_ref.kl(edit) if text_ref is not None else 0.0
        return {"answer_kl": answer, "text_kl": text, "objective": answer + preserve_weight * text}

    optimizer = torch.optim.Adam(trained, lr=lr, betas=(0.9, 0.999))
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    rng, order, losses = random.Random(seed), [], []
    keep_order: list[int] = []
    checkpoints, best, since_best = [], None, 0
    try:
        for p, _ in frozen:
            p.requires_grad_(False)
        bar = tqdm(range(steps), desc="distill", disable=not progress, leave=False)
        for step in bar:
            if len(order) < batch:
                perm = list(range(len(rows)))
                rng.shuffle(perm)
                order += perm
            chunk, order = order[:batch], order[batch:]
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, steps, lr)
            ids = right_padded([student[i] for i in chunk], pad_id(model), dev)
            with edits_applied(model, edits()):
                logits = model(ids)
            loss = 0.0
            count = sum(len(rows[i]) for i in chunk)
            for k, i in enumerate(chunk):
                start = len(student[i]) - len(rows[i])
                q = logits[k, start : len(student[i])].to(dtype).log_softmax(-1)
                p_log = teacher[i]
                loss = loss + (p_log.exp() * (p_log - q)).sum()
            loss = loss / count
            if keep:
                if len(keep_order) < batch:
                    perm = list(range(len(keep)))
                    rng.shuffle(perm)
                    keep_order += perm
                picked, keep_order = keep_order[:batch], keep_order[batch:]
                loss = loss + preserve_weight * _preserve_kl(model, [keep[i] for i in picked],
                                                             [keep_ref.logits[i] for i in picked], edits, dtype)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            bar.set_postfix(kl=f"{losses[-1]:.3f}")
            if validation is not None and ((step + 1) % eval_every == 0 or step + 1 == steps):
                score = {"step": step + 1, **held_out_score(params)}
                checkpoints.append(score)
                if best is None or score["objective"] < best[0]["objective"]:
                    best, since_best = (score, {k: v.detach().clone() for k, v in params.items()}), 0
                else:
                    since_best += 1
                    if since_best >= patience:
                        break
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    chosen_values = params if best is None else best[1]
    record = {"steps": steps, "lr": lr, "batch": batch, "seed": seed, "warmup": DISTILL_WARMUP,
                "first_loss": losses[0], "last_loss": losses[-1], "preserve_weight": float(preserve_weight),
                "steps_run": len(losses)}
    if best is not None:
        record.update({"chosen_step": best[0]["step"], "checkpoints": checkpoints, "eval_every": eval_every,
                         "patience": patience})
    return result(chosen_values, record)


def _preserve_kl(model, texts, references, edits, dtype) -> torch.Tensor:
    """Mean next-token ``KL(unpatched ‖ edited)`` over every position of ``texts`` (``[BOS] + ids``; ``references``:
    the unpatched logits of each): the distillation's locality term, differentiable in the edit. One text per
    forward: the preserve texts' lengths vary about twofold, and padding would run the difference."""
    total = 0.0
    with edits_applied(model, edits()):
        for t, ref in zip(texts, references):
            p_log = ref.to(dtype).log_softmax(-1)
            new = model(torch.tensor([t], device=model.cfg.device))[0].to(dtype).log_softmax(-1)
            total = total + (p_log.exp() * (p_log - new)).sum()
    return total / sum(len(t) for t in texts)
