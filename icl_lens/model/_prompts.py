"""Turn a prompt (text or token ids) into validated token ids for a bridge, and many of them into one right-padded batch.

A prompt is tokenised and checked once: :func:`encode_prompt` remembers (per model, weakly) the id tensors it
returned, and a later call with one of them, or with a 1-D view of one (a prefix, say), returns it unchecked, so
ids encoded once can be passed down through every public function without being checked again. (Ids changed in
place after encoding are not checked again either.)
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from icl_lens.model._model_check import check_model
from icl_lens.model._per_model import model_cache


class PromptError(ValueError):
    """The prompt is empty, too long, or not token ids."""


def context_limit(model) -> int:
    return int(model.cfg.n_ctx)


def bos_id(model) -> int | None:
    tok = getattr(model, "tokenizer", None)
    return None if tok is None else tok.bos_token_id


def _encoded(model, ids) -> bool:
    """Whether ``ids`` is (a 1-D, non-empty view of) a tensor :func:`encode_prompt` returned for ``model``."""
    if not isinstance(ids, Tensor) or ids.ndim != 1 or ids.numel() == 0:
        return False
    seen = model_cache(model, "encoded")
    return any((ref := seen.get(id(t))) is not None and ref() is t for t in (ids, ids._base) if t is not None)


def _remember(model, ids: Tensor) -> Tensor:
    """``ids`` (its own storage, so that its views name it as their base), remembered as encoded for ``model``."""
    ids = ids.clone() if ids._base is not None else ids
    seen = model_cache(model, "encoded")
    if len(seen) > 256:  # forget the tensors that are gone
        for key in [k for k, ref in seen.items() if ref() is None]:
            del seen[key]
    seen[id(ids)] = weakref.ref(ids)
    return ids


def tokenize(model, text: str) -> Int[Tensor, " pos"]:
    """Token ids of ``text`` with BOS prepended (as the tokenizer/bridge does), unchecked for length; a
    :class:`PromptError` if there is nothing to read."""
    if not isinstance(text, str) or not text.strip():
        raise PromptError("The prompt is empty (or only whitespace); type some text to analyse.")
    return model.to_tokens(text, truncate=False)[0]


def encode_prompt(model, prompt: str | Sequence[int] | Tensor) -> Int[Tensor, " pos"]:
    """Token ids of ``prompt`` (BOS prepended for text, as the tokenizer/bridge does), checked once (module docstring)."""
    if _encoded(model, prompt):
        return prompt
    check_model(model)
    if isinstance(prompt, str):
        ids = tokenize(model, prompt)
    else:
        ids = torch.as_tensor(prompt)
        if ids.numel() == 0:
            raise PromptError("The prompt has no tokens.")
        if ids.is_floating_point() or ids.ndim > 2 or (ids.ndim == 2 and ids.shape[0] != 1):
            raise PromptError(f"token ids must be a 1-D integer sequence, got shape {tuple(ids.shape)} {ids.dtype}")
        ids = ids.flatten().long()
        vocab = int(model.cfg.d_vocab)
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise PromptError(f"token ids must lie in [0, {vocab}); got {int(ids.min())}..{int(ids.max())}")
    limit = context_limit(model)
    if ids.numel() > limit:
        raise PromptError(
            f"The prompt has {ids.numel()} tokens but {model.cfg.model_name or 'this model'} "
            f"handles at most {limit} (its context length). Shorten the prompt."
        )
    return _remember(model, ids.to(model.cfg.device))


def encode_prompts(model, prompts: Sequence) -> list[Int[Tensor, " pos"]]:
    """Token ids of every prompt; an error names the prompt it comes from."""
    out = []
    for i, prompt in enumerate(prompts):
        try:
            out.append(encode_prompt(model, prompt))
        except PromptError as err:
            raise PromptError(f"prompt {i}: {err}") from None
    return out


def pad_id(model) -> int:
    """The id used for padding: the tokenizer's pad, else EOS, else BOS, else 0 (never attended)."""
    tok = model.tokenizer
    for cand in (tok.pad_token_id, tok.eos_token_id, bos_id(model)):
        if cand is not None:
            return int(cand)
    return 0


def right_padded(sequences: Sequence[Sequence[int]], pad: int, device) -> Int[Tensor, "batch pos"]:
    """Stack ``sequences`` into one tensor, right-padded with ``pad``."""
    width = max(len(s) for s in sequences)
    out = torch.full((len(sequences), width), pad, dtype=torch.long)
    for row, s in enumerate(sequences):
        out[row, : len(s)] = torch.as_tensor(s, dtype=torch.long).cpu()
    return out.to(device)


def str_tokens(model, ids: Int[Tensor, " pos"]) -> tuple[str, ...]:
    """Readable text of each token (repeated tokens stay separate entries)."""
    tok = model.tokenizer
    # Decoding is per-token work on the CPU (~10 µs each); a per-model cache keeps long prompts and
    # sweeps from paying it again for ids already seen, and unseen ids are decoded in one call.
    state = model_cache(model, "token_text")
    if state.get("tokenizer") is not tok:
        state.clear()
        state["tokenizer"], state["text"] = tok, {}
    cache = state["text"]
    id_list = ids.tolist()
    new = sorted({i for i in id_list if i not in cache})
    if new:
        cache.update(zip(new, tok.batch_decode([[i] for i in new])))
    return tuple(cache[i] for i in id_list)
