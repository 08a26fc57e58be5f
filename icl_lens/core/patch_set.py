"""`TokenPatches`: the factored token patches of every layer and position of a prompt.

For layer ``l`` and position ``t`` (docs/design.md §2; Dherin et al. 2025, arXiv 2507.16003):

    ΔW_in[l,t]   = u_in[l,t]   v[l,t]ᵀ        (W_up for gated MLPs)
    ΔW_gate[l,t] = u_gate[l,t] v[l,t]ᵀ        (gated MLPs only)
    b_out[l,t]  += correction[l,t]            (skip-connection term attn_C − attn_0)

with ``u = W δ``, ``v = a/‖a‖²``, ``δ = A − a``. The patch norm plotted everywhere is
``‖ΔW‖_F = sqrt(‖u_gate‖² + ‖u_in‖²)·‖v‖``; the correction norm stands beside it.

**Factors on demand.** A patch set keeps per layer and token only ``d_model``-sized data
(``δ``, ``v``, the correction, the zero-input flag) and a reference to the model's dense
weights (:class:`~icl_lens.core.dense_weights.DenseWeights`). ``u`` is formed when asked
for: :meth:`TokenPatches.u` (one layer, optionally some positions), or the costly
all-layer properties ``u_in``/``u_gate``. Norms and inner products of
``U = [u_gate; u_in]`` come from ``R δ`` (``R`` of the thin QR of ``[W_gate; W_in]``,
``‖U δ‖ = ‖R δ‖``): no ``d_mlp``-sized vector is formed for them. The weights must be the
ones the patches were made from: edited in place, or another model's, they are refused
(:class:`~icl_lens.core.dense_weights.StaleWeightsError`). Patch sets built from factors
that exist already (a trajectory's steps, the regression lab, version-1 files) hold
``u`` itself instead (``stored_u_in``/``stored_u_gate``).

**File format** (``save``/``load``, one format for the CLI's ``--out`` and sweep shards):
one safetensors file holding one or more patch sets. Version 2: entry ``i`` stores
``{i}.delta``, ``{i}.v``, ``{i}.correction``, ``{i}.u_norm`` (``‖[u_gate; u_in]‖`` per
layer and position, so norms need no model), ``{i}.token_ids``, ``{i}.zero_input``,
``{i}.kept`` (only when the kept sets are not the default ``{BOS, t}``) and, only with
``save(..., with_u=True)`` (or for a set that holds ``u`` itself), ``{i}.u_in`` and
``{i}.u_gate``; the safetensors metadata key ``icl_lens`` holds a JSON header
``{"format": "icl_lens.token_patches", "version": 2, "entries": [{"key", "model",
"tokens", "kept_bos", "default_kept", "gated", "weights_checksum"}]}``. Loading without
the model gives δ, v, the correction and the norms; ``u`` needs the dense weights
(``TokenPatches.load(path, weights=icl_lens.dense_weights(model))``), whose checksum must
match the header's. Version-1 files (``u_in``/``u_gate`` stored, no δ) still load.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from icl_lens.core.dense_weights import DenseWeights, RecordedWeights, StaleWeightsError, checksums_match
from icl_lens.core.factored import stack_outputs
from icl_lens.core.kept_attention import default_kept_mask

FILE_FORMAT = "icl_lens.token_patches"
FILE_VERSION = 2
READABLE_VERSIONS = (1, 2)


class PatchFileError(ValueError):
    """A file is not an icl_lens token-patch file, or does not hold the entry asked for."""


@dataclass(frozen=True, eq=False)
class TokenPatches:
    """Token patches of one prompt, all layers × positions, in factored form (``u`` on demand).

    A *batch* of prompts of equal length (the regression lab's) has one more axis after
    the layer: ``delta[layer, prompt, pos, d_model]`` and so on, with ``tokens``,
    ``token_ids`` and ``kept`` shared; :meth:`prompt` picks one prompt's patches.

    ``delta`` (``δ = A − a``) with ``weights`` gives ``u = W δ`` when asked for;
    ``stored_u_in``/``stored_u_gate`` hold ``u`` itself where it exists already (then
    ``delta`` may be None). ``u_norm``: ``‖[u_gate; u_in]‖`` read from a file (norms without
    the model).
    """

    model_name: str
    tokens: tuple[str, ...]
    token_ids: Int[Tensor, " pos"]
    v: Float[Tensor, "layer *prompt pos d_model"]
    correction: Float[Tensor, "layer *prompt pos d_model"]
    kept: Bool[Tensor, "pos pos"]
    kept_bos: bool
    zero_input: Bool[Tensor, "layer *prompt pos"] = field(repr=False)
    delta: Float[Tensor, "layer *prompt pos d_model"] | None = field(default=None, repr=False)
    weights: Any = field(default=None, repr=False)  # DenseWeights, RecordedWeights (loaded file) or None
    stored_u_in: Float[Tensor, "layer *prompt pos d_mlp"] | None = field(default=None, repr=False)
    stored_u_gate: Float[Tensor, "layer *prompt pos d_mlp"] | None = field(default=None, repr=False)
    u_norm: Float[Tensor, "layer *prompt pos"] | None = field(default=None, repr=False)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.stored_u_in is None and self.delta is None:
            raise ValueError("TokenPatches needs delta (with weights) or stored_u_in")
        if self.stored_u_in is None and self.weights is None and self.u_norm is None:
            raise ValueError("TokenPatches made from delta needs the dense weights (weights=)")

    @property
    def n_layers(self) -> int:
        return self.v.shape[0]

    @property
    def n_positions(self) -> int:
        return self.v.shape[-2]

    @property
    def batched(self) -> bool:
        """Whether these are the patches of a batch of prompts (an axis after the layer)."""
        return self.v.ndim == 4

    def _per_token(self, fn) -> dict[str, Any]:
        """``fn`` applied to every per-token tensor field (None stays None), by field name."""
        names = ("v", "correction", "zero_input", "delta", "stored_u_in", "stored_u_gate", "u_norm")
        return {k: None if getattr(self, k) is None else fn(getattr(self, k)) for k in names}

    def prompt(self, b: int) -> "TokenPatches":
        """Prompt ``b`` of a batch, as the patches of one prompt."""
        if not self.batched:
            raise ValueError("these are the patches of one prompt, not a batch")
        return replace(self, **self._per_token(lambda t: t[:, b]))

    @property
    def positions(self) -> list[int]:
        return list(range(self.n_positions))

    @property
    def gated(self) -> bool:
        if self.stored_u_in is not None:
            return self.stored_u_gate is not None
        return bool(self.weights.gated)

    @property
    def stores_u(self) -> bool:
        """Whether ``u`` is held (stored factors) rather than formed from ``δ`` on demand."""
        return self.stored_u_in is not None

    def u(self, layer: int, index: Tensor | None = None
          ) -> tuple[Float[Tensor, "*rows d_mlp"], Float[Tensor, "*rows d_mlp"] | None]:
        """``(u_in, u_gate)`` of ``layer`` (``u_gate`` None for a plain MLP), every position or ``index``.

        ``index``: position indices (any shape, e.g. ``[batch, pos]`` of source positions);
        the factors of ``δ[layer][index]`` only are formed. Raises
        :class:`~icl_lens.core.dense_weights.StaleWeightsError` if the weights changed.
        """
        pick = (lambda t: t[layer]) if index is None else (lambda t: t[layer][index])  # noqa: E731
        if self.stored_u_in is not None:
            return pick(self.stored_u_in), None if self.stored_u_gate is None else pick(self.stored_u_gate)
        return self.weights.u(layer, pick(self.delta))

    @property
    def u_in(self) -> Float[Tensor, "layer *prompt pos d_mlp"]:
        """``W_in δ`` of every layer and position. Costly: forms ``layers × tokens × d_mlp`` floats; prefer :meth:`u`."""
        if self.stored_u_in is not None:
            return self.stored_u_in
        return torch.stack([self.u(layer)[0] for layer in range(self.n_layers)])

    @property
    def u_gate(self) -> Float[Tensor, "layer *prompt pos d_mlp"] | None:
        """``W_gate δ`` of every layer and position (None for a plain MLP). Costly, like :attr:`u_in`."""
        if self.stored_u_in is not None:
            return self.stored_u_gate
        if not self.gated:
            return None
        return torch.stack([self.u(layer)[1] for layer in range(self.n_layers)])

    def stacked_u(self, layer: int | None = None) -> Float[Tensor, "*layer pos d_u"]:
        """``[u_gate; u_in]`` (or ``u_in``): the output factor of the whole patch, of ``layer`` or of all (costly)."""
        if layer is None:
            return stack_outputs(self.u_in, self.u_gate)
        u_in, u_gate = self.u(layer)
        return stack_outputs(u_in, u_gate)

    def u_coordinates(self, layer: int) -> Float[Tensor, "*prompt pos d_k"]:
        """Vectors with the inner products of ``[u_gate; u_in]`` of ``layer``: ``R δ`` (``d_model`` wide), or ``u``.

        ``(R δ₁)·(R δ₂) = (U δ₁)·(U δ₂)``, so Gram matrices, cosines and norms of the output
        factors (:mod:`icl_lens.core.factored`) are the same from these, at ``d_model`` cost.
        """
        if self.stored_u_in is not None:
            return stack_outputs(self.stored_u_in[layer], None if self.stored_u_gate is None else self.stored_u_gate[layer])
        return self.weights.coordinates(layer, self.delta[layer])

    def output_norms(self) -> Float[Tensor, "layer *prompt pos"]:
        """``‖[u_gate; u_in]‖`` of every layer and position, from ``R δ`` (or the stored ``u``/norms); cached."""
        if "u_norm" not in self._memo:
            if self.u_norm is not None:
                out = self.u_norm
            elif self.stored_u_in is not None:
                out = torch.linalg.vector_norm(stack_outputs(self.stored_u_in, self.stored_u_gate), dim=-1)
            else:
                out = torch.stack([self.weights.norms(layer, self.delta[layer]) for layer in range(self.n_layers)])
            self._memo["u_norm"] = out
        return self._memo["u_norm"]

    def norms(self) -> Float[Tensor, "layer *prompt pos"]:
        """Frobenius norm of each token patch, ``sqrt(‖u_gate‖²+‖u_in‖²)·‖v‖`` (``‖R δ‖·‖v‖``, no ``u`` formed)."""
        return self.output_norms().to(self.v.dtype) * torch.linalg.vector_norm(self.v, dim=-1)

    def correction_norms(self) -> Float[Tensor, "layer *prompt pos"]:
        """Norm of the skip-connection correction ``‖attn_C − attn_0‖``."""
        return torch.linalg.vector_norm(self.correction, dim=-1)

    def with_weights(self, weights: DenseWeights) -> "TokenPatches":
        """The same patches computing ``u`` with ``weights``, refused unless they are the ones the patches were made from."""
        if not isinstance(weights, DenseWeights):
            raise TypeError(f"weights must be a DenseWeights (icl_lens.dense_weights(model)), got {type(weights).__name__}")
        weights.check()
        if weights.n_layers != self.n_layers or (self.delta is not None and self.weights is not None
                                                 and weights.gated != self.gated):
            raise StaleWeightsError(f"weights of {weights.n_layers} layers (gated={weights.gated}) do not fit "
                                    f"patches of {self.n_layers} layers (gated={self.gated})")
        if self.weights is weights:
            return self
        recorded = None if self.weights is None else self.weights.checksum()
        if recorded is None or not checksums_match(recorded, weights.checksum()):
            raise StaleWeightsError(f"these weights are not the ones the patches of {self.model_name!r} were made "
                                    f"from (their checksums differ); recompute the patches with this model")
        return replace(self, weights=weights)

    def kept_positions(self, query: int) -> list[int]:
        """Positions the context-free input of ``query`` keeps (sorted)."""
        return torch.nonzero(self.kept[query]).flatten().tolist()

    def keep_parts(self, *, w_in: bool = True, correction: bool = True) -> "TokenPatches":
        """The same patches with the weight part (``u_in``, ``u_gate``: ``δ``) and/or the skip correction zeroed."""
        zero = lambda t: None if t is None else torch.zeros_like(t)  # noqa: E731
        weight_part = {} if w_in else {k: zero(getattr(self, k)) for k in ("delta", "stored_u_in", "stored_u_gate",
                                                                          "u_norm")}
        return replace(self, correction=self.correction if correction else zero(self.correction), **weight_part)

    def to(self, device: torch.device | str) -> "TokenPatches":
        """A copy with every tensor on ``device`` (the dense weights stay where the model keeps them)."""
        move = lambda t: t.to(device)  # noqa: E731
        return replace(self, token_ids=move(self.token_ids), kept=move(self.kept), **self._per_token(move))

    def to_frame(self) -> pd.DataFrame:
        """Tidy table: one row per (layer, position) with token, norm and correction norm (and prompt, for a batch)."""
        if self.batched:
            frames = [self.prompt(b).to_frame() for b in range(self.v.shape[1])]
            return pd.concat([f.assign(prompt=b) for b, f in enumerate(frames)], ignore_index=True)
        norms = self.norms().detach().cpu().double().numpy()
        corr = self.correction_norms().detach().cpu().double().numpy()
        layers, n = self.n_layers, self.n_positions
        return pd.DataFrame({
            "layer": np.repeat(np.arange(layers), n),
            "position": np.tile(np.arange(n), layers),
            "token": np.asarray(self.tokens, dtype=object)[np.tile(np.arange(n), layers)] if n else [],
            "norm": norms.reshape(-1),
            "correction_norm": corr.reshape(-1),
        }, columns=["layer", "position", "token", "norm", "correction_norm"])

    def has_default_kept(self) -> bool:
        """Whether every query keeps ``{t}`` plus a kept BOS (the default removal)."""
        default = default_kept_mask(self.n_positions, keep_bos=self.kept_bos, device=self.kept.device)
        return bool(torch.equal(self.kept, default))

    def save(self, path: str | os.PathLike, *, with_u: bool = False) -> Path:
        """Write this patch set to ``path`` (safetensors + JSON header, see the module doc).

        ``with_u=True`` stores ``u_in``/``u_gate`` as well (read without the model, ``d_mlp``
        floats per token and layer); by default the file holds ``δ`` and ``u`` needs the weights.
        """
        return TokenPatches.save_many({"0": self}, path, with_u=with_u)

    def _file_tensors(self, with_u: bool) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """The tensors (by name) and the header entry (less its key) of this patch set in a version-2 file."""
        default = self.has_default_kept()
        tensors = {"v": self.v, "correction": self.correction, "u_norm": self.output_norms(),
                   "token_ids": self.token_ids, "zero_input": self.zero_input}
        if self.delta is not None:
            tensors["delta"] = self.delta
        if not default:
            tensors["kept"] = self.kept
        if with_u or self.delta is None:
            u_in, u_gate = self.u_in, self.u_gate
            tensors["u_in"] = u_in
            if u_gate is not None:
                tensors["u_gate"] = u_gate
        checksum = None if self.weights is None else self.weights.checksum()
        entry = {"model": self.model_name, "tokens": list(self.tokens), "kept_bos": self.kept_bos,
                 "default_kept": default, "gated": self.gated,
                 "weights_checksum": None if checksum is None else [dict(c) for c in checksum]}
        return {k: t.detach().cpu().contiguous() for k, t in tensors.items()}, entry

    @staticmethod
    def save_many(patches: Mapping[str, "TokenPatches"], path: str | os.PathLike, *, with_u: bool = False) -> Path:
        """Write several patch sets (key → patches) to one file, atomically (temp file, then rename)."""
        from safetensors.torch import save_file

        tensors, entries = {}, []
        for i, (key, p) in enumerate(patches.items()):
            if p.batched:
                raise ValueError(f"entry {key!r} holds a batch of prompts; save each one's TokenPatches.prompt(b)")
            named, entry = p._file_tensors(with_u)
            tensors.update({f"{i}.{name}": t for name, t in named.items()})
            entries.append({"key": str(key), **entry})
        header = {"format": FILE_FORMAT, "version": FILE_VERSION, "entries": entries}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            save_file(tensors, tmp, metadata={"icl_lens": json.dumps(header)})
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return path

    @staticmethod
    def read_file(path: str | os.PathLike, device: torch.device | str = "cpu") -> tuple[dict, dict[str, Tensor]]:
        """The parsed JSON header and every tensor of a token-patch file (the one place a header is read)."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no token-patch file at {path}")
        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as err:  # safetensors raises its own error types for a non-safetensors file
            raise PatchFileError(f"{path} is not a safetensors file: {err}") from None
        try:
            header = json.loads(meta["icl_lens"])
        except (KeyError, json.JSONDecodeError):
            raise PatchFileError(f"{path} has no icl_lens header; it was not written by TokenPatches.save") from None
        if header.get("format") != FILE_FORMAT or header.get("version") not in READABLE_VERSIONS:
            raise PatchFileError(f"{path}: unsupported format {header.get('format')!r} version {header.get('version')!r}")
        return header, tensors

    @staticmethod
    def _from_entry(entry: dict, get, version: int, weights: DenseWeights | None) -> "TokenPatches":
        """One patch set from its header entry and ``get(name)`` (its tensors), checking ``weights`` against the file."""
        ids = get("token_ids")
        kept = (default_kept_mask(ids.numel(), keep_bos=entry["kept_bos"], device=ids.device)
                if entry["default_kept"] else get("kept"))
        common = dict(model_name=entry["model"], tokens=tuple(entry["tokens"]), token_ids=ids, v=get("v"),
                      correction=get("correction"), kept=kept, kept_bos=bool(entry["kept_bos"]),
                      zero_input=get("zero_input"), stored_u_in=get("u_in"), stored_u_gate=get("u_gate"))
        if version == 1:  # u stored, no δ: the weights are not needed
            return TokenPatches(**common)
        n_layers = common["v"].shape[0]
        recorded = RecordedWeights(entry.get("weights_checksum"), bool(entry["gated"]), n_layers)
        patches = TokenPatches(**common, delta=get("delta"), u_norm=get("u_norm"), weights=recorded)
        return patches if weights is None else patches.with_weights(weights)

    @staticmethod
    def load_many(path: str | os.PathLike, device: torch.device | str = "cpu",
                  weights: DenseWeights | None = None) -> dict[str, "TokenPatches"]:
        """Every patch set in ``path``, by key (a sweep shard maps prompt ids to patches).

        ``weights`` (``icl_lens.dense_weights(model)``): attach the dense weights so ``u`` can be
        formed from a version-2 file's ``δ``; refused unless they are the ones the file was made from.
        """
        header, tensors = TokenPatches.read_file(path, device)
        out = {}
        for i, entry in enumerate(header["entries"]):
            get = lambda name, i=i: tensors.get(f"{i}.{name}")  # noqa: E731
            out[entry["key"]] = TokenPatches._from_entry(entry, get, int(header["version"]), weights)
        return out

    @staticmethod
    def load(path: str | os.PathLike, key: str | None = None, device: torch.device | str = "cpu",
             weights: DenseWeights | None = None) -> "TokenPatches":
        """The patch set saved at ``path`` (``key`` picks one from a file holding several; ``weights``: see :meth:`load_many`)."""
        entries = TokenPatches.load_many(path, device=device, weights=weights)
        if key is None:
            if len(entries) != 1:
                raise PatchFileError(f"{path} holds {len(entries)} patch sets; pass key= (one of "
                                     f"{', '.join(list(entries)[:5])}{', …' if len(entries) > 5 else ''}) "
                                     f"or use TokenPatches.load_many")
            return next(iter(entries.values()))
        if str(key) not in entries:
            raise PatchFileError(f"{path} holds no patch set {key!r}")
        return entries[str(key)]
