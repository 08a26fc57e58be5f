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


def weights_digest(model: Any) -> str:
    """A BLAKE2b digest of ``model``'s parameters (names, dtypes, shapes, bytes), for caches kept on disk.

    Hashing reads every weight once (about a second per GB), so the digest is remembered beside the model with a
    guard of each parameter's storage and in-place version counter: replacing or editing a weight in place makes
    the next call hash again.
    """
    import hashlib

    import torch

    params = list(model.named_parameters())
    guard = tuple((p.data_ptr(), p._version) for _, p in params)
    seen = model_cache(model, "digest")
    if seen.get("guard") != guard:
        h = hashlib.blake2b(digest_size=20)
        for name, p in params:
            h.update(f"{name}|{p.dtype}|{tuple(p.shape)}|".encode())
            h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
        seen.update(guard=guard, hex=h.hexdigest())
    return seen["hex"]
