"""Covariances ``K₀K₀ᵀ`` of the preserved texts' keys, one layer at a time, in the fit's own sweep.

The preserve penalty of a thought patch's fit (MEMIT, Meng et al. 2023, arXiv
2210.07229; :mod:`icl_lens.thought._fit`) needs, at each fitted layer, the covariance of
the unpatched model's keys on the preserve texts (every token after BOS):

- ``"a"``: MLP inputs (the matrix fit), ``d_model × d_model``;
- ``"h"``: MLP hidden activations (the down fit), ``d_mlp × d_mlp``;
- ``"y"``: the diagonal ``Σ ŷ₀ ⊙ ŷ₀`` of the RMS-normalised MLP outputs (the gain fit);
- with ``bos`` (the null-space projection, :mod:`icl_lens.thought._null_space`), also the
  BOS position's key ``"a_bos"``, ``"h_bos"`` (one row).

All layers at once would hold ``n_layers · d_mlp²`` floats (a third of a GB for
SmolLM2-135M and Gemma 3 270M), on top of the model, for the whole fit. The fit visits
layers in increasing order, so :class:`PreservedKeys` takes the texts through the
unpatched blocks one at a time beside it (:func:`~icl_lens.thought._instruction_batches.batch_steps`:
the residual entering the next block is kept): asked for layer ``l``, it runs the blocks
up to ``l`` that it has not run yet, reads layer ``l``'s keys and drops the previous
layer's covariances. One sweep of the fit costs one unpatched pass over the texts (a
second sweep starts again from the embedding), and one layer's covariances are held. Each
covariance is one :func:`~icl_lens.core._least_squares.gram` of all the texts' keys of the layer.

The covariances depend only on the unpatched model, the texts and the dtype, never on the
task, so each layer's are also kept on disk (:func:`cache_folder`, one file per layer) and
read back by every later fit with the same weights (:func:`~icl_lens.model._per_model.weights_digest`),
texts, dtype, device type and torch version: the same tensors bit for bit, without the pass
over the texts or the ``d_mlp²`` products (the larger part of a default fit's cost beyond
its own batch; time and size on disk: ``BENCHMARKS.md``).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from icl_lens.core._least_squares import gram
from icl_lens.core._norms import rms_normalize
from icl_lens.model._block_family import VectorSite, post_norm_eps
from icl_lens.model._loading import cache_dir
from icl_lens.model._per_model import weights_digest
from icl_lens.thought._instruction_batches import batch_steps, query_batch, read_query_tokens

TEXTS_PER_PASS = 4  # preserve texts per block run (memory only: the sums are the same)
SUMS = "gram over all rows"  # how the covariances are summed (in the disk cache's key: another way, other files)
CACHE_ENV = "ICL_LENS_PRESERVE_CACHE"


def cache_folder() -> Path | None:
    """Where preserved-key covariances are kept: ``$ICL_LENS_PRESERVE_CACHE``, by default ``preserve_keys/`` in the
    models' cache (``$ICL_LENS_CACHE``, ``~/.cache/icl_lens``); set it to the empty string to keep none."""
    got = os.environ.get(CACHE_ENV)
    if got is None:
        return cache_dir() / "preserve_keys"
    return Path(got).expanduser() if got.strip() else None


class PreservedKeys:
    """``get(kind, layer)``: the covariance of ``kind`` (``"a"``, ``"h"``, ``"y"``) at ``layer``, read lazily.

    ``parts``: the fit's parts (``"matrix"`` needs ``"a"``, ``"down"`` needs ``"h"``, a gain-site
    ``"vector"`` needs ``"y"``); ``layers``: the fitted layers, increasing. Asked for layers in
    increasing order, each block runs once; a layer before the last one asked for starts a new pass.
    """

    def __init__(self, model, family, keep_ids: Sequence[Sequence[int]], layers: Sequence[int], parts: Sequence[str],
                 dtype: torch.dtype, *, bos: bool = False):
        self.model, self.keep_ids, self.dtype, self.bos = model, list(keep_ids), dtype, bos
        self.layers = list(layers)
        self.sites: dict[str, object] = {}
        if "matrix" in parts:
            self.sites["a"] = family.mlp_input
        if "down" in parts:
            self.sites["h"] = family.dense_out_input
        if "vector" in parts and family.vector_site is VectorSite.GAIN:
            self.sites["y"] = family.post_norm_input
        self._batch = query_batch(model, self.keep_ids) if self else None
        self._steps = None  # the texts' residual entering the next block to run, per chunk
        self._held: dict[str, Tensor] = {}  # the covariances of layer self._at
        self._at: int | None = None
        self.passes = 0  # passes over the texts from the embedding (a test and the cost figure read it)
        self.blocks_run = 0  # block runs of the texts (per chunk), over all passes
        self.loaded = 0  # layers whose covariances came from the disk cache
        self._folder = self._cache_key() if self else None

    def __bool__(self) -> bool:
        return bool(self.keep_ids) and bool(self.sites)

    def get(self, kind: str, layer: int) -> Tensor | None:
        """The covariance (a diagonal for ``"y"``), or None where this fit has no such penalty; ``kind + "_bos"``
        (with ``bos``): the BOS position's key, one row (None for ``"y"`` or a model without BOS)."""
        if not self or kind.removesuffix("_bos") not in self.sites:
            return None
        if layer != self._at:
            self._read(layer)
        return self._held.get(kind)

    def _run(self, names: dict[str, str]) -> dict[str, Tensor]:
        """Block ``self._steps[0].layer`` of every chunk (unpatched), reading ``names``; the texts move past it."""
        self.blocks_run += 1
        return read_query_tokens(self.model, self._batch, names, batch_size=TEXTS_PER_PASS, dtype=self.dtype,
                                 steps=self._steps, advance=True, anchors=self.bos and bool(names))

    def _cache_key(self) -> Path | None:
        """This fit's folder in :func:`cache_folder`: a digest of everything the covariances depend on."""
        root = cache_folder()
        if root is None:
            return None
        cfg = self.model.cfg
        what = {"weights": weights_digest(self.model), "model": cfg.model_name, "torch": torch.__version__,
                "dtype": str(self.dtype), "device": torch.device(cfg.device).type, "per_pass": TEXTS_PER_PASS,
                "bos": self.bos, "sums": SUMS,
                "sites": {kind: site(0) for kind, site in sorted(self.sites.items())}, "texts": self.keep_ids}
        return root / hashlib.blake2b(json.dumps(what, sort_keys=True).encode(), digest_size=16).hexdigest()

    def _load(self, layer: int) -> dict[str, Tensor] | None:
        path = self._folder and self._folder / f"layer{layer}.pt"
        if not path or not path.exists():
            return None
        try:
            got = torch.load(path, map_location=self.model.cfg.device, weights_only=True)
        except Exception:  # a torn or foreign file: computed again and written over
            return None
        return got if isinstance(got, dict) and set(self.sites) <= set(got) else None  # (+ the BOS rows with bos)

    def _save(self, layer: int) -> None:
        if self._folder is None:
            return
        try:
            self._folder.mkdir(parents=True, exist_ok=True)
            tmp = self._folder / f".layer{layer}.{os.getpid()}.tmp"
            torch.save({k: v.cpu() for k, v in self._held.items()}, tmp)
            os.replace(tmp, self._folder / f"layer{layer}.pt")  # whole or absent, also with several writers
        except OSError:  # a read-only or full disk costs the next fit the pass, nothing else
            pass

    def _read(self, layer: int) -> None:
        self._held, self._at = {}, None  # the previous layer's go before the next are read
        cached = self._load(layer)
        if cached is not None:
            self._held, self._at = cached, layer
            self.loaded += 1
            return
        if self._steps is None:
            self._steps = batch_steps(self.model, self._batch, TEXTS_PER_PASS)
            self.passes += 1
        elif self._steps[0].layer > layer:
            for steps in self._steps:
                steps.restart()
            self.passes += 1
        while self._steps[0].layer < layer:
            self._run({})
        got = self._run({kind: site(layer) for kind, site in self.sites.items()})
        for kind, x in got.items():
            if kind.endswith("_anchor"):  # the BOS position of every text (the batch has no prefix): one row
                if kind != "y_anchor" and x.shape[0]:
                    self._held[kind.replace("_anchor", "_bos")] = x[:1]
                continue
            if kind == "y":
                x = rms_normalize(x, post_norm_eps(self.model, layer)).to(self.dtype)
            self._held[kind] = (x * x).sum(0) if kind == "y" else gram(x)
        self._at = layer
        self._save(layer)
