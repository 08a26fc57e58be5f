"""Token ids of instruction + query prompts, batched with right padding, and reading them.

Thought patches (arXiv 2510.08734) compare a query read after an instruction,
``[BOS] + ids(instruction) + ids(query)``, with the same query without it,
``[BOS] + ids(prefix) + ids(query)``, where ``prefix`` is the patch's fixed *query
prefix* (empty, or e.g. a newline: the same few tokens at fit and at use, see
:mod:`icl_lens.thought._fit`). Instruction, prefix and query are tokenised separately so
the query's tokens are identical in both sequences. BOS is kept as in the rest of
icl_lens (attention sink, docs/design.md §2). Right padding needs no attention mask in
a causal model: real tokens never see the padding after them, and position ids stay
0, 1, 2, … for every row.

:func:`read_query_tokens` runs a batch (with any hooks, e.g. weight edits) and gathers
hook points at every query token, and optionally at every position before the query
(BOS and the prefix, the *anchor* positions): fits and steering vectors read
activations through it. Given the batch's :func:`batch_steps` (the residual entering one
block kept per chunk, :class:`~icl_lens.model._reading.LayerSteps`), it runs that block
alone instead of the forward, so a fit that visits the layers in order costs one block
per read, not a forward up to it.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from icl_lens.model._greedy import greedy_continuations
from icl_lens.model._model_check import check_model
from icl_lens.model._prompts import PromptError, bos_id, context_limit, pad_id, right_padded
from icl_lens.model._reading import LayerSteps, activations_captured, layer_steps
from icl_lens.model._weight_edits import MLPEdit, edits_applied


def text_ids(model, text: str, *, what: str = "text") -> list[int]:
    """Token ids of ``text`` without special tokens; a clear error if there are none."""
    check_model(model)
    if not isinstance(text, str):
        raise PromptError(f"{what} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise PromptError(f"{what} is empty (or only whitespace)")
    ids = list(model.tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise PromptError(f"{what} {text!r} tokenises to nothing")
    return ids


def prefix_ids(model, prefix: str) -> list[int]:
    """Token ids of a query prefix (may be empty or whitespace, e.g. ``"\\n"``)."""
    if not isinstance(prefix, str):
        raise PromptError(f"query prefix must be a string, got {type(prefix).__name__}")
    return list(model.tokenizer(prefix, add_special_tokens=False)["input_ids"]) if prefix else []


def calibration_ids(model, instruction: str, queries: Sequence[str], query_prefix: str
                    ) -> tuple[list[int], list[list[int]], list[int]]:
    """Token ids of the instruction, of each calibration query and of the query prefix, checked."""
    if isinstance(queries, str):
        raise PromptError("queries must be a list of strings, not one string")
    queries = list(queries)
    if not queries:
        raise PromptError("the list of calibration queries is empty")
    return (text_ids(model, instruction, what="instruction"),
            [text_ids(model, q, what=f"query {i}") for i, q in enumerate(queries)],
            prefix_ids(model, query_prefix))


def continuation_ids(model, instruction: Sequence[int], queries: Sequence[Sequence[int]], max_tokens: int,
                     *, batch_size: int = 16) -> list[list[int]]:
    """The model's own greedy continuation of each ``[BOS] + instruction + query``, ``≤ max_tokens`` tokens.

    Each continuation ends after its first token whose text holds a newline (the end of
    a few-shot answer line), or at ``max_tokens``. These are the answer tokens the
    thought-patched model will read while it writes its answer without the instruction.
    """
    return continuations_read(model, instruction, queries, max_tokens, {}, batch_size=batch_size)[0]


@torch.no_grad()
def continuations_read(model, instruction: Sequence[int], queries: Sequence[Sequence[int]], max_tokens: int,
                       reads: dict[str, str], *, batch_size: int = 16, dtype: torch.dtype = torch.float32
                       ) -> tuple[list[list[int]], dict[str, Tensor]]:
    """:func:`continuation_ids` and, read from the same forwards, each hook point of ``reads`` (key → hook name) at
    every query token and every answer token, in order: what :func:`read_query_tokens` gives for
    ``query_batch(model, [q + a …], prefix=instruction)``, up to rounding (the greedy run reads BOS and the
    instruction once for all queries, each batch's queries over their keys and values, then one token a step
    over its key/value cache, and once more the last answer token), for one greedy run instead of a greedy run
    and a pass over the answered prompts."""
    if max_tokens < 1:
        return [[] for _ in queries], {}
    prompts = [with_bos(model, list(instruction) + list(q)) for q in queries]
    parts: dict[str, list[list[Tensor]]] = {key: [[] for _ in queries] for key in reads}
    at: dict[str, object] = {}

    def before_step(rows: list[int], step: int) -> None:
        at["rows"], at["step"] = rows, step

    def reader(key: str):
        def read(x, hook):
            for k, i in enumerate(at["rows"]):
                first = -len(queries[i]) if at["step"] == 0 else -1  # the query (the prompt's end), or the new token
                parts[key][i].append(x[k, first:].detach().to(dtype))
        return read

    def line_done(_: int, new: list[int]) -> bool:
        return "\n" in model.tokenizer.decode(new)

    with activations_captured(model, [(name, reader(key)) for key, name in reads.items()]) if reads else nullcontext():
        outs = greedy_continuations(model, prompts, max_tokens, batch_size=batch_size, finished=line_done,
                                    before_step=before_step, feed_last=bool(reads),
                                    share=len(prompts[0]) - len(queries[0]))  # BOS and the instruction, never the query
    cut = []
    for new in outs:
        for k in range(len(new)):
            if "\n" in model.tokenizer.decode(new[k : k + 1]):
                new = new[: k + 1]
                break
        cut.append(new)
    got = {key: torch.cat([torch.cat(parts[key][i])[: len(q) + len(a)] for i, (q, a) in enumerate(zip(queries, cut))])
           for key in reads}
    return cut, got


def with_bos(model, ids: Sequence[int]) -> list[int]:
    """``[BOS] + ids`` when the tokenizer has a BOS token, else ``ids``."""
    bos = bos_id(model)
    return ([bos] if bos is not None else []) + list(ids)


@dataclass(frozen=True)
class QueryBatch:
    """Sequences that each end with a query, and where the query's tokens sit."""

    sequences: tuple[tuple[int, ...], ...]
    query_start: tuple[int, ...]
    query_len: tuple[int, ...]

    @property
    def n_tokens(self) -> int:
        return sum(self.query_len)


def query_batch(model, queries: Sequence[Sequence[int]], prefix: Sequence[int] = ()) -> QueryBatch:
    """``[BOS] + prefix + query`` for each query (token ids), checked against the context length."""
    head = with_bos(model, prefix)
    seqs = tuple(tuple(head + list(q)) for q in queries)
    limit = context_limit(model)
    longest = max(len(s) for s in seqs)
    if longest > limit:
        raise PromptError(f"instruction + query is {longest} tokens; the model handles at most {limit}")
    return QueryBatch(seqs, tuple(len(head) for _ in seqs), tuple(len(q) for q in queries))


def anchor_positions(batch: QueryBatch, rows: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Flat (row-in-chunk, position) indices of every position before the query (BOS, prefix) of ``rows``."""
    r, p = [], []
    for k, row in enumerate(rows):
        r.extend([k] * batch.query_start[row])
        p.extend(range(batch.query_start[row]))
    return torch.tensor(r, dtype=torch.long), torch.tensor(p, dtype=torch.long)


def query_positions(batch: QueryBatch, rows: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Flat (row-in-chunk, position) indices of every query token of ``rows``, in order."""
    r, p = [], []
    for k, row in enumerate(rows):
        start, n = batch.query_start[row], batch.query_len[row]
        r.extend([k] * n)
        p.extend(range(start, start + n))
    return torch.tensor(r, dtype=torch.long), torch.tensor(p, dtype=torch.long)


def _gather(x: Tensor, rows: Tensor, pos: Tensor, dtype) -> Tensor:
    return x.detach()[rows.to(x.device), pos.to(x.device)].to(dtype)


def chunk_rows(batch: QueryBatch, batch_size: int) -> list[list[int]]:
    """The rows of each forward of :func:`read_query_tokens`: ``batch_size`` sequences at a time, in order."""
    n = len(batch.sequences)
    return [list(range(start, min(n, start + batch_size))) for start in range(0, n, batch_size)]


def batch_steps(model, batch: QueryBatch, batch_size: int = 16, known: dict | None = None) -> list[LayerSteps]:
    """``batch`` at the entrance of block 0, one :class:`~icl_lens.model._reading.LayerSteps` per chunk of
    ``batch_size`` sequences (the chunks of :func:`read_query_tokens`); ``known``: that of
    :func:`~icl_lens.model._reading.layer_steps` (default: shared by the chunks)."""
    pad, known = pad_id(model), {} if known is None else known
    return [layer_steps(model, right_padded([batch.sequences[r] for r in rows], pad, model.cfg.device), known)
            for rows in chunk_rows(batch, batch_size)]


@torch.no_grad()
def read_query_tokens(model, batch: QueryBatch, reads: dict[str, str], *, edits: dict[int, MLPEdit] | None = None,
                      stop: str | None = None, anchors: bool = False, batch_size: int = 16,
                      dtype: torch.dtype = torch.float32, steps: Sequence[LayerSteps] | None = None,
                      advance: bool = False) -> dict[str, Tensor]:
    """Run ``batch`` with ``edits`` applied (the write door) and gather each hook point of ``reads`` (key → hook name).

    Returns ``{key: [n_tokens, d]}`` (every query token, in order) and, with ``anchors``,
    ``{key + "_anchor": [n_anchor, d]}`` (every position before the query of every
    sequence, in order). The forward stops right after ``stop`` (one of the read hook
    names) when given. ``steps``: the batch's :func:`batch_steps` (same ``batch_size``); then
    only the block each chunk has reached runs, and ``advance`` (without ``stop``) moves each
    chunk on past it.
    """
    if stop is not None and stop not in reads.values():
        raise ValueError(f"stop hook {stop!r} is not read")
    chunks = chunk_rows(batch, batch_size)
    if steps is not None and len(steps) != len(chunks):
        raise ValueError(f"steps has {len(steps)} chunks, the batch {len(chunks)} of {batch_size}")
    if advance and (steps is None or stop is not None):
        raise ValueError("advance needs steps and no stop (the whole block runs)")
    keys = [*reads, *(f"{k}_anchor" for k in reads if anchors)]
    got: dict[str, list[Tensor]] = {k: [] for k in keys}
    pad = pad_id(model)
    for k, rows in enumerate(chunks):
        r_idx, p_idx = query_positions(batch, rows)
        r0, p0 = anchor_positions(batch, rows)
        sites = []
        for key, name in reads.items():
            def read(x, hook, key=key):
                got[key].append(_gather(x, r_idx, p_idx, dtype))
                if anchors:
                    got[f"{key}_anchor"].append(_gather(x, r0, p0, dtype))

            sites.append((name, read))
        with edits_applied(model, edits or {}), activations_captured(model, sites, stop_after=stop):
            if steps is not None:
                steps[k].run(advance=advance)
            else:
                model(right_padded([batch.sequences[r] for r in rows], pad, model.cfg.device), return_type=None)
    return {k: torch.cat(v) for k, v in got.items()}
