"""Turn a prompt (text or token ids) into validated token ids for a bridge, and many of them into one right-padded batch."""
from __future__ import annotations

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


def encode_prompt(model, prompt: str | Sequence[int] | Tensor) -> Int[Tensor, " pos"]:
    """Token ids of ``prompt`` (BOS prepended for text, as the tokenizer/bridge does)."""
    check_model(model)
    if isinstance(prompt, str):
        if not prompt.strip():
            raise PromptError("The prompt is empty (or only whitespace); type some text to analyse.")
        ids = model.to_tokens(prompt, truncate=False)[0]
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
    return ids.to(model.cfg.device)


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
