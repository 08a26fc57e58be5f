"""The contextual layers of the lab models: what mixes information across positions.

Every mixer maps ``h`` (``batch × pos × d_model``, causal) to ``batch × pos × d_model``
and exposes TransformerLens hook points. Four families (McDermott, Heath, Parhi 2026,
arXiv 2606.25342 for the regression view; Dherin et al. 2025, arXiv 2507.16003 for the
contextual-block view, Theorem 2.2 holding for any of them):

- ``softmax``: multi-head softmax attention, ``z_t = Σ_{j≤t} softmax_j(q_t·k_j/√d) v_j`` —
  a Nadaraya–Watson kernel regressor whose memory (the key/value cache) grows with ``t``.
- ``linear``: normalised linear attention with ``φ = elu + 1``,
  ``S_t = S_{t−1} + v_t φ(k_t)ᵀ``, ``z_t = S_t φ(q_t) / (ζ_tᵀ φ(q_t))``, ``ζ_t = ζ_{t−1} + φ(k_t)``:
  ``S`` takes one gradient step (rate 1) on the Hebbian loss ``−⟨S φ(k_t), v_t⟩``.
- ``delta``: the delta rule (fast-weight memory), unit-norm keys and queries,
  ``S_t = S_{t−1} − β_t (S_{t−1} k_t − v_t) k_tᵀ``, ``z_t = S_t q_t``: one gradient step of
  rate ``β_t`` on ``½‖S k_t − v_t‖²``.
- ``gru``: a GRU cell run over the sequence (a recurrent layer with no explicit loss).

Each has ``forward`` (whole sequence), ``context_free`` (each position with its context
removed: the query alone, docs/design.md §2 with kept set ``{t}``), and ``init_state`` /
``step`` / ``state_bytes`` for token-by-token decoding with a cache or a fixed state.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from icl_lens.core._kept_attention import bos_and_self_output
from icl_lens.lab._online_regression import delta_update, hebbian_update

ARCHITECTURES = ("softmax", "linear", "delta", "gru")


def _causal_fill(scores: Tensor) -> Tensor:
    t = scores.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=scores.device).tril()
    return scores.masked_fill(~causal, torch.finfo(scores.dtype).min)


class _Mixer(nn.Module):
    def alone(self, h: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """Output at every position when the position sees only itself (length-1 sequences)."""
        b, t, d = h.shape
        return self(h.reshape(b * t, 1, d)).reshape(b, t, d)

    def context_free(self, h: Float[Tensor, "batch pos d_model"], cached: dict[str, Tensor]) -> Tensor:
        """:meth:`alone`, or the same from the contextual pass's cache where the layer can."""
        return self.alone(h)

    def state_bytes(self, state) -> int:
        tensors = state if isinstance(state, (tuple, list)) else (state,)
        return sum(x.numel() * x.element_size() for x in tensors if isinstance(x, Tensor))


class SoftmaxAttention(_Mixer):
    """Causal multi-head softmax attention (no positional encoding)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.W_Q = nn.Linear(d_model, d_model, bias=False)
        self.W_K = nn.Linear(d_model, d_model, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)
        self.W_O = nn.Linear(d_model, d_model)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_attn_scores, self.hook_pattern, self.hook_z = HookPoint(), HookPoint(), HookPoint()

    def _heads(self, x: Tensor) -> Tensor:
        return x.reshape(*x.shape[:-1], self.n_heads, self.d_head)

    def forward(self, h: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        q = self.hook_q(self._heads(self.W_Q(h)))
        k = self.hook_k(self._heads(self.W_K(h)))
        v = self.hook_v(self._heads(self.W_V(h)))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.d_head)
        scores = self.hook_attn_scores(_causal_fill(scores))
        pattern = self.hook_pattern(torch.softmax(scores, dim=-1))
        z = self.hook_z(torch.einsum("bhqk,bkhd->bqhd", pattern, v))
        return self.W_O(z.flatten(-2))

    def context_free(self, h: Tensor, cached: dict[str, Tensor]) -> Tensor:
        """Cached scores renormalised over the kept key ``{t}`` (``core.kept_attention``), then ``W_O``."""
        scores, values = cached["hook_attn_scores"], cached["hook_v"]
        z0 = torch.stack([bos_and_self_output(s, v, keep_bos=False) for s, v in zip(scores, values)])
        return self.W_O(z0.flatten(-2))

    def init_state(self, batch: int, max_len: int, dtype: torch.dtype):
        shape = (batch, max_len, self.n_heads, self.d_head)
        return [torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype), 0]

    def step(self, h: Float[Tensor, "batch d_model"], state):
        k_cache, v_cache, t = state
        q, k, v = self._heads(self.W_Q(h)), self._heads(self.W_K(h)), self._heads(self.W_V(h))
        k_cache[:, t], v_cache[:, t] = k, v
        scores = torch.einsum("bhd,bkhd->bhk", q, k_cache[:, : t + 1]) / math.sqrt(self.d_head)
        z = torch.einsum("bhk,bkhd->bhd", torch.softmax(scores, -1), v_cache[:, : t + 1])
        return self.W_O(z.flatten(-2)), [k_cache, v_cache, t + 1]

    def state_bytes(self, state) -> int:
        k_cache, v_cache, t = state  # only the filled part of the preallocated cache counts
        return 2 * t * k_cache[0, 0].numel() * k_cache.shape[0] * k_cache.element_size()


def feature_map(x: Tensor) -> Tensor:
    """``φ(x) = elu(x) + 1`` (positive features, Katharopoulos et al. 2020)."""
    return F.elu(x) + 1


class LinearAttention(_Mixer):
    """Causal normalised linear attention: a fixed-size state ``(S, ζ)`` per head."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.W_Q = nn.Linear(d_model, d_model, bias=False)
        self.W_K = nn.Linear(d_model, d_model, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)
        self.W_O = nn.Linear(d_model, d_model)
        self.hook_q, self.hook_k, self.hook_v, self.hook_z = HookPoint(), HookPoint(), HookPoint(), HookPoint()

    def _heads(self, x: Tensor) -> Tensor:
        return x.reshape(*x.shape[:-1], self.n_heads, self.d_head)

    def forward(self, h: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        q = self.hook_q(feature_map(self._heads(self.W_Q(h))))
        k = self.hook_k(feature_map(self._heads(self.W_K(h))))
        v = self.hook_v(self._heads(self.W_V(h)))
        t = h.shape[1]
        causal = torch.ones(t, t, dtype=h.dtype, device=h.device).tril()
        sim = torch.einsum("bqhd,bkhd->bhqk", q, k) * causal
        z = torch.einsum("bhqk,bkhd->bqhd", sim / sim.sum(-1, keepdim=True), v)
        return self.W_O(self.hook_z(z).flatten(-2))

    def init_state(self, batch: int, max_len: int, dtype: torch.dtype):
        return [torch.zeros(batch, self.n_heads, self.d_head, self.d_head, dtype=dtype),
                torch.zeros(batch, self.n_heads, self.d_head, dtype=dtype)]

    def step(self, h: Float[Tensor, "batch d_model"], state):
        S, zeta = state
        q, k = feature_map(self._heads(self.W_Q(h))), feature_map(self._heads(self.W_K(h)))
        v = self._heads(self.W_V(h))
        S, zeta = hebbian_update(S, k, v), zeta + k
        z = torch.einsum("bhvk,bhk->bhv", S, q) / (zeta * q).sum(-1, keepdim=True)
        return self.W_O(z.flatten(-2)), [S, zeta]

    def states(self, h: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos head d_head d_head"]:
        """The Hebbian state ``S_t`` after every position (for the online-regression view)."""
        k = feature_map(self._heads(self.W_K(h)))
        v = self._heads(self.W_V(h))
        return torch.einsum("bthv,bthk->bthvk", v, k).cumsum(1)


class DeltaRule(_Mixer):
    """Causal delta-rule layer (fast-weight memory) with learned per-head rates ``β_t``."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.W_Q = nn.Linear(d_model, d_model, bias=False)
        self.W_K = nn.Linear(d_model, d_model, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)
        self.W_beta = nn.Linear(d_model, n_heads)
        self.W_O = nn.Linear(d_model, d_model)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_beta, self.hook_z = HookPoint(), HookPoint()

    def _heads(self, x: Tensor) -> Tensor:
        return x.reshape(*x.shape[:-1], self.n_heads, self.d_head)

    def _qkvb(self, h: Tensor):
        q = self.hook_q(F.normalize(self._heads(self.W_Q(h)), dim=-1))
        k = self.hook_k(F.normalize(self._heads(self.W_K(h)), dim=-1))
        v = self.hook_v(self._heads(self.W_V(h)))
        beta = self.hook_beta(torch.sigmoid(self.W_beta(h)))
        return q, k, v, beta

    def states(self, h: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos head d_head d_head"]:
        """The fast weights ``S_t`` after every position."""
        _, k, v, beta = self._qkvb(h)
        S = torch.zeros(h.shape[0], self.n_heads, self.d_head, self.d_head, dtype=h.dtype, device=h.device)
        out = []
        for t in range(h.shape[1]):
            S = delta_update(S, k[:, t], v[:, t], beta[:, t])
            out.append(S)
        return torch.stack(out, 1)

    def forward(self, h: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """Parallel form of the recurrence (the WY / UT representation): with ``S_t = Σ_{j≤t} u_j k_jᵀ``,
        ``u_t = β_t (v_t − Σ_{i<t} (k_i·k_t) u_i)``, i.e. ``(I + diag(β) tril₋₁(K Kᵀ)) U = diag(β) V``
        (unit lower-triangular), and ``z_t = S_t q_t = Σ_{j≤t} (k_j·q_t) u_j``. Equal to the step-by-step
        update (:meth:`states`, :meth:`step`) up to rounding."""
        q, k, v, beta = self._qkvb(h)
        q, k, v, beta = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), beta.transpose(1, 2)  # b h t ·
        t = h.shape[1]
        strict = torch.ones(t, t, dtype=torch.bool, device=h.device).tril(-1)
        system = torch.eye(t, dtype=h.dtype, device=h.device) + beta[..., None] * (k @ k.transpose(-1, -2)) * strict
        u = torch.linalg.solve_triangular(system, beta[..., None] * v, upper=False, unitriangular=True)
        z = ((q @ k.transpose(-1, -2)) * (~strict.T)) @ u  # keys j ≤ t (lower triangle incl. diagonal)
        z = self.hook_z(z.transpose(1, 2))
        return self.W_O(z.flatten(-2))

    def init_state(self, batch: int, max_len: int, dtype: torch.dtype):
        return [torch.zeros(batch, self.n_heads, self.d_head, self.d_head, dtype=dtype)]

    def step(self, h: Float[Tensor, "batch d_model"], state):
        q, k, v, beta = self._qkvb(h[:, None])
        S = delta_update(state[0], k[:, 0], v[:, 0], beta[:, 0])
        z = torch.einsum("bhvk,bhk->bhv", S, q[:, 0])
        return self.W_O(z.flatten(-2)), [S]


class GRUMixer(_Mixer):
    """A GRU over the sequence, then a linear read-out: ``z_t = W_O h_t^{GRU}``."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.gru = nn.GRU(d_model, d_model, batch_first=True)
        self.W_O = nn.Linear(d_model, d_model)
        self.hook_hidden = HookPoint()

    def forward(self, h: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        hidden, _ = self.gru(h)
        return self.W_O(self.hook_hidden(hidden))

    def init_state(self, batch: int, max_len: int, dtype: torch.dtype):
        return [torch.zeros(1, batch, self.gru.hidden_size, dtype=dtype)]

    def step(self, h: Float[Tensor, "batch d_model"], state):
        out, hn = self.gru(h[:, None], state[0])
        return self.W_O(out[:, 0]), [hn]


MIXERS = {"softmax": SoftmaxAttention, "linear": LinearAttention, "delta": DeltaRule, "gru": GRUMixer}
