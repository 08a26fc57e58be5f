"""Greedy continuations of many prompts, batched by prompt length.

Prompts of equal length share a batch, so every row's last token sits at the same
position and only the last position's logits are computed: each step's forward stops at
the unembedding's input and :func:`unembedded` reads those rows (for Gemma 3 the 262k-row
unembedding is never applied to the whole prompt, and a batch of a few rows reads it
once, not once a row). The key/value
cache is kept across steps (a plain ``DynamicCache``, as :mod:`icl_lens.patches._incremental`
uses), so each step runs the new token only. The tokens every prompt starts with (an
instruction and its examples, the same for every query) go through the model once: each
batch starts from their keys and values instead of running them again (causal attention:
they do not depend on what follows). Whatever hooks are active on the model (a
thought patch, for example) act on every step, and the cached keys and values were
computed under them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from transformers import DynamicCache

from icl_lens.model._prompts import PromptError, context_limit
from icl_lens.model._reading import activations_captured, hooked


@torch.no_grad()
def greedy_continuations(
    model, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, batch_size: int = 16,
    finished: Callable[[int, list[int]], bool] | None = None,
    before_step: Callable[[list[int], int], None] | None = None, feed_last: bool = False,
    share: int | None = None,
) -> list[list[int]]:
    """Token ids greedily generated after each prompt (at most ``max_new_tokens`` each).

    ``finished(i, new_ids)``: optional early stop; a batch stops once it holds for every row.
    A prompt whose length plus ``max_new_tokens`` passes the model's context raises :class:`PromptError`.
    The first tokens that all prompts have in common (at most ``share``, None: all of them; never a whole
    prompt) run once, in a forward of their own, when there are at least :data:`SHARED_MIN` of them and more
    than one prompt. For hooks that read the forwards: ``before_step(rows, step)`` is called before each
    (``rows``: the batch's prompt indices; step 0 runs the prompts, from the first token not shared, step ``k``
    the ``k``-th new token; the shared tokens' forward has ``rows == []``, none of its rows being one prompt's),
    and ``feed_last`` adds one forward that reads the last new token (stopped before the unembedding), so every
    new token has been read once.
    """
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    limit = context_limit(model)
    for i, p in enumerate(prompts):
        if len(p) + max_new_tokens > limit:
            raise PromptError(f"prompt {i} has {len(p)} tokens and up to {max_new_tokens} more are to be generated "
                              f"({len(p) + max_new_tokens}), past the model's context of {limit} tokens")
    device = model.cfg.device
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    out: list[list[int]] = [[] for _ in prompts]
    shared, head = shared_length(prompts, share), DynamicCache()  # head: the shared tokens' keys and values
    if shared:
        if before_step is not None:
            before_step([], 0)
        _last_hidden(model, torch.tensor([list(prompts[0][:shared])], dtype=torch.long, device=device), head)
    for _, rows in sorted(groups.items()):
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            ids = torch.tensor([list(prompts[i]) for i in chunk], dtype=torch.long, device=device)
            step, cache = ids[:, shared:], DynamicCache()
            for layer_idx, layer in enumerate(head.layers):  # the shared keys and values, one copy a row
                cache.update(layer.keys.expand(len(chunk), -1, -1, -1), layer.values.expand(len(chunk), -1, -1, -1),
                             layer_idx)
            for n in range(max_new_tokens):
                if before_step is not None:
                    before_step(chunk, n)
                step = unembedded(model, _last_hidden(model, step, cache)).argmax(-1)[:, None]
                ids = torch.cat([ids, step], dim=1)
                if finished is not None and all(
                    finished(i, ids[k, len(prompts[i]) :].tolist()) for k, i in enumerate(chunk)
                ):
                    break
            if feed_last:
                if before_step is not None:
                    before_step(chunk, n + 1)
                _last_hidden(model, step, cache)  # for the hooks' reads: no unembedding
            for k, i in enumerate(chunk):
                out[i] = ids[k, len(prompts[i]) :].tolist()
    return out


SHARED_MIN = 4  # fewer tokens in common than this are run with each batch (their own forward would not pay)


def shared_length(prompts: Sequence[Sequence[int]], share: int | None = None) -> int:
    """How many first tokens :func:`greedy_continuations` runs once for all ``prompts``: those every prompt starts
    with, at most ``share`` and one fewer than the shortest prompt; 0 for one prompt or fewer than
    :data:`SHARED_MIN`."""
    if len(prompts) < 2:
        return 0
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    if share is not None:
        n = min(n, share)
    k = 0
    while k < n and all(p[k] == first[k] for p in prompts):
        k += 1
    return k if k >= SHARED_MIN else 0


def _last_hidden(model, ids: Tensor, cache: DynamicCache) -> Float[Tensor, "batch d_model"]:
    """The forward of ``ids`` over ``cache`` (filled in place), stopped at the unembedding's input: its last
    position's row of every sequence, for :func:`unembedded` (few rows: one read of the unembedding, not one a
    row)."""
    rows: list[Tensor] = []
    with activations_captured(model, [("unembed.hook_in", lambda x, hook: rows.append(x[:, -1]))],
                              stop_after="unembed.hook_in"):
        model(ids, past_key_values=cache, return_type=None)
    return rows[0]


def tail_logits(model, prompts: Sequence[Sequence[int]], counts: Sequence[int], *,
                batch_size: int = 16) -> list[torch.Tensor]:
    """Logits at the last ``counts[i]`` positions of each prompt, ``[counts[i], vocab]`` each.

    Prompts of equal length and count share a batch; only those positions are unembedded.
    """
    if len(counts) != len(prompts) or any(not 1 <= c <= len(p) for c, p in zip(counts, prompts)):
        raise ValueError("counts must give, for each prompt, between 1 and its length positions")
    device = model.cfg.device
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (p, c) in enumerate(zip(prompts, counts)):
        groups.setdefault((len(p), c), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(prompts)
    with torch.no_grad():
        for (_, count), rows in sorted(groups.items()):
            for start in range(0, len(rows), batch_size):
                chunk = rows[start : start + batch_size]
                ids = torch.tensor([list(prompts[i]) for i in chunk], dtype=torch.long, device=device)
                logits = model(ids, logits_to_keep=count)[:, -count:]
                for k, i in enumerate(chunk):
                    out[i] = logits[k]
    return out


def last_logits(model, prompts: Sequence[Sequence[int]], *, batch_size: int = 16) -> torch.Tensor:
    """Logits at the last position of each prompt, ``[n_prompts, vocab]``."""
    return torch.cat(tail_logits(model, prompts, [1] * len(prompts), batch_size=batch_size))


FEW_ROWS = 32  # up to this many rows, :func:`unembedded` multiplies the weight itself, strip by strip
VOCAB_STRIP = 1024  # rows of the ``[vocab, d_model]`` weight per product on the CPU


@torch.no_grad()
def unembedded(model, hidden: Float[Tensor, "n d_model"], *, as_forward: bool = False) -> Float[Tensor, "n vocab"]:
    """The model's own readout of inputs to its unembedding (``unembed.hook_in`` rows): the unembedding, then its
    logit transform (Gemma's soft cap). Several rows share one read of the unembedding's weights.

    Up to :data:`FEW_ROWS` rows of a plain linear float32 or float64 unembedding with no hook on it (unless
    ``as_forward``: the module itself, rounded exactly as the model's forward rounds its logits, as
    :func:`~icl_lens.patches._token_patches.noise_floor` needs), the product is taken weight first,
    ``W_U[strip] @ hiddenᵀ`` for :data:`VOCAB_STRIP` vocabulary rows at a time on the CPU: torch's CPU ``linear``
    of a few rows reads the weight (0.67 GB on Gemma 3 270M) about once a row or picks a slow kernel, this form
    reads it about once for all (the keystroke's predictions, each greedy step). The same products, summed in
    another order (float rounding apart, the same logits).
    """
    unembed = model.unembed
    head = getattr(unembed, "original_component", None)
    if (not as_forward and hidden.shape[0] <= FEW_ROWS and type(head) is torch.nn.Linear and not hooked(unembed, head)
            and head.weight.dtype == hidden.dtype and hidden.dtype in (torch.float32, torch.float64)):
        weight, rows = head.weight, hidden.T
        if weight.device.type == "cpu":
            out = hidden.new_empty(weight.shape[0], hidden.shape[0])
            for start in range(0, weight.shape[0], VOCAB_STRIP):
                torch.mm(weight[start:start + VOCAB_STRIP], rows, out=out[start:start + VOCAB_STRIP])
        else:
            out = weight @ rows
        logits = out.T + head.bias if head.bias is not None else out.T.contiguous()
        return model.adapter.apply_output_logits_transform(logits[None])[0]
    return model.adapter.apply_output_logits_transform(unembed(hidden[None]))[0]
