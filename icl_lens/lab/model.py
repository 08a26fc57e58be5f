"""Small Pre-LN models for in-context linear regression, with TransformerLens hook points.

One block (Dherin et al. 2025, arXiv 2507.16003: contextual layer, then MLP):

    h = LN₁(r),  r' = r + M(h),  A = LN₂(r'),  out = r' + W_out σ(W_in A + b_in) + b_out

``M`` is the contextual layer (softmax attention, linear attention, delta rule or GRU;
:mod:`icl_lens.lab.mixers`). Tokens ``[x, y, is_query]`` are embedded linearly, the
prediction is ``ŷ_t = w_uᵀ LN_f(r_t) + b_u`` at every position (trained at the query).
Hook names per layer ``l``: ``blocks.l.hook_resid_pre``, ``blocks.l.hook_mix_in``,
``blocks.l.mix.hook_*``, ``blocks.l.hook_mix_out``, ``blocks.l.hook_resid_mid``,
``blocks.l.hook_mlp_in``, ``blocks.l.mlp.hook_pre``, ``blocks.l.mlp.hook_post``,
``blocks.l.hook_mlp_out``, ``blocks.l.hook_resid_post``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from icl_lens.lab.mixers import ARCHITECTURES, MIXERS
from icl_lens.lab.tasks import token_dim
from icl_lens.model.block_family import BlockFamily

# Where the shared weight-edit mechanism (icl_lens.model.weight_edits) reads and edits a lab block.
LAB_FAMILY = BlockFamily(name="lab", gated=False, mlp_input_hook="blocks.{layer}.hook_mlp_in",
                         dense_in_hook="blocks.{layer}.mlp.hook_pre", mlp_out_hook="blocks.{layer}.hook_mlp_out")


@dataclass(frozen=True)
class LabConfig:
    """Shape and training setting of one lab model."""

    arch: str = "softmax"
    d_x: int = 4
    d_model: int = 32
    d_mlp: int = 128
    n_layers: int = 10
    n_heads: int = 4
    n_context_train: int = 16

    def __post_init__(self):
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"unknown arch {self.arch!r}; choose one of {ARCHITECTURES}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    def to_dict(self) -> dict:
        return asdict(self)


class MLP(nn.Module):
    """``W_out σ(W_in A + b_in) + b_out`` with GELU; ``W_in`` is the weight the token patch edits."""

    def __init__(self, d_model: int, d_mlp: int):
        super().__init__()
        self.W_in = nn.Linear(d_model, d_mlp)
        self.W_out = nn.Linear(d_mlp, d_model)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, a: Tensor) -> Tensor:
        return self.W_out(self.hook_post(F.gelu(self.hook_pre(self.W_in(a)))))


class Block(nn.Module):
    def __init__(self, cfg: LabConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.mix = MIXERS[cfg.arch](cfg.d_model, cfg.n_heads)
        self.mlp = MLP(cfg.d_model, cfg.d_mlp)
        self.hook_resid_pre, self.hook_mix_in, self.hook_mix_out = HookPoint(), HookPoint(), HookPoint()
        self.hook_resid_mid, self.hook_mlp_in, self.hook_mlp_out = HookPoint(), HookPoint(), HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, r: Tensor) -> Tensor:
        r = self.hook_resid_pre(r)
        mid = self.hook_resid_mid(r + self.hook_mix_out(self.mix(self.hook_mix_in(self.ln1(r)))))
        return self.hook_resid_post(mid + self.hook_mlp_out(self.mlp(self.hook_mlp_in(self.ln2(mid)))))

    def step(self, r: Tensor, state):
        """One token (``batch × d_model``) through the block with a decoding state."""
        mixed, state = self.mix.step(self.ln1(r), state)
        mid = r + mixed
        return mid + self.mlp(self.ln2(mid)), state


class RegressionModel(HookedRootModule):
    """``[x, y, is_query]`` tokens → a scalar prediction per position."""

    icl_lens_family = LAB_FAMILY

    def __init__(self, cfg: LabConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Linear(token_dim(cfg.d_x), cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = nn.LayerNorm(cfg.d_model)
        self.unembed = nn.Linear(cfg.d_model, 1)
        self.hook_embed = HookPoint()
        self.setup()

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def check_tokens(self, tokens: Tensor) -> Tensor:
        d_tok = token_dim(self.cfg.d_x)
        if tokens.ndim != 3 or tokens.shape[-1] != d_tok or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be batch × pos × {d_tok} with pos ≥ 1, got {tuple(tokens.shape)}")
        if not torch.isfinite(tokens).all():
            raise ValueError("tokens contain NaN or inf")
        return tokens.to(self.dtype)

    def forward(self, tokens: Float[Tensor, "batch pos d_token"]) -> Float[Tensor, "batch pos"]:
        r = self.hook_embed(self.embed(self.check_tokens(tokens)))
        for block in self.blocks:
            r = block(r)
        return self.unembed(self.ln_final(r))[..., 0]

    def init_state(self, batch: int, max_len: int):
        return [b.mix.init_state(batch, max_len, self.dtype) for b in self.blocks]

    def step(self, token: Float[Tensor, "batch d_token"], states) -> tuple[Float[Tensor, " batch"], list]:
        """Decode one token with per-layer states (KV cache for softmax, fixed state otherwise)."""
        r = self.embed(token.to(self.dtype))
        new = []
        for block, st in zip(self.blocks, states):
            r, st = block.step(r, st)
            new.append(st)
        return self.unembed(self.ln_final(r))[..., 0], new

    def state_bytes(self, states) -> int:
        return sum(b.mix.state_bytes(s) for b, s in zip(self.blocks, states))


def build_model(cfg: LabConfig, seed: int = 0) -> RegressionModel:
    torch.manual_seed(seed)
    return RegressionModel(cfg)


__all__ = ["LabConfig", "RegressionModel", "build_model"]
