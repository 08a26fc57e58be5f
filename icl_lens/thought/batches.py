"""Token ids of instruction + query prompts, batched with right padding.

Thought patches (arXiv 2510.08734) compare a query read after an instruction,
``[BOS] + ids(instruction) + ids(query)``, with the same query alone, ``[BOS] + ids(query)``.
Instruction and query are tokenised separately so the query's tokens are identical in
both sequences. BOS is kept as in the rest of icl_lens (attention sink, docs/design.md §2).
Right padding needs no attention mask in a causal model: real tokens never see the
padding after them, and position ids stay 0, 1, 2, … for every row.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from icl_lens.model.prompts import PromptError, bos_id, context_limit


def text_ids(model, text: str, *, what: str = "text") -> list[int]:
    """Token ids of ``text`` without special tokens; a clear error if there are none."""
    if not isinstance(text, str):
        raise PromptError(f"{what} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise PromptError(f"{what} is empty (or only whitespace)")
    ids = list(model.tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise PromptError(f"{what} {text!r} tokenises to nothing")
    return ids


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


def first_positions(rows: Sequence[int]) -> tuple[Tensor, Tensor]:
    """(row-in-chunk, 0) for each row: the BOS of every sequence."""
    return torch.arange(len(rows), dtype=torch.long), torch.zeros(len(rows), dtype=torch.long)


def query_positions(batch: QueryBatch, rows: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Flat (row-in-chunk, position) indices of every query token of ``rows``, in order."""
    r, p = [], []
    for k, row in enumerate(rows):
        start, n = batch.query_start[row], batch.query_len[row]
        r.extend([k] * n)
        p.extend(range(start, start + n))
    return torch.tensor(r, dtype=torch.long), torch.tensor(p, dtype=torch.long)
