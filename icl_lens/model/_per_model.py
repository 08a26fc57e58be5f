"""What icl_lens remembers about a model, kept beside the model and never on it.

Per-model caches (decoded token text, the ``R`` factors of the patch-norm weights) and
per-model settings (``allow_processed``) live in one ``weakref.WeakKeyDictionary`` keyed by
the model object: nothing is written onto the user's model (``vars(model)`` gains no key),
and an entry goes away with its model. A value must never refer to its model, or the entry
would keep the model alive.
"""
from __future__ import annotations

import weakref
from typing import Any

_STATE: weakref.WeakKeyDictionary[Any, dict[str, dict]] = weakref.WeakKeyDictionary()


def model_cache(model: Any, name: str) -> dict:
    """The dict ``name`` that icl_lens keeps for ``model`` (empty on first use, gone with the model)."""
    return _STATE.setdefault(model, {}).setdefault(name, {})
