"""`TokenPatches`: the factored token patches of every layer and position of a prompt.

For layer ``l`` and position ``t`` (docs/design.md §2; Dherin et al. 2025, arXiv 2507.16003):

    ΔW_in[l,t]   = u_in[l,t]   v[l,t]ᵀ        (W_up for gated MLPs)
    ΔW_gate[l,t] = u_gate[l,t] v[l,t]ᵀ        (gated MLPs only)
    b_out[l,t]  += correction[l,t]            (skip-connection term attn_C − attn_0)

with ``u = W δ``, ``v = a/‖a‖²``, ``δ = A − a``. The patch norm plotted everywhere is
``‖ΔW‖_F = sqrt(‖u_gate‖² + ‖u_in‖²)·‖v‖``; the correction norm stands beside it.

**Factors on demand.** A patch set keeps per layer and token only ``d_model``-sized data
(``δ``, ``v``, the correction, the zero-input flag) and a reference to the model's dense
weights (:class:`~icl_lens.patches._dense_weights.DenseWeights`). ``u`` is formed when asked
for: :meth:`TokenPatches.u` (one layer, optionally some positions), or the costly
all-layer properties ``u_in``/``u_gate``. Norms and inner products of
``U = [u_gate; u_in]`` come from ``R δ`` (``R`` of the thin QR of ``[W_gate; W_in]``,
``‖U δ‖ = ‖R δ‖``): no ``d_mlp``-sized vector is formed for them. The weights must be the
ones the patches were made from: edited in place, or another model's, they are refused
(:class:`~icl_lens.patches._dense_weights.StaleWeightsError`). Patch sets built from factors
that exist already (a trajectory's steps, the regression lab, version-1 files) hold
``u`` itself instead (``stored_u_in``/``stored_u_gate``).

**File format** (``save``/``load``, one format for the CLI's ``--out`` and sweep shards):
one safetensors file holding one or more patch sets. Version 2: entry ``i`` stores
``{i}.delta``, ``{i}.v``, ``{i}.correction``, ``{i}.u_norm`` (``‖[u_gate; u_in]‖`` per
layer and position, so norms need no model), ``{i}.token_ids``, ``{i}.zero_input``,
``{i}.kept`` (only when the kept sets are not the default ``{BOS, t}``) and, only with
``save(..., with_u=True)`` (or for a set that holds ``u`` itself), ``{i}.u_in`` and
``{i}.u_gate``, each in its own dtype; the safetensors metadata key ``icl_lens`` holds a JSON header
``{"format": "icl_lens.token_patches", "version": 2, "entries": [{"key", "model",
"tokens", "kept_bos", "default_kept", "gated", "weights_checksum", "layers", "positions"}]}``
(``layers`` and ``positions``: the model layers and prompt positions held; absent in older
files, meaning all). Loading without the model gives δ, v, the correction and the norms;
``u`` needs the dense weights (``TokenPatches.load(path, weights=icl_lens.dense_weights(model))``),
whose checksum must match the header's. Version-1 files (``u_in``/``u_gate`` stored, no δ)
still load. ``load``/``load_many`` check the header's schema and each tensor's presence,
dtype and shape against the others (``v`` fixes layers and positions) and raise one
:class:`PatchFileError` naming what is wrong.

**Selections.** ``token_patches(model, prompt, layers=...)`` and :meth:`TokenPatches.select`
give patches of some layers and/or query positions; they keep the true indices
(``layers``, ``positions``), which ``to_frame``, ``save``/``load``, ``u`` (the dense weights
of the true layer) and the kept-only forward use. :meth:`TokenPatches.select` slices every
tensor field along the axes its jaxtyping annotation names ``layer`` and ``pos`` (``pos``:
the query positions held; ``token``: the whole prompt, never sliced, as in ``token_ids`` and
the keys of ``kept``).
"""
from __future__ import annotations

import functools
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from icl_lens.patches._dense_weights import DenseWeights, RecordedWeights, StaleWeightsError, checksums_match
from icl_lens.core._factored import stack_outputs
from icl_lens.core._kept_attention import default_kept_mask

# The tidy table of patch norms (TokenPatches.to_frame, patch_norms, the sweeps' parts): one row per (layer, position).
NORM_COLUMNS = ("layer", "position", "token", "norm", "correction_norm")
FILE_FORMAT = "icl_lens.token_patches"
FILE_VERSION = 2
READABLE_VERSIONS = (1, 2)
_TENSORS = ("delta", "u_in", "u_gate", "v", "correction", "u_norm", "token_ids", "zero_input", "kept")


def norm_frame(layer: np.ndarray, position: np.ndarray, tokens: Sequence[str], norm: np.ndarray,
               correction_norm: np.ndarray) -> pd.DataFrame:
    """The norms table (columns :data:`NORM_COLUMNS`), one row per entry of the flat arrays; ``tokens``: the prompt's
    token texts, read at each row's position."""
    return pd.DataFrame({"layer": layer, "position": position,
                         "token": np.asarray(tokens, dtype=object)[position] if len(position) else [],
                         "norm": norm, "correction_norm": correction_norm}, columns=list(NORM_COLUMNS))


class PatchFileError(ValueError):
    """A file is not an icl_lens token-patch file, or does not hold the entry asked for."""


class NotHeldError(ValueError, IndexError):
    """A layer or position asked of a :class:`TokenPatches` that it does not hold (the message names those held)."""


@dataclass(frozen=True, eq=False, repr=False)
class TokenPatches:
    """Token patches of one prompt, in factored form (``u`` on demand): the layers ``layers`` × the query positions ``positions``.

    ``layers`` are the model's layer indices held, in increasing order (default: all,
    ``0..n_layers-1``); ``positions`` the prompt positions held (default: every token).
    Tensor axis ``layer`` runs over ``layers``, axis ``pos`` over ``positions``; ``tokens``
    and ``token_ids`` are always the whole prompt, and ``kept[i]`` is the kept-key set
    (over the whole prompt) of query ``positions[i]``. ``len(patches)`` is the number of
    positions held (the number of tokens, unless :meth:`select` picked some).

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
    token_ids: Int[Tensor, " token"]
    v: Float[Tensor, "layer *prompt pos d_model"]
    correction: Float[Tensor, "layer *prompt pos d_model"]
    kept: Bool[Tensor, "pos token"]
    kept_bos: bool
    zero_input: Bool[Tensor, "layer *prompt pos"]
    delta: Float[Tensor, "layer *prompt pos d_model"] | None = None
    weights: Any = None  # DenseWeights (every layer of the model), RecordedWeights (loaded file) or None
    stored_u_in: Float[Tensor, "layer *prompt pos d_mlp"] | None = None
    stored_u_gate: Float[Tensor, "layer *prompt pos d_mlp"] | None = None
    u_norm: Float[Tensor, "layer *prompt pos"] | None = None
    layers: tuple[int, ...] = ()
    positions: tuple[int, ...] = ()
    _memo: dict = field(default_factory=dict, init=False, compare=False)

    def __post_init__(self) -> None:
        if self.stored_u_in is None and self.delta is None:
            raise ValueError("TokenPatches needs delta (with weights) or stored_u_in")
        if self.stored_u_in is None and self.weights is None and self.u_norm is None:
            raise ValueError("TokenPatches made from delta needs the dense weights (weights=)")
        layers = tuple(int(x) for x in self.layers) or tuple(range(self.v.shape[0]))
        positions = tuple(int(x) for x in self.positions) or tuple(range(self.v.shape[-2]))
        for name, got, size in (("layers", layers, self.v.shape[0]), ("positions", positions, self.v.shape[-2])):
            if len(got) != size or any(b <= a for a, b in zip(got, got[1:])) or (got and got[0] < 0):
                raise ValueError(f"TokenPatches.{name} must be {size} increasing indices >= 0, got {got}")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "positions", positions)

    @property
    def n_layers(self) -> int:
        """Number of layers held (``len(layers)``)."""
        return self.v.shape[0]

    @property
    def n_positions(self) -> int:
        """Number of query positions held (``len(positions)``)."""
        return self.v.shape[-2]

    def __len__(self) -> int:
        """Number of query positions held: the prompt's number of tokens unless :meth:`select` picked some."""
        return self.n_positions

    @property
    def complete(self) -> bool:
        """Whether every position of the prompt is held (layers may still be a subset)."""
        return self.positions == tuple(range(len(self.tokens)))

    def __repr__(self) -> str:
        def span(idx: tuple[int, ...]) -> str:
            if idx and idx == tuple(range(idx[0], idx[-1] + 1)) and len(idx) > 2:
                return f"{idx[0]}..{idx[-1]}"
            return ",".join(map(str, idx[:8])) + (",…" if len(idx) > 8 else "")

        text = "".join(self.tokens)
        preview = repr(text if len(text) <= 40 else text[:39] + "…")
        where = "" if self.complete else f", positions {span(self.positions)}"
        batch = f", batch of {self.v.shape[1]}" if self.batched else ""
        tensors = [(f.name, getattr(self, f.name)) for f in fields(self)]
        tensors = [(name, t) for name, t in tensors if isinstance(t, Tensor)]
        sizes = ", ".join(f"{name} {'×'.join(map(str, t.shape))}" for name, t in tensors if t.ndim >= 3)
        total = sum(t.numel() * t.element_size() for _, t in tensors)
        model = self.model_name if len(self.model_name) <= 60 else self.model_name[:59] + "…"
        return (f"TokenPatches(model {model!r}, {len(self.tokens)} tokens {preview}{where}, "
                f"layers {span(self.layers)}{batch}, {str(self.v.dtype).removeprefix('torch.')}"
                f"{', gated' if self.gated else ''}; {sizes}; {total / 2**20:.2f} MiB)")

    def select(self, layers: Iterable[int] | int | None = None,
               positions: Iterable[int] | int | None = None) -> "TokenPatches":
        """The patches of some of the layers and/or query positions held, keeping their true indices.

        ``layers``: model layer indices among :attr:`layers` (negative ones count from the
        end of the layers held); ``positions``: prompt positions among :attr:`positions`
        (negative ones count from the end of the prompt). ``None`` keeps all; the result
        holds them in increasing order. Every tensor field is sliced along the axes its
        annotation names ``layer`` and ``pos`` (module docstring).
        """
        n_tokens = len(self.tokens)
        rows = {"layer": _pick(self.layers, layers, lambda w: self.layers[w] if w >= -self.n_layers else w, "layer"),
                "pos": _pick(self.positions, positions, lambda w: w + n_tokens, "position")}
        changes: dict[str, object] = {}
        for name, axes in _sliced_axes(type(self)).items():
            value = getattr(self, name)
            if value is None:
                continue
            for axis_name, axis in axes:
                index = torch.tensor(rows[axis_name], dtype=torch.long, device=value.device)
                value = value.index_select(axis % value.ndim, index)
            changes[name] = value
        return replace(self, **changes, layers=tuple(self.layers[i] for i in rows["layer"]),
                       positions=tuple(self.positions[i] for i in rows["pos"]))

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
    def gated(self) -> bool:
        if self.stored_u_in is not None:
            return self.stored_u_gate is not None
        return bool(self.weights.gated)

    @property
    def stores_u(self) -> bool:
        """Whether ``u`` is held (stored factors) rather than formed from ``δ`` on demand."""
        return self.stored_u_in is not None

    def layer_row(self, layer: int) -> int:
        """The row of the ``layer`` axis (of ``v``, ``delta``, ``norms()``, …) holding model layer ``layer``.

        ``layer``: a model layer number among :attr:`layers` (a negative one counts from the end
        of the layers held, as in :meth:`select`). A layer not held raises :class:`NotHeldError`
        naming the layers held. Every method here that takes a layer takes the model's number and
        goes through this.
        """
        return _pick(self.layers, [layer], lambda w: self.layers[w] if w >= -self.n_layers else w, "layer")[0]

    def _position_rows(self, index: Tensor) -> Tensor:
        """Rows of the ``pos`` axis holding the prompt positions ``index`` (any shape; all must be held)."""
        if self.complete:
            return index
        lookup = torch.full((len(self.tokens),), -1, dtype=torch.long, device=index.device)
        lookup[torch.tensor(self.positions, dtype=torch.long, device=index.device)] = torch.arange(
            self.n_positions, device=index.device)
        rows = lookup[index]
        if bool((rows < 0).any()):
            missing = sorted({int(t) for t in index[rows < 0].flatten().tolist()})[:8]
            raise NotHeldError(f"positions {missing} are not held; these patches hold positions {_shown(self.positions)}")
        return rows

    def u(self, layer: int, index: Tensor | None = None
          ) -> tuple[Float[Tensor, "*rows d_mlp"], Float[Tensor, "*rows d_mlp"] | None]:
        """``(u_in, u_gate)`` of model layer ``layer`` (``u_gate`` None for a plain MLP), every position held or ``index``.

        ``layer``: the model's layer number (:meth:`layer_row`; a layer not held raises
        :class:`NotHeldError`). ``index``: prompt positions (any shape, e.g. ``[batch, pos]``
        of source positions; every one held); the factors of ``δ`` at those positions only are
        formed. Raises :class:`~icl_lens.patches._dense_weights.StaleWeightsError` if the weights changed.
        """
        row = self.layer_row(layer)
        rows = None if index is None else self._position_rows(index)
        pick = (lambda t: t[row]) if rows is None else (lambda t: t[row][rows])  # noqa: E731
        if self.stored_u_in is not None:
            return pick(self.stored_u_in), None if self.stored_u_gate is None else pick(self.stored_u_gate)
        return self.weights.u(self.layers[row], pick(self.delta))

    @property
    def u_in(self) -> Float[Tensor, "layer *prompt pos d_mlp"]:
        """``W_in δ`` of every layer and position. Costly: forms ``layers × tokens × d_mlp`` floats; prefer :meth:`u`."""
        if self.stored_u_in is not None:
            return self.stored_u_in
        return torch.stack([self.u(layer)[0] for layer in self.layers])

    @property
    def u_gate(self) -> Float[Tensor, "layer *prompt pos d_mlp"] | None:
        """``W_gate δ`` of every layer and position (None for a plain MLP). Costly, like :attr:`u_in`."""
        if self.stored_u_in is not None:
            return self.stored_u_gate
        if not self.gated:
            return None
        return torch.stack([self.u(layer)[1] for layer in self.layers])

    def stacked_u(self, layer: int | None = None) -> Float[Tensor, "*layer pos d_u"]:
        """``[u_gate; u_in]`` (or ``u_in``): the output factor of the whole patch, of model layer ``layer`` or of all (costly)."""
        if layer is None:
            return stack_outputs(self.u_in, self.u_gate)
        u_in, u_gate = self.u(layer)
        return stack_outputs(u_in, u_gate)

    def u_coordinates(self, layer: int) -> Float[Tensor, "*prompt pos d_k"]:
        """Vectors with the inner products of ``[u_gate; u_in]`` of model layer ``layer``: ``R δ`` (``d_model`` wide), or ``u``.

        ``(R δ₁)·(R δ₂) = (U δ₁)·(U δ₂)``, so Gram matrices, cosines and norms of the output
        factors (:mod:`icl_lens.core._factored`) are the same from these, at ``d_model`` cost.
        ``layer``: the model's layer number, as in :meth:`u`.
        """
        row = self.layer_row(layer)
        if self.stored_u_in is not None:
            return stack_outputs(self.stored_u_in[row], None if self.stored_u_gate is None else self.stored_u_gate[row])
        return self.weights.coordinates(self.layers[row], self.delta[row])

    def output_norms(self) -> Float[Tensor, "layer *prompt pos"]:
        """``‖[u_gate; u_in]‖`` of every layer and position, from ``R δ`` (or the stored ``u``/norms); cached."""
        if "u_norm" not in self._memo:
            if self.u_norm is not None:
                out = self.u_norm
            elif self.stored_u_in is not None:
                out = torch.linalg.vector_norm(stack_outputs(self.stored_u_in, self.stored_u_gate), dim=-1)
            else:
                out = torch.stack([self.weights.norms(model_layer, self.delta[k]) for k, model_layer in enumerate(self.layers)])
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
        if self.layers[-1] >= weights.n_layers or (self.delta is not None and self.weights is not None
                                                   and weights.gated != self.gated):
            raise StaleWeightsError(f"weights of {weights.n_layers} layers (gated={weights.gated}) do not fit "
                                    f"patches of layers {self.layers[0]}..{self.layers[-1]} (gated={self.gated})")
        if self.weights is weights:
            return self
        recorded = None if self.weights is None else self.weights.checksum()
        if recorded is None or not checksums_match(recorded, weights.checksum()):
            raise StaleWeightsError(f"these weights are not the ones the patches of {self.model_name!r} were made "
                                    f"from (their checksums differ); recompute the patches with this model")
        return replace(self, weights=weights)

    def position_row(self, position: int) -> int:
        """The row of the ``pos`` axis holding prompt position ``position`` (negative: from the end of the
        prompt, as in :meth:`select`); a position not held raises :class:`NotHeldError`."""
        return _pick(self.positions, [position], lambda w: w + len(self.tokens), "position")[0]

    def kept_positions(self, query: int) -> list[int]:
        """Positions the context-free input of ``query`` (a prompt position held) keeps (sorted)."""
        return torch.nonzero(self.kept[self.position_row(query)]).flatten().tolist()

    def __getitem__(self, position: int) -> "TokenPatch":
        """``patches[t]``: the :class:`TokenPatch` of prompt position ``t``, every layer held.

        ``t`` is the prompt position (negative: from the end of the prompt), not the row among the
        positions held: after ``select(positions=[3, 5])``, ``p[5]`` is position 5 and ``p[0]``
        raises :class:`NotHeldError`. Iterating gives the positions held, in order
        (``len(patches)`` of them). For a range of positions use :meth:`select`.
        """
        if isinstance(position, slice):
            raise TypeError("patches[t] takes one prompt position; for several use patches.select(positions=...)")
        if self.batched:
            raise ValueError("these are the patches of a batch of prompts; index one prompt's: patches.prompt(b)[t]")
        row = self.position_row(position)
        t = self.positions[row]
        one = self.select(positions=t)
        if "norms" not in self._memo:  # iterating reads every position's: computed once
            self._memo["norms"] = (self.norms(), self.correction_norms())
        norm, correction_norm = (n[:, row] for n in self._memo["norms"])
        return TokenPatch(position=t, token=self.tokens[t], token_id=int(self.token_ids[t]), layers=self.layers,
                          v=one.v[:, 0], correction=one.correction[:, 0], norm=norm, correction_norm=correction_norm,
                          zero_input=one.zero_input[:, 0], kept=tuple(one.kept_positions(t)), patches=one)

    def __iter__(self) -> Iterator["TokenPatch"]:
        """The :class:`TokenPatch` of each position held, in order (``patches[t]`` for ``t`` in :attr:`positions`)."""
        return (self[t] for t in self.positions)

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
        return norm_frame(np.repeat(np.asarray(self.layers, dtype=np.int64), self.n_positions),
                          np.tile(np.asarray(self.positions, dtype=np.int64), self.n_layers), self.tokens,
                          norms.reshape(-1), corr.reshape(-1))

    def has_default_kept(self) -> bool:
        """Whether every query keeps ``{t}`` plus a kept BOS (the default removal)."""
        default = default_kept_mask(len(self.tokens), keep_bos=self.kept_bos, device=self.kept.device,
                                    queries=self.positions)
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
                 "weights_checksum": None if checksum is None else [dict(c) for c in checksum],
                 "layers": list(self.layers), "positions": list(self.positions)}
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
        raw = meta.get("icl_lens")
        if raw is None:
            raise PatchFileError(f"{path} has no icl_lens header; it was not written by TokenPatches.save")
        try:
            header = json.loads(raw)
        except (ValueError, RecursionError) as err:
            raise PatchFileError(f"{path}: the icl_lens header is not valid JSON ({type(err).__name__})") from None
        if not isinstance(header, dict):
            raise PatchFileError(f"{path}: the icl_lens header is not a JSON object")
        version = header.get("version")
        if header.get("format") != FILE_FORMAT or isinstance(version, bool) or version not in READABLE_VERSIONS:
            raise PatchFileError(f"{path}: unsupported format {header.get('format')!r} version {header.get('version')!r}")
        if not isinstance(header.get("entries"), list):
            raise PatchFileError(f"{path}: the header's entries are not a list")
        return header, tensors

    @staticmethod
    def load_many(path: str | os.PathLike, device: torch.device | str = "cpu",
                  weights: DenseWeights | None = None) -> dict[str, "TokenPatches"]:
        """Every patch set in ``path``, by key (a sweep shard maps prompt ids to patches).

        ``weights`` (``icl_lens.dense_weights(model)``): attach the dense weights so ``u`` can be
        formed from a version-2 file's ``δ``; refused unless they are the ones the file was made from.
        """
        path = Path(path)
        header, tensors = TokenPatches.read_file(path, device)
        entries, version = header["entries"], int(header["version"])
        out = {}
        for i, entry in enumerate(entries):
            patches = _checked_entry(path, i, entry, tensors, version, weights)
            if entry["key"] in out:
                raise PatchFileError(f"{path}: entry {i} repeats the key {entry['key']!r}")
            out[entry["key"]] = patches
        known = {f"{i}.{name}" for i in range(len(entries)) for name in _TENSORS}
        extra = sorted(set(tensors) - known)
        if extra:
            raise PatchFileError(f"{path}: tensors that no header entry describes: {', '.join(extra[:5])}")
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


@dataclass(frozen=True, eq=False, repr=False)
class TokenPatch:
    """The token patch of one prompt position at every layer held: what ``patches[t]`` returns.

    ``position``: the prompt position; ``token``/``token_id``: its token; ``layers``: the
    model layers held, which the first axis of ``v``, ``correction``, ``norm``,
    ``correction_norm`` and ``zero_input`` runs over; ``norm``: ``‖ΔW‖_F`` per layer;
    ``kept``: the positions its context-free input keeps. :meth:`u` gives the output factors of
    one layer; ``patches``: the one-position :class:`TokenPatches` it was read from.
    """

    position: int
    token: str
    token_id: int
    layers: tuple[int, ...]
    v: Float[Tensor, "layer d_model"]
    correction: Float[Tensor, "layer d_model"]
    norm: Float[Tensor, " layer"]
    correction_norm: Float[Tensor, " layer"]
    zero_input: Bool[Tensor, " layer"]
    kept: tuple[int, ...]
    patches: TokenPatches = field(repr=False)

    def __repr__(self) -> str:
        norms = ", ".join(f"{x:.3g}" for x in self.norm[:8].tolist()) + (", …" if len(self.layers) > 8 else "")
        return (f"TokenPatch(position {self.position}, token {self.token!r}, layers {_shown(self.layers)}, "
                f"norm [{norms}], kept {_shown(self.kept)})")

    def u(self, layer: int) -> tuple[Float[Tensor, " d_mlp"], Float[Tensor, " d_mlp"] | None]:
        """``(u_in, u_gate)`` of model layer ``layer`` at this position (:meth:`TokenPatches.u`)."""
        u_in, u_gate = self.patches.u(layer)
        return u_in[0], None if u_gate is None else u_gate[0]

    def to_frame(self) -> pd.DataFrame:
        """One row per layer held (columns :data:`NORM_COLUMNS`), the rows of ``to_frame()`` of the whole set."""
        return norm_frame(np.asarray(self.layers, dtype=np.int64), np.full(len(self.layers), self.position),
                          self.patches.tokens, self.norm.detach().cpu().double().numpy(),
                          self.correction_norm.detach().cpu().double().numpy())


MAX_LAYERS = 10_000  # layer indices a file without the weights' checksum may name (no model has more)
SLACK_BYTES = 100 * 2**20  # what a load may allocate beyond the file's own tensors (the default kept mask)


def _all_finite(t: Tensor, chunk: int = 1 << 22) -> bool:
    """Whether every value of ``t`` is finite, checked ``chunk`` values at a time (no full-size mask)."""
    flat = t.reshape(-1)
    return all(bool(torch.isfinite(flat[i:i + chunk]).all()) for i in range(0, flat.numel(), chunk))


_ENTRY_FIELDS = {"key": str, "model": str, "tokens": list, "kept_bos": bool, "default_kept": bool}


def _checked_entry(path: Path, i: int, entry, tensors: dict[str, Tensor], version: int,
                   weights: DenseWeights | None) -> TokenPatches:
    """Entry ``i`` of a patch file's header and its tensors as a :class:`TokenPatches`, after checking
    the header fields' types and every tensor's presence, dtype and shape (one :class:`PatchFileError`).

    Version 1 stores ``u_in`` (and ``u_gate``); version 2 stores ``delta`` and ``u_norm``, ``u``
    only when saved ``with_u`` (and ``gated``/``weights_checksum`` in the header).
    """
    if not isinstance(entry, dict):
        raise PatchFileError(f"{path}: header entry {i} is not a JSON object")
    where = f"{path}: entry {i} ({entry.get('key')!r})"
    for name, kind in {**_ENTRY_FIELDS, **({"gated": bool} if version >= 2 else {})}.items():
        if not isinstance(entry.get(name), kind):
            raise PatchFileError(f"{where}: header field {name!r} is missing or not a {kind.__name__}")
    if not all(isinstance(t, str) for t in entry["tokens"]):
        raise PatchFileError(f"{where}: header field 'tokens' holds a non-text token")
    checksum = entry.get("weights_checksum")
    if checksum is not None and not (isinstance(checksum, list) and all(isinstance(c, dict) for c in checksum)):
        raise PatchFileError(f"{where}: header field 'weights_checksum' is not a list of objects")
    n_tok = len(entry["tokens"])
    model_layers = len(checksum) if checksum else MAX_LAYERS  # the checksum has one entry per model layer
    for name, bound in (("layers", model_layers), ("positions", n_tok)):
        held = entry.get(name, [])
        if not isinstance(held, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in held):
            raise PatchFileError(f"{where}: header field {name!r} is not a list of indices")
        if held and max(held) >= bound:
            raise PatchFileError(f"{where}: {n_tok} tokens in the header but position {max(held)} in it"
                                 if name == "positions" else
                                 f"{where}: layer {max(held)} in the header is out of range (" +
                                 (f"the model has {bound} layers)" if checksum else f"at most {MAX_LAYERS} layers)"))
        if any(b <= a for a, b in zip(held, held[1:])):
            raise PatchFileError(f"{where}: header field {name!r} is not increasing (repeated or unsorted indices)")
    get = lambda name: tensors.get(f"{i}.{name}")  # noqa: E731
    factor = "u_in" if version == 1 or (get("delta") is None and get("u_in") is not None) else "delta"  # v2: δ, or u
    required = ((factor, "v", "correction", "token_ids", "zero_input") + (("u_norm",) if version >= 2 else ())
                + (() if entry["default_kept"] else ("kept",)))
    missing = [name for name in required if get(name) is None]
    if missing:
        raise PatchFileError(f"{where}: missing tensor(s) {', '.join(missing)}")
    v = get("v")
    if v.ndim != 3:
        raise PatchFileError(f"{where}: v has shape {tuple(v.shape)}, expected (layer, pos, d_model)")
    n_layers, n_pos = v.shape[:2]
    layers, positions = tuple(entry.get("layers", ())), tuple(entry.get("positions", ()))
    if not n_layers or not n_pos:
        raise PatchFileError(f"{where}: v holds {n_layers} layers and {n_pos} positions; a patch set holds at least one")
    if layers and len(layers) != n_layers:
        raise PatchFileError(f"{where}: {len(layers)} layers in the header but {n_layers} in v")
    if get("token_ids").shape != (n_tok,):
        raise PatchFileError(f"{where}: {n_tok} tokens in the header but token_ids has shape "
                             f"{tuple(get('token_ids').shape)}")
    u_in = get("u_in")
    d_mlp = u_in.shape[-1] if u_in is not None and u_in.ndim == 3 else -1
    expected = {"v": tuple(v.shape), "correction": tuple(v.shape), "delta": tuple(v.shape),
                "u_in": (n_layers, n_pos, d_mlp), "u_gate": (n_layers, n_pos, d_mlp), "u_norm": (n_layers, n_pos),
                "token_ids": (n_tok,), "zero_input": (n_layers, n_pos), "kept": (n_pos, n_tok)}
    for name, shape in expected.items():
        t = get(name)
        if t is not None and tuple(t.shape) != shape:
            raise PatchFileError(f"{where}: {name} has shape {tuple(t.shape)}, expected {shape} "
                                 f"(layers {n_layers}, positions {n_pos} from v)")
    if (len(positions) if positions else n_tok) != n_pos:
        raise PatchFileError(f"{where}: {len(positions) if positions else n_tok} positions in the header "
                             f"but {n_pos} in v")
    shared = ("delta", "u_in", "u_gate", "v", "correction")
    floats = {name: get(name).dtype for name in shared if get(name) is not None}
    if not all(d.is_floating_point for d in floats.values()) or len(set(floats.values())) != 1:
        raise PatchFileError(f"{where}: {', '.join(shared)} must share one floating dtype; got "
                             + ", ".join(f"{k} {str(d).removeprefix('torch.')}" for k, d in floats.items()))
    if get("u_norm") is not None and not get("u_norm").dtype.is_floating_point:
        raise PatchFileError(f"{where}: u_norm must be floating, got {str(get('u_norm').dtype).removeprefix('torch.')}")
    ids = get("token_ids")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise PatchFileError(f"{where}: token_ids must be integers, got {str(ids.dtype).removeprefix('torch.')}")
    for name in ("zero_input", "kept"):
        if get(name) is not None and get(name).dtype != torch.bool:
            raise PatchFileError(f"{where}: {name} must be bool, got {str(get(name).dtype).removeprefix('torch.')}")
    if (ids < 0).any():
        raise PatchFileError(f"{where}: token_ids holds a negative id")
    for name in ("delta", "u_in", "u_gate", "v", "correction", "u_norm"):
        if get(name) is not None and not _all_finite(get(name)):
            raise PatchFileError(f"{where}: {name} holds non-finite values (NaN or inf)")
    if get("u_norm") is not None and (get("u_norm") < 0).any():
        raise PatchFileError(f"{where}: u_norm holds negative norms")
    if entry["default_kept"]:
        own = sum(t.numel() * t.element_size() for t in tensors.values())
        if n_pos * n_tok > own + SLACK_BYTES:  # the kept mask made here, [pos, token] bools
            raise PatchFileError(f"{where}: the default kept mask of {n_pos} positions × {n_tok} tokens "
                                 f"({n_pos * n_tok / 2**20:.0f} MiB) would outgrow the file's own tensors "
                                 f"({own / 2**20:.0f} MiB) by more than {SLACK_BYTES // 2**20} MiB")
        kept = default_kept_mask(n_tok, keep_bos=entry["kept_bos"], device=ids.device, queries=positions or None)
    else:
        kept = get("kept")
    common = dict(model_name=entry["model"], tokens=tuple(entry["tokens"]), token_ids=ids, v=v,
                  correction=get("correction"), kept=kept, kept_bos=entry["kept_bos"], zero_input=get("zero_input"),
                  stored_u_in=u_in, stored_u_gate=get("u_gate"), layers=layers, positions=positions)
    if version == 1:  # u stored, no δ: the weights are not needed
        return TokenPatches(**common)
    held = layers or tuple(range(n_layers))
    recorded = RecordedWeights(checksum, entry["gated"], len(checksum) if checksum else max(held, default=-1) + 1)
    patches = TokenPatches(**common, delta=get("delta"), u_norm=get("u_norm"), weights=recorded)
    return patches if weights is None else patches.with_weights(weights)


def _shown(held: tuple[int, ...]) -> str:
    return ", ".join(map(str, held[:12])) + (", …" if len(held) > 12 else "")


def _pick(held: tuple[int, ...], wanted: Iterable[int] | int | None, negative: Callable[[int], int],
          what: str) -> list[int]:
    """Rows of ``held`` (increasing indices) holding the indices ``wanted``, in increasing order.

    ``negative`` maps a negative index to a true one. An index not held raises :class:`NotHeldError`;
    a non-integer, ``TypeError``.
    """
    if wanted is None:
        return list(range(len(held)))
    if isinstance(wanted, (Tensor, np.ndarray)):
        wanted = wanted.tolist()
    asked = list(wanted) if isinstance(wanted, Iterable) else [wanted]
    if not asked:
        raise ValueError(f"no {what}s selected; pass None for all")
    if any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) for w in asked):
        raise TypeError(f"{what}s must be integer indices, got {asked[:5]!r}")
    asked = [int(w) for w in asked]
    row = {index: i for i, index in enumerate(held)}
    true = [negative(w) if w < 0 else w for w in asked]
    bad = [w for w, t in zip(asked, true) if t not in row]
    if bad:
        raise NotHeldError(f"{what}s {bad} are not held; these patches hold {what}s {_shown(held)}")
    return sorted({row[t] for t in true})


_DIMS = re.compile(r"""\[\s*Tensor\s*,\s*['"]([^'"]*)['"]""")


@functools.cache
def _sliced_axes(cls: type) -> dict[str, list[tuple[str, int]]]:
    """``{field: [(axis name, axis index), ...]}`` for the ``layer`` and ``pos`` axes of each tensor field.

    Read from the fields' jaxtyping annotations: an axis after a variadic ``*name`` is
    counted from the end, so batched and single-prompt tensors slice alike.
    """
    out: dict[str, list[tuple[str, int]]] = {}
    for f in fields(cls):
        match = _DIMS.search(str(f.type))
        if match is None:
            continue
        dims = match.group(1).split()
        star = next((i for i, d in enumerate(dims) if d.startswith("*")), None)
        axes = [(d, i if star is None or i < star else i - len(dims)) for i, d in enumerate(dims)
                if d in ("layer", "pos")]
        if axes:
            out[f.name] = axes
    return out
