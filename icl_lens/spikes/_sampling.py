"""Sampled continuations of one prompt, batched: the answers behind the sampling-agreement baseline.

``n`` continuations of one prompt are drawn from ``softmax(logits / T)`` as one batch: the
prompt's keys and values (:class:`PromptState`, :func:`prompt_state`) are repeated ``n``
times, and each row stops at its own stop string or EOS. Draws are by inverse CDF with a
seeded generator (:func:`sample_seed` derives one from the prompt's text), so a rerun draws
the same samples. How many samples agree with the greedy answer (``sampling_disagreement``
in :mod:`icl_lens.spikes._detector`) is the cheap form of semantic-entropy detection
(Kuhn et al. 2023, arXiv 2302.09664).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass(frozen=True)
class PromptState:
    """The prompt's keys and values (one ``(keys, values)`` per layer, batch 1) and the logits after it."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    logits: torch.Tensor  # vocab


@torch.no_grad()
def prompt_state(model, ids: torch.Tensor, *, session=None) -> PromptState:
    """The prompt's keys and values and the logits after it: one forward, over only the last token when
    ``session`` (a :class:`icl_lens.PatchSession` whose last update starts with ``ids``) lends the rest."""
    ids = ids.reshape(-1)
    n = len(ids) - 1
    lent = session.prefix_cache(ids, n) if session is not None and n > 0 else None
    cache, start = (lent[0], n) if lent is not None else (DynamicCache(), 0)
    logits, cache = model(ids[None, start:], past_key_values=cache, return_type="logits_and_cache", logits_to_keep=1)
    return PromptState(tuple((layer.keys, layer.values) for layer in cache.layers),
                       logits[0, -1, :int(model.cfg.d_vocab)])


def stopped(model, tokens: list[int], stop: str, eos) -> bool:
    """Whether a continuation ends here: its last token is EOS or its text contains ``stop``."""
    return (eos is not None and tokens[-1] == eos) or stop in model.tokenizer.decode(tokens)


def sample_seed(text: str, seed: int = 0) -> int:
    """The sampling generator's seed for one question: CRC-32 of its input text, plus ``seed``."""
    return (zlib.crc32(text.encode("utf-8")) + seed) % 2**63


@torch.no_grad()
def sample_continuations(model, prompt: PromptState, *, n: int, temperature: float, max_new_tokens: int,
                         generator: torch.Generator, stop: str = "\n") -> list[list[int]]:
    """``n`` continuations sampled from ``softmax(logits / temperature)`` as one batch (module docstring).

    Each row stops at EOS, once its text contains ``stop``, or after ``max_new_tokens`` (the
    stopping token is kept). A stopped row leaves the batch (its keys and values are dropped),
    so later steps cost only the rows still running; every step draws ``n`` uniforms whatever
    the rows left, so row ``i``'s draws do not depend on when the others stopped.
    """
    if n < 1 or not temperature > 0:
        raise ValueError(f"need n >= 1 samples and a temperature > 0, got {n} and {temperature}")
    vocab = int(model.cfg.d_vocab)
    eos = getattr(model.tokenizer, "eos_token_id", None)
    cache = DynamicCache()
    for index, (keys, values) in enumerate(prompt.layers):
        cache.update(keys.repeat(n, 1, 1, 1), values.repeat(n, 1, 1, 1), index)
    logits = prompt.logits[None].expand(n, -1)
    out: list[list[int]] = [[] for _ in range(n)]
    active = list(range(n))  # the rows still running, in batch order
    for k in range(max_new_tokens):
        # inverse-CDF draw (torch.multinomial over a 262k vocabulary costs ~0.1 s a row on one core)
        cdf = torch.cumsum(torch.softmax(logits[:, :vocab].detach().double().cpu() / temperature, dim=-1), dim=-1)
        u = torch.rand(n, 1, generator=generator, dtype=torch.float64)[active] * cdf[:, -1:]
        step = torch.searchsorted(cdf, u, right=True).clamp_(max=vocab - 1)
        keep = []
        for j, (row, token) in enumerate(zip(active, step[:, 0].tolist())):
            out[row].append(token)
            if not stopped(model, out[row], stop, eos):
                keep.append(j)
        if not keep or k == max_new_tokens - 1:
            break
        if len(keep) < len(active):
            index = torch.tensor(keep, device=prompt.logits.device)
            cache.batch_select_indices(index)
            step, active = step[keep], [active[j] for j in keep]
        logits, cache = model(step.to(prompt.logits.device), past_key_values=cache, return_type="logits_and_cache",
                              logits_to_keep=1)
        logits = logits[:, -1]
    return out
