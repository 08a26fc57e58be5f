"""Text a model must read as it did before an edit: the keys a thought patch's fit preserves.

MEMIT (Meng et al. 2023, arXiv 2210.07229) and AlphaEdit (Fang et al. 2025, arXiv
2410.02355) keep an edit local with the covariance ``K₀K₀ᵀ`` of a layer's inputs on
general text. Here that text has two parts, never a task's queries and never the texts
that *measure* locality (``tasks/locality.json``):

- the model's own general text: ``n`` continuations of ``[BOS]`` alone, ``tokens`` new
  tokens each, sampled at temperature 1 with a fixed seed (:func:`bos_samples`);
- few-shot prompts (``tasks/preserve/few_shot.json``, the same for every model): small
  tasks of other kinds, each a header and solved examples in one of several formats. A
  thought patch is fitted on queries read without an instruction, and the model's samples
  hardly ever hold a few-shot prompt, so without these the fit is free to change what the
  model computes where another prompt's demonstrations and queries sit (seen on
  SmolLM2-135M capitals in issue 22's selection: with the samples alone the edited model
  kept few of another few-shot task's answers; ``reports/eval_thought.md``, "Preserve
  strength", shows both preserve sets).

Both are package data written by ``python -m experiments.thought.preserve_samples``
(:data:`PRESERVE_DIR`; for a model without shipped samples they are sampled on the fly).
:func:`preserve_texts` returns them: ``split="fit"``, what fits use (the first half of the
samples and the even-numbered prompts), ``split="held_out"`` (the rest), which only scores
the choice of the penalty's strength, or ``"all"`` (fit, then held out).
"""
from __future__ import annotations

import json
import weakref

import torch
from transformers import DynamicCache

from icl_lens.model._prompts import bos_id, context_limit
from icl_lens.model._reading import NonFiniteActivationError
from icl_lens.thought.tasks import TASK_DIR

PRESERVE_DIR = TASK_DIR / "preserve"
N_SAMPLES, SAMPLE_TOKENS, SAMPLE_SEED = 64, 32, 0
SPLITS = ("fit", "held_out", "all")


@torch.no_grad()
def bos_samples(model, n: int = N_SAMPLES, tokens: int = SAMPLE_TOKENS, *, seed: int = SAMPLE_SEED,
                batch_size: int = 16) -> list[str]:
    """``n`` texts the model writes after ``[BOS]`` alone: ``tokens`` new tokens each, temperature 1, seeded.

    Texts that decode to nothing but whitespace are dropped (so fewer than ``n`` may come back).
    """
    if n < 1 or tokens < 1:
        raise ValueError(f"n and tokens must be >= 1, got {n} and {tokens}")
    bos = bos_id(model)
    if bos is None:
        raise ValueError("bos_samples needs a tokenizer with a BOS token")
    gen = torch.Generator().manual_seed(seed)
    texts = []
    for start in range(0, n, batch_size):
        rows = min(batch_size, n - start)
        step = torch.full((rows, 1), bos, dtype=torch.long, device=model.cfg.device)
        cache, new = DynamicCache(), []
        for _ in range(tokens):
            logits, cache = model(step, past_key_values=cache, return_type="logits_and_cache", logits_to_keep=1)
            probs = logits[:, -1].double().softmax(-1).cpu()
            if not torch.isfinite(probs).all():
                raise NonFiniteActivationError(f"the model's logits after BOS are NaN or infinite (sampling preserve "
                                               f"text, new token {len(new)}); its weights or inputs are broken")
            step = torch.multinomial(probs, 1, generator=gen).to(model.cfg.device)
            new.append(step)
        for ids in torch.cat(new, dim=1).tolist():
            text = model.tokenizer.decode(ids, skip_special_tokens=True)
            if text.strip():
                texts.append(text)
    return texts


FEW_SHOT_FILE = PRESERVE_DIR / "few_shot.json"
_SAMPLED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its samples (no shipped file)


def preserve_file(model_name: str):
    return PRESERVE_DIR / f"{model_name}.json"


def few_shot_texts() -> list[str]:
    """The shipped few-shot prompts (``tasks/preserve/few_shot.json``), in order."""
    return json.loads(FEW_SHOT_FILE.read_text(encoding="utf-8"))["texts"]


def _within_context(model, text: str) -> str:
    """``text``, cut to the tokens that fit in the model's context after BOS (small test models have 256)."""
    room = context_limit(model) - 1
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= room else model.tokenizer.decode(ids[:room])


def preserve_texts(model, split: str = "fit") -> tuple[str, ...]:
    """The model's preserve texts: its samples from BOS (shipped for the embedded models, else sampled here) and
    the shipped few-shot prompts (each cut to the model's context where it is longer); ``split``: ``"fit"`` (the
    first half of the samples, the even-numbered prompts), ``"held_out"`` (the rest) or ``"all"`` (fit, then held
    out)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = preserve_file(model.cfg.model_name)
    if path.exists():
        samples = json.loads(path.read_text(encoding="utf-8"))["texts"]
    else:  # sampled once per model object
        samples = _SAMPLED.get(model) or _SAMPLED.setdefault(model, bos_samples(model))
    prompts = [_within_context(model, t) for t in few_shot_texts()]
    half = len(samples) // 2
    fit = (*samples[:half], *prompts[0::2])
    held_out = (*samples[half:], *prompts[1::2])
    return fit + held_out if split == "all" else fit if split == "fit" else held_out
