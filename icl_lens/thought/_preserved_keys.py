"""Covariances ``K₀K₀ᵀ`` of the preserved texts' keys, per layer, read a few layers at a time.

The preserve penalty of a thought patch's fit (MEMIT, Meng et al. 2023, arXiv
2210.07229; :mod:`icl_lens.thought._fit`) needs, at each fitted layer, the covariance of
the unpatched model's keys on the preserve texts (every token after BOS):

- ``"a"``: MLP inputs (the matrix fit), ``d_model × d_model``;
- ``"h"``: MLP hidden activations (the down fit), ``d_mlp × d_mlp``;
- ``"y"``: the diagonal ``Σ ŷ₀ ⊙ ŷ₀`` of the RMS-normalised MLP outputs (the gain fit).

All layers at once would hold ``n_layers · d_mlp²`` floats (a third of a GB for
SmolLM2-135M and Gemma 3 270M), on top of the model, for the whole fit. The fit visits
layers in increasing order, so :class:`PreservedKeys` reads the covariances of a group of
consecutive layers when the first of them is asked for (one pass over the texts, stopped
after the group's deepest read) and drops the previous group: the group is as many layers
as fit in :data:`KEY_BUDGET_BYTES`. Each pass reads :data:`TEXTS_PER_PASS` texts at a
time and sums (the raw keys of a pass are ``n_tokens × d`` per layer read). The sums are
the same covariances as one pass over every layer; the price is the earlier layers
re-run for each later group.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from icl_lens.core._norms import rms_normalize
from icl_lens.model._block_family import VectorSite, post_norm_eps
from icl_lens.thought._instruction_batches import query_batch, read_query_tokens

KEY_BUDGET_BYTES = 128 * 2**20  # covariances held at once (one group of layers)
TEXTS_PER_PASS = 4  # preserve texts per forward pass (memory only: the sums are the same)


class PreservedKeys:
    """``get(kind, layer)``: the covariance of ``kind`` (``"a"``, ``"h"``, ``"y"``) at ``layer``, read lazily.

    ``parts``: the fit's parts (``"matrix"`` needs ``"a"``, ``"down"`` needs ``"h"``, a gain-site
    ``"vector"`` needs ``"y"``); ``layers``: the fitted layers, increasing.
    """

    def __init__(self, model, family, keep_ids: Sequence[Sequence[int]], layers: Sequence[int], parts: Sequence[str],
                 dtype: torch.dtype, budget_bytes: int | None = None):
        self.model, self.keep_ids, self.dtype = model, list(keep_ids), dtype
        self.layers = list(layers)
        cfg = model.cfg
        self.sites: dict[str, object] = {}
        if "matrix" in parts:
            self.sites["a"] = family.mlp_input
        if "down" in parts:
            self.sites["h"] = family.dense_out_input
        if "vector" in parts and family.vector_site is VectorSite.GAIN:
            self.sites["y"] = family.post_norm_input
        size = {"a": cfg.d_model ** 2, "h": cfg.d_mlp ** 2, "y": cfg.d_model}
        per_layer = max(1, sum(size[k] for k in self.sites)) * torch.finfo(dtype).bits // 8
        self.per_group = max(1, (KEY_BUDGET_BYTES if budget_bytes is None else budget_bytes) // per_layer)
        self._held: dict[str, dict[int, Tensor]] = {}
        self.passes = 0  # groups read so far (a test and the cost figure read it)

    def __bool__(self) -> bool:
        return bool(self.keep_ids) and bool(self.sites)

    def get(self, kind: str, layer: int) -> Tensor | None:
        """The covariance (a diagonal for ``"y"``), or None where this fit has no such penalty."""
        if not self or kind not in self.sites:
            return None
        if layer not in self._held.get(kind, {}):
            start = self.layers.index(layer)
            self._read(self.layers[start:start + self.per_group])
        return self._held[kind][layer]

    def _read(self, group: Sequence[int]) -> None:
        self._held = {}  # the previous group goes before the next is read
        names = {f"{k}{l}": site(l) for l in group for k, site in self.sites.items()}
        stop = list(names.values())[-1]  # the deepest read (layers increase; each layer's sites in forward order)
        for start in range(0, len(self.keep_ids), TEXTS_PER_PASS):
            batch = query_batch(self.model, self.keep_ids[start:start + TEXTS_PER_PASS])
            got = read_query_tokens(self.model, batch, names, stop=stop, batch_size=TEXTS_PER_PASS, dtype=self.dtype)
            for key in list(got):
                x = got.pop(key)
                kind, layer = key[0], int(key[1:])
                if kind == "y":
                    yhat = rms_normalize(x, post_norm_eps(self.model, layer)).to(self.dtype)
                    term = (yhat * yhat).sum(0)
                else:
                    term = x.T @ x
                held = self._held.setdefault(kind, {})
                held[layer] = term if layer not in held else held[layer].add_(term)
        self.passes += 1
