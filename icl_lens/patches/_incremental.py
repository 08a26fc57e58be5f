"""Token patches for a growing prompt, reusing the key/value cache of the unchanged prefix.

Token patches are causal: the patch of position ``t`` depends only on tokens ``≤ t``
(docs/design.md §2). When a prompt is edited at its end (typing, generation), the patches
of the longest common token prefix are kept and only the new positions are computed,
in one cached forward of the new tokens. The cached keys and values are the contextual
pass's own, and the kept-key renormalisation of docs/design.md §2 needs only the new rows of
the score matrix plus the BOS value, so the result equals ``token_patches`` on the full
prompt (tested).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor
from transformers import DynamicCache

from icl_lens.core._kept_attention import default_kept_mask
from icl_lens.patches._patch_set import TokenPatches
from icl_lens.model._block_family import block_family
from icl_lens.patches._capture import LayerCapture, dense_weights, empty_factors, is_bos_kept, warn_zero_inputs
from icl_lens.model._greedy import last_logits, unembedded
from icl_lens.model._prompts import encode_prompt, str_tokens
from icl_lens.model._reading import activations_captured

if TYPE_CHECKING:
    from icl_lens.model._types import Model


@dataclass(frozen=True)
class UpdateStats:
    """What the last :meth:`PatchSession.update` recomputed."""

    n_positions: int
    reused: int
    recomputed: int
    seconds: float


class PatchSession:
    """Keeps the key/value cache and the factors of the last prompt; ``update`` extends them.

    ``session.update(prompt) -> TokenPatches`` for the whole prompt; ``session.last_logits``
    holds the logits of its last position; ``session.last_stats`` says what was reused.
    Only the default kept set (BOS + query) is supported here.

    ``logits=False`` skips the unembedding (the forward stops after the last MLP input;
    the key/value cache is filled in place by then): ``last_logits`` stays None. For
    Gemma 3 270M the 262k-vocabulary unembedding is most of the cost of appending one
    token. ``logits="lazy"`` (the live dashboard's): the forward stops at the unembedding's
    input and keeps the last position's row; ``last_logits`` puts that one row through the
    unembedding when first read (the same logits as a fresh forward's, tested), so the figures
    need not wait for it and no second forward of the last token is needed.
    """

    def __init__(self, model: Model, *, keep_bos: bool = True, logits: bool | str = True):
        if logits not in (True, False, "lazy"):
            raise ValueError(f"logits must be True, False or 'lazy', got {logits!r}")
        self.model, self.keep_bos, self.logits = model, keep_bos, logits
        self.family = block_family(model)
        self._ids: Tensor | None = None
        self._cache = None
        self._factors: dict[str, Tensor | None] | None = None
        self._bos_values: dict[int, Tensor] = {}
        self._tokens: tuple[str, ...] = ()
        self._last_logits: Tensor | None = None
        self._last_hidden: Tensor | None = None  # logits="lazy": the unembedding's input at the last position
        self.last_stats: UpdateStats | None = None

    @property
    def last_logits(self) -> Float[Tensor, " vocab"] | None:
        """Logits at the last prompt's last position (None with ``logits=False`` or before any update)."""
        if self._last_logits is None and self._last_hidden is not None:
            self._last_logits = unembedded(self.model, self._last_hidden[None])[0]
        return self._last_logits

    def reset(self) -> None:
        self._ids = self._cache = self._factors = None
        self._bos_values, self._tokens = {}, ()

    def prefix_cache(self, ids: Tensor, n: int) -> tuple[DynamicCache, dict[int, Tensor]] | None:
        """The keys and values of the first ``n`` positions, if the last prompt starts with ``ids[:n]``.

        Returns a new cache whose layers are views of this session's (a forward with it
        appends to the new cache only; this session's cache is left as it was) and the BOS
        value of each layer (``{layer: [batch, kv_head, d_head]}``), else None. Lets a
        forward that shares the prompt's first ``n`` tokens (a trajectory's query copies,
        :func:`icl_lens.dynamics._trajectory_capture.trajectory`) skip them.
        """
        ids = ids.reshape(-1)
        if (self._cache is None or self._ids is None or not 0 < n <= len(self._ids) or len(ids) < n
                or not torch.equal(ids[:n].to(self._ids.device), self._ids[:n]) or not self._bos_values):
            return None
        view = DynamicCache()
        for layer_idx, layer in enumerate(self._cache.layers):
            view.update(layer.keys[:, :, :n], layer.values[:, :, :n], layer_idx)
        return view, dict(self._bos_values)

    @torch.no_grad()
    def logits_at(self, ids: Tensor, query: int) -> Float[Tensor, " vocab"]:
        """Next-token logits after ``ids[: query + 1]``: one token's forward over this session's cached keys and
        values of the positions before ``query`` when it holds them (the dashboard's predictions after a
        keystroke), else a forward over the whole prefix."""
        ids = ids.reshape(-1)
        if not 0 <= query < len(ids):
            raise ValueError(f"query {query} is outside the prompt's {len(ids)} positions")
        if self._is_last(ids, query):
            return self.last_logits  # the last update's own pass: its last row through the unembedding
        past = self.prefix_cache(ids, query) if query > 0 else None
        if past is None:
            return last_logits(self.model, [ids[: query + 1].tolist()])[0]
        logits, _ = self.model(ids[None, query:query + 1], past_key_values=past[0], return_type="logits_and_cache",
                               logits_to_keep=1)
        return logits[0, -1]

    @torch.no_grad()
    def logits_with(self, ids: Tensor, query: int, hidden: Float[Tensor, "k d_model"]
                    ) -> tuple[Float[Tensor, " vocab"], Float[Tensor, "k vocab"]]:
        """:meth:`logits_at` and the logits of ``hidden``, more inputs to the unembedding (another forward's rows,
        e.g. :attr:`~icl_lens.dynamics._trajectory.Trajectory.kept_only_hidden`). Where the query's row is the last
        update's, not yet unembedded (``logits="lazy"``), all rows go through the unembedding together: one read
        of its weights (0.67 GB on Gemma 3 270M) instead of two."""
        ids = ids.reshape(-1)
        if self._is_last(ids, query) and self._last_logits is None and self._last_hidden is not None:
            rows = unembedded(self.model, torch.cat([self._last_hidden[None], hidden.to(self._last_hidden)]))
            self._last_logits = rows[0]
            return self._last_logits, rows[1:]
        return self.logits_at(ids, query), unembedded(self.model, hidden)

    def _is_last(self, ids: Tensor, query: int) -> bool:
        """Whether ``ids[: query + 1]`` is the last update's prompt and its logits are kept (now or lazily)."""
        return bool(self._ids is not None and query == len(self._ids) - 1 and self.logits
                    and torch.equal(ids[: query + 1].to(self._ids.device), self._ids))

    def _common_prefix(self, ids: Tensor) -> int:
        if self._ids is None:
            return 0
        m = min(len(ids), len(self._ids))
        diff = torch.nonzero(ids[:m] != self._ids[:m])
        p = int(diff[0]) if len(diff) else m
        # Recompute at least the last token: its logits are needed, and a prompt that
        # only shrank still needs a cache cropped to p - 1 positions.
        return min(p, len(ids) - 1)

    @torch.no_grad()
    def update(self, prompt) -> TokenPatches:
        start = time.perf_counter()
        ids = encode_prompt(self.model, prompt)
        n, device = ids.numel(), ids.device
        kept_bos = is_bos_kept(self.model, ids, self.keep_bos)
        p = self._common_prefix(ids)
        if p == 0 or self._cache is None:
            self.reset()
            p, cache = 0, None
        else:
            cache = self._cache
            cache.crop(-(len(self._ids) - p))  # HF's crop takes the number of tokens to drop
        kept = default_kept_mask(n, keep_bos=kept_bos, device=device)
        new = empty_factors(self.model, n - p, device, batch=1)
        capture = LayerCapture(self.model, self.family, kept[p:], True, kept_bos, new, offset=p,
                                bos_values=self._bos_values)
        # A plain DynamicCache keeps every layer's full history (HF's default cache for
        # sliding-window models drops old keys and then cannot be cropped on edits).
        cache = DynamicCache() if cache is None else cache
        self._last_logits = self._last_hidden = None
        if self.logits == "lazy":
            def keep(x, hook):
                self._last_hidden = x[0, -1].detach()
            with activations_captured(self.model, capture.all_hooks() + [("unembed.hook_in", keep)],
                                      stop_after="unembed.hook_in"):
                self.model(ids[None, p:], past_key_values=cache, return_type=None, logits_to_keep=1)
            logits, self._cache = None, cache
        elif self.logits:
            with activations_captured(self.model, capture.all_hooks()):
                logits, self._cache = self.model(ids[None, p:], past_key_values=cache,
                                                 return_type="logits_and_cache", logits_to_keep=1)
        else:
            with activations_captured(self.model, capture.all_hooks(), stop_after=capture.last_site):
                self.model(ids[None, p:], past_key_values=cache, return_type=None)
            logits, self._cache = None, cache  # the attention layers filled the cache in place
        new = {k: None if v is None else v[:, 0] for k, v in new.items()}
        warn_zero_inputs(new["zero_input"], offset=p)
        weights = dense_weights(self.model)
        # the output norms of the new positions only (the spike flags and the strip read them every keystroke)
        new["u_norm"] = torch.stack([weights.norms(layer, new["delta"][layer]) for layer in range(len(new["delta"]))])
        if self._factors is None:
            self._factors = new
        else:
            self._factors = {k: None if v is None else torch.cat([self._factors[k][:, :p], v], dim=1)
                             for k, v in new.items()}
        self._tokens = self._tokens[:p] + str_tokens(self.model, ids[p:])
        self._ids = ids
        if logits is not None:
            self._last_logits = logits[0, -1]
        self.last_stats = UpdateStats(n, p, n - p, time.perf_counter() - start)
        f = self._factors
        return TokenPatches(
            model_name=self.model.cfg.model_name,
            tokens=self._tokens, token_ids=ids.cpu(), delta=f["delta"], weights=weights, v=f["v"],
            correction=f["correction"], kept=kept, kept_bos=kept_bos, zero_input=f["zero_input"], u_norm=f["u_norm"],
        )
