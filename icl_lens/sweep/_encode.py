"""Token ids of one sweep row, or the bad row that says why not (length, tokenizer failure).

Before tokenizing, a cheap bound on characters: no token of the vocabulary is longer
than ``L`` characters (``L`` = the longest token text, e.g. 31 for Gemma 3, 81 for
SmolLM2, 5 for the tiny models' byte tokenizer), so a prompt that fits the context of
``n_ctx`` tokens has at most ``n_ctx · L`` characters. The bound allows four times that
(``CHAR_SLACK``) for tokenizers whose normaliser merges characters (Unicode NFC/NFKC), and
a longer prompt is a bad row at once, without tokenizing it (tokenizing 50 MB takes
minutes and gigabytes). Under the bound, the exact check is the token count
(:func:`icl_lens.model._prompts.encode_prompt`).
"""
from __future__ import annotations

from torch import Tensor

from icl_lens.model._prompts import context_limit, encode_prompt
from icl_lens.sweep._rows import BadRow, SweepRow

CHAR_SLACK = 4


def longest_token_chars(model) -> int:
    """Characters of the longest token text of the model's vocabulary (cached on the model)."""
    cached = model.__dict__.get("icl_lens_longest_token")
    if cached is None:
        cached = max(1, max((len(t) for t in model.tokenizer.get_vocab()), default=1))
        model.__dict__["icl_lens_longest_token"] = cached
    return cached


def char_limit(model) -> int:
    """Most characters a prompt can have and still fit the model's context (a safe upper bound)."""
    return CHAR_SLACK * context_limit(model) * longest_token_chars(model)


def encode_row(model, row: SweepRow) -> Tensor | BadRow:
    """The row's token ids, or a bad row: over the character bound, over the context, or the tokenizer failed."""
    limit = char_limit(model)
    if len(row.prompt) > limit:
        return BadRow(row.line, row.id,
                      f"The prompt has {len(row.prompt)} characters; {getattr(model, 'icl_lens_name', 'this model')} "
                      f"handles at most {context_limit(model)} tokens, which hold at most {limit} characters. "
                      f"Shorten the prompt.")
    try:
        return encode_prompt(model, row.prompt)
    except Exception as err:  # noqa: BLE001 — any tokenizer failure on one row is that row's bad row
        return BadRow(row.line, row.id, str(err) if isinstance(err, ValueError) and str(err)
                      else f"the tokenizer failed: {type(err).__name__}: {err}")
