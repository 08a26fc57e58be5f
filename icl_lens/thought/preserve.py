"""General text a model reads as it is: its own samples from BOS, the keys a thought patch's fit preserves.

MEMIT (Meng et al. 2023, arXiv 2210.07229) and AlphaEdit (Fang et al. 2025, arXiv
2410.02355) keep an edit local with the covariance ``K₀K₀ᵀ`` of a layer's inputs on
general text. Here that text is the model's own: ``n`` continuations of ``[BOS]`` alone,
``tokens`` new tokens each, sampled at temperature 1 with a fixed seed
(:func:`bos_samples`): text the model itself finds typical, never a task's queries and
never the texts that *measure* locality (``tasks/locality.json``).

For the embedded models the samples are package data, ``tasks/preserve/<model>.json``,
written by ``python -m experiments.thought.preserve_samples`` (:data:`PRESERVE_DIR`);
:func:`preserve_texts` reads them, or samples them on the fly for any other model. The
first half of the samples (``split="fit"``) is what fits use; the second half
(``split="held_out"``) only scores the choice of the penalty's strength.
"""
from __future__ import annotations

import json

import torch
from transformers import DynamicCache

from icl_lens.model.prompts import bos_id
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
            step = torch.multinomial(probs, 1, generator=gen).to(model.cfg.device)
            new.append(step)
        for ids in torch.cat(new, dim=1).tolist():
            text = model.tokenizer.decode(ids, skip_special_tokens=True)
            if text.strip():
                texts.append(text)
    return texts


def preserve_file(model_name: str):
    return PRESERVE_DIR / f"{model_name}.json"


def preserve_texts(model, split: str = "fit") -> tuple[str, ...]:
    """The model's preserve texts (shipped samples for the embedded models, else sampled here); ``split``:
    ``"fit"`` (first half), ``"held_out"`` (second half) or ``"all"``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = preserve_file(model.cfg.model_name)
    texts = json.loads(path.read_text(encoding="utf-8"))["texts"] if path.exists() else bos_samples(model)
    half = len(texts) // 2
    return tuple(texts if split == "all" else texts[:half] if split == "fit" else texts[half:])
