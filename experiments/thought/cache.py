"""The per-model result cache ``<report stem>.<model>.json`` beside the report, and its keys.

Every result that comes from a fit is keyed by the :class:`~icl_lens.thought.ThoughtFit` it was
computed with (:func:`row_key`: ``job/<fit hash>/<what>``, the hash of :meth:`ThoughtFit.key`), and
carries that fit in the row (``"fit"``): a changed setting or default is a new key, so the next run
recomputes instead of reading an old row as the new default's.
"""
from __future__ import annotations

import json
from pathlib import Path

from icl_lens.thought import DISTILL_LR, PRESERVE_SET, ThoughtFit


def cache_path(out: Path, model: str) -> Path:
    return out.with_name(f"{out.stem}.{model}.json")


def cached(out: Path, model: str) -> dict:
    cache = cache_path(out, model)
    return json.loads(cache.read_text()) if cache.exists() else {}


def row_key(job: str, fit: ThoughtFit | None, *what, preserve_set: str = PRESERVE_SET) -> str:
    """The cache key of one result: ``job``, the hash of the ``fit`` it was computed with (none for a result
    without a fit) and what else names it (task, size, …); ``preserve_set``: the shipped preserve texts a fit with
    ``preserve=None`` reads."""
    return "/".join([job, *([fit.key(preserve_set)] if fit is not None else []), *(str(w) for w in what)])


def fit_of(key: str) -> str | None:
    """The fit hash of a key made by :func:`row_key` with a fit (its second part)."""
    parts = key.split("/")
    return parts[1] if len(parts) > 2 else None


def current_row(results: dict, key: str) -> dict | None:
    """The cached row of ``key``, unless its distillation ran at another learning rate than the documented one."""
    row = results.get(key)
    if row is None or ("distill" in row and row["distill"]["lr"] != DISTILL_LR):
        return None
    return row
