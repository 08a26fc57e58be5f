"""The MLP's first dense weights of every layer, for output factors on demand (pure torch).

A token patch is ``ΔW_d = u_d vᵀ`` with ``u_d = W_d δ`` for each first dense matrix
``W_d`` (``W_in``; ``W_gate`` and ``W_up`` for gated MLPs), ``δ = A − a`` and
``v = a/‖a‖²`` (Dherin et al. 2025, arXiv 2507.16003, Theorem 2.2; docs/design.md §2).
Keeping ``δ`` (``d_model`` floats) instead of ``u`` (``d_mlp`` floats per matrix) and
multiplying by ``W_d`` only when asked is what :class:`DenseWeights` is for.

**Norms and inner products without ``u``.** Stack ``U = [W_gate; W_in]`` (``W_in``
alone for plain MLPs) and take the thin QR factorisation ``U = Q R`` (``Q`` orthonormal
columns, ``R`` upper triangular ``d_model × d_model``). Then ``U δ = Q (R δ)`` and

    ‖U δ‖ = ‖R δ‖,    (U δ₁)·(U δ₂) = (R δ₁)·(R δ₂),

so every norm, cosine and Gram matrix of the stacked output factors follows from the
``d_model``-sized ``R δ`` (:meth:`DenseWeights.coordinates`). ``R`` is computed once per
layer in float64, lazily. It costs about as much as ``U δ`` for ``d_model`` rows (for Gemma 3
270M, ~0.5 s a layer on one core): :meth:`DenseWeights.norms` of fewer rows, while ``R`` is not
there yet, forms ``U δ`` directly instead (a live dashboard's keystroke: the new positions only).

**Validity.** A :class:`DenseWeights` holds references to the model's tensors, not
copies; it records each tensor's shape, storage address and version counter (bumped by
every in-place edit) and a probe (a few rows summed in float64, for edits through
``.data`` that skip the counter) and :meth:`DenseWeights.check` refuses to compute once
any of them changed. :meth:`DenseWeights.checksum` (float64 sum and sum of squares of
each matrix) identifies the weights' content across processes: a saved patch file
records it, and weights with another checksum are refused.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import torch
from jaxtyping import Float
from torch import Tensor


class StaleWeightsError(RuntimeError):
    """Dense weights changed, or are another model's, since the patches were made."""


class NonFiniteWeightsError(ValueError):
    """The model's MLP dense weights hold NaN or inf: no patch of them is defined (reload the model)."""


_NAMES = {"in": "W_in", "gate": "W_gate"}


def _non_finite(layers: Sequence[Mapping[str, Tensor]]) -> list[str]:
    """``"layer L W_in (k values)"`` for every dense matrix of ``layers`` holding NaN or inf."""
    bad = []
    for layer, ws in enumerate(layers):
        for k, w in ws.items():
            count = int((~torch.isfinite(w.detach())).sum())
            if count:
                bad.append(f"layer {layer} {_NAMES.get(k, k)} ({count} value{'s' if count > 1 else ''})")
    return bad


def _raise_non_finite(bad: list[str]) -> None:
    raise NonFiniteWeightsError(
        f"the model's MLP weights hold non-finite values (NaN or inf): {', '.join(bad[:6])}"
        f"{', …' if len(bad) > 6 else ''}; token patches need finite weights: reload the model "
        f"(a diverged fine-tune or an edit wrote them)")


@functools.lru_cache(maxsize=64)
def _probe_rows(n: int, device: torch.device) -> Tensor:
    """Up to 8 row indices spread over ``n`` rows (made once per height and device: a stamp is taken per layer
    on every keystroke of the live dashboard)."""
    return torch.linspace(0, n - 1, steps=min(8, n)).long().to(device)


def _probe(w: Tensor) -> float:
    """Float64 sum of up to 8 rows spread over ``w``: cheap, catches edits the version counter misses."""
    return float(w.detach()[_probe_rows(w.shape[0], w.device)].double().sum())


def _stamp(w: Tensor) -> tuple:
    return tuple(w.shape), w.data_ptr(), w._version, _probe(w)


class DenseWeights:
    """Per layer ``{"in": W_in}`` (plus ``"gate"`` if gated), ``[d_mlp, d_model]`` references.

    ``dtype``: the arithmetic dtype of the factors (float32 for half-precision models).
    """

    def __init__(self, layers: Sequence[Mapping[str, Tensor]], dtype: torch.dtype):
        if not layers:
            raise ValueError("DenseWeights needs at least one layer")
        self._layers = [dict(w) for w in layers]
        bad = _non_finite(self._layers)
        if bad:
            _raise_non_finite(bad)
        self.dtype = dtype
        self._stamps = [{k: _stamp(w) for k, w in ws.items()} for ws in self._layers]
        self._r: dict[tuple[int, str], Tensor] = {}
        self._checksum: list[dict[str, list[float]]] | None = None

    @property
    def n_layers(self) -> int:
        return len(self._layers)

    @property
    def gated(self) -> bool:
        return "gate" in self._layers[0]

    def valid(self) -> bool:
        """Whether every tensor is still the one (and holds the values) seen at creation."""
        return all(_stamp(w) == s[k] for ws, s in zip(self._layers, self._stamps) for k, w in ws.items())

    def same_tensors(self, layers: Sequence[Mapping[str, Tensor]]) -> bool:
        """Whether ``layers`` (the model's weights now) are the tensors held here: a module whose weight was
        swapped for another tensor (``torch.func.functional_call``, ``module.weight = ...``) leaves these
        references valid yet no longer the model's."""
        return len(layers) == self.n_layers and all(
            set(now) == set(held) and all(now[k].data_ptr() == held[k].data_ptr() and now[k].shape == held[k].shape
                                          for k in now)
            for now, held in zip(layers, self._layers))

    def check(self) -> None:
        if not self.valid():
            bad = _non_finite(self._layers)
            if bad:  # edited to NaN/inf since: say that, not "recompute" (which would fail the same way)
                _raise_non_finite(bad)
            raise StaleWeightsError("the model's dense weights changed in place since these patches were made; "
                                    "recompute the patches")

    def layer(self, layer: int) -> dict[str, Tensor]:
        """Layer ``layer``'s weights (checked, not copied)."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} is outside 0..{self.n_layers - 1}")
        ws = self._layers[layer]
        if any(_stamp(w) != self._stamps[layer][k] for k, w in ws.items()):
            self.check()  # the message
        return ws

    def u(self, layer: int, delta: Float[Tensor, "*rows d_model"]
          ) -> tuple[Float[Tensor, "*rows d_mlp"], Float[Tensor, "*rows d_mlp"] | None]:
        """``(W_in δ, W_gate δ)`` row-wise (``W_gate δ`` is None for a plain MLP), in ``delta``'s dtype."""
        ws = self.layer(layer)
        cast = lambda w: w.detach().to(device=delta.device, dtype=delta.dtype)  # noqa: E731
        gate = ws.get("gate")
        return delta @ cast(ws["in"]).T, (None if gate is None else delta @ cast(gate).T)

    def r(self, layer: int, device: torch.device | str | None = None) -> Float[Tensor, "d_model d_model"]:
        """``R`` of the thin QR ``[W_gate; W_in] = Q R`` (float64 QR, cast to :attr:`dtype`), cached."""
        ws = self.layer(layer)
        device = next(iter(ws.values())).device if device is None else torch.device(device)
        key = (layer, str(device))
        if key not in self._r:
            stacked = torch.cat([w.detach().double() for w in ws.values()], dim=0)
            self._r[key] = torch.linalg.qr(stacked, mode="r")[1].to(device=device, dtype=self.dtype)
        return self._r[key]

    def coordinates(self, layer: int, delta: Float[Tensor, "*rows d_model"]) -> Float[Tensor, "*rows d_model"]:
        """``R δ``: isometric to the stacked output factor ``[u_gate; u_in]`` (same norms and inner products)."""
        return delta @ self.r(layer, delta.device).to(delta.dtype).T

    def norms(self, layer: int, delta: Float[Tensor, "*rows d_model"]) -> Float[Tensor, "*rows"]:
        """``‖[W_gate; W_in] δ‖ = ‖R δ‖`` row-wise; from ``U δ`` itself when there are fewer rows than ``d_model``
        (cheaper than the QR; the same norms up to rounding). The path depends on the row count alone, never on
        whether ``R`` happens to be cached, so the same rows give the same bits in every process (a resumed sweep
        writes what a clean one writes)."""
        rows = delta[..., 0].numel()
        if rows < delta.shape[-1]:
            return torch.linalg.vector_norm(torch.cat([u for u in self.u(layer, delta) if u is not None], dim=-1),
                                            dim=-1)
        return torch.linalg.vector_norm(self.coordinates(layer, delta), dim=-1)

    def checksum(self) -> list[dict[str, list[float]]]:
        """Per layer and matrix ``[sum, sum of squares]`` in float64: the weights' content, across processes."""
        self.check()
        if self._checksum is None:
            self._checksum = [{k: [float(w.detach().double().sum()), float(w.detach().double().square().sum())]
                               for k, w in ws.items()} for ws in self._layers]
        return self._checksum


def checksums_match(a: Sequence[Mapping[str, Sequence[float]]], b: Sequence[Mapping[str, Sequence[float]]],
                    rel: float = 1e-9) -> bool:
    """Whether two :meth:`DenseWeights.checksum` values describe the same weights (up to summation order)."""
    if len(a) != len(b):
        return False
    for la, lb in zip(a, b):
        if set(la) != set(lb):
            return False
        for k in la:
            if not all(math.isclose(x, y, rel_tol=rel, abs_tol=1e-12) for x, y in zip(la[k], lb[k])):
                return False
    return True


class RecordedWeights:
    """What a patch file says about the weights it was made from; computes nothing.

    Stands in for :class:`DenseWeights` in patches loaded without the model: norms come
    from the file, ``u`` raises with the way to attach the weights.
    """

    def __init__(self, checksum: Sequence[Mapping[str, Sequence[float]]] | None, gated: bool, n_layers: int):
        self._checksum, self.gated, self.n_layers = checksum, gated, n_layers

    def valid(self) -> bool:
        return True

    def checksum(self) -> Sequence[Mapping[str, Sequence[float]]] | None:
        return self._checksum

    def _missing(self, *args, **kwargs):
        raise StaleWeightsError("these patches were loaded without the model: u needs its dense weights; load with "
                                "TokenPatches.load(path, weights=icl_lens.dense_weights(model)) or call "
                                "patches.with_weights(icl_lens.dense_weights(model))")

    u = r = coordinates = norms = layer = _missing
