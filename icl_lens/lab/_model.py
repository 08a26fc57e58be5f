"""Small Pre-LN models for in-context linear regression, with TransformerLens hook points.

One block (Dherin et al. 2025, arXiv 2507.16003: contextual layer, then MLP):

    h = LN₁(r),  r' = r + M(h),  A = LN₂(r'),  out = r' + W_out σ(W_in A + b_in) + b_out

``M`` is the contextual layer (softmax attention, linear attention, delta rule or GRU;
:mod:`icl_lens.lab._mixers`). Tokens ``[x, y, is_query]`` are embedded linearly, the
prediction is ``ŷ_t = w_uᵀ LN_f(r_t) + b_u`` at every position (trained at the query).

Ablations are configuration flags (:class:`LabConfig`): ``skip=False`` drops both skip
connections (``r' = M(h)``, ``out = W_out σ(…)``), ``layer_norm=False`` replaces every
LayerNorm by the identity, ``embed=False`` feeds the tokens themselves as the residual
stream (``d_model`` = token size) and reads the prediction from the label slot of the
last residual, ``query_flag=False`` drops the query flag from the tokens and
``attn_bias=False`` drops the bias of the contextual layer's output projection ``W_O``. The
paper's first experiment is the single block with all four off:
``out = W_out σ(W_in M(C, x) + b_in) + b_out``, ``ŷ`` = its last coordinate.
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

from icl_lens.lab._mixers import ARCHITECTURES, MIXERS
from icl_lens.lab._tasks import query_tokens, token_dim
from icl_lens.model._block_family import BlockFamily

@dataclass(frozen=True)
class LabFamily(BlockFamily):
    """The lab block's entry: :class:`~icl_lens.model._block_family.BlockFamily` hook names (residual
    stream, MLP input ``A``, ``W_in`` output, the contextual branch's output ``attn_C``) plus the
    contextual layer's own (its input ``LN₁ r`` and its internal ``hook_*`` points). Every lab
    hook name comes from here."""

    mix_in_hook: str = "blocks.{layer}.hook_mix_in"
    mixer_hook: str = "blocks.{layer}.mix.hook_{name}"

    def mix_in(self, layer: int) -> str:
        """Input of the contextual layer, ``h = LN₁(r)``."""
        return self.mix_in_hook.format(layer=layer)

    def mixer(self, layer: int, name: str) -> str:
        """The contextual layer's hook point ``hook_{name}`` (``q``, ``k``, ``v``, ``z``, ``attn_scores``, ``beta``...)."""
        return self.mixer_hook.format(layer=layer, name=name)


# Where the shared weight-edit mechanism (icl_lens.model._weight_edits) and the lab read and edit a lab block.
LAB_FAMILY = LabFamily(name="lab", gated=False, mlp_input_hook="blocks.{layer}.hook_mlp_in",
                       dense_in_hook="blocks.{layer}.mlp.hook_pre", mlp_out_hook="blocks.{layer}.hook_mlp_out",
                       attn_out_hook="blocks.{layer}.hook_mix_out", dense_in_input_hook=None)


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
    skip: bool = True
    layer_norm: bool = True
    embed: bool = True
    query_flag: bool = True
    attn_bias: bool = True

    def __post_init__(self):
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"unknown arch {self.arch!r}; choose one of {ARCHITECTURES}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if not self.embed and self.d_model != self.token_dim:
            raise ValueError(f"without an embedding d_model must equal the token size {self.token_dim}, "
                             f"got {self.d_model}")

    @property
    def token_dim(self) -> int:
        return token_dim(self.d_x, self.query_flag)

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


def _norm(cfg: LabConfig) -> nn.Module:
    return nn.LayerNorm(cfg.d_model) if cfg.layer_norm else nn.Identity()


class Block(nn.Module):
    def __init__(self, cfg: LabConfig):
        super().__init__()
        self.ln1, self.ln2 = _norm(cfg), _norm(cfg)
        self.skip = cfg.skip
        self.mix = MIXERS[cfg.arch](cfg.d_model, cfg.n_heads)
        if not cfg.attn_bias:  # the contextual layer's output projection without its bias
            self.mix.W_O = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.mlp = MLP(cfg.d_model, cfg.d_mlp)
        self.hook_resid_pre, self.hook_mix_in, self.hook_mix_out = HookPoint(), HookPoint(), HookPoint()
        self.hook_resid_mid, self.hook_mlp_in, self.hook_mlp_out = HookPoint(), HookPoint(), HookPoint()
        self.hook_resid_post = HookPoint()

    def residual(self, r: Tensor, branch: Tensor) -> Tensor:
        """``r + branch`` with skip connections, ``branch`` without."""
        return r + branch if self.skip else branch

    def forward(self, r: Tensor, alone: bool = False) -> Tensor:
        r = self.hook_resid_pre(r)
        h = self.hook_mix_in(self.ln1(r))
        mid = self.hook_resid_mid(self.residual(r, self.hook_mix_out(self.mix.alone(h) if alone else self.mix(h))))
        return self.hook_resid_post(self.residual(mid, self.hook_mlp_out(self.mlp(self.hook_mlp_in(self.ln2(mid))))))

    def step(self, r: Tensor, state):
        """One token (``batch × d_model``) through the block with a decoding state."""
        mixed, state = self.mix.step(self.ln1(r), state)
        mid = self.residual(r, mixed)
        return self.residual(mid, self.mlp(self.ln2(mid))), state


class RegressionModel(HookedRootModule):
    """``[x, y, is_query]`` tokens → a scalar prediction per position."""

    icl_lens_family = LAB_FAMILY

    def __init__(self, cfg: LabConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Linear(cfg.token_dim, cfg.d_model) if cfg.embed else nn.Identity()
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = _norm(cfg) if cfg.embed else nn.Identity()
        self.unembed = nn.Linear(cfg.d_model, 1) if cfg.embed else None
        self.hook_embed = HookPoint()
        self.setup()

    @property
    def dtype(self) -> torch.dtype:
        return self.blocks[0].mlp.W_in.weight.dtype

    def check_tokens(self, tokens: Tensor) -> Tensor:
        d_tok = self.cfg.token_dim
        if tokens.ndim != 3 or tokens.shape[-1] != d_tok or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be batch × pos × {d_tok} with pos ≥ 1, got {tuple(tokens.shape)}")
        if not torch.isfinite(tokens).all():
            raise ValueError("tokens contain NaN or inf")
        return tokens.to(self.dtype)

    def query_tokens(self, x: Float[Tensor, "*batch d_x"]) -> Float[Tensor, "*batch d_token"]:
        """Query tokens in this model's layout (``[x, 0, 1]`` or ``[x, 0]``)."""
        return query_tokens(x.to(self.dtype), query_flag=self.cfg.query_flag)

    def read_out(self, r: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos"]:
        """The prediction from the last residual: ``w_uᵀ LN_f(r) + b_u``, or its label slot without an embedding."""
        return self.unembed(self.ln_final(r))[..., 0] if self.unembed is not None else r[..., self.cfg.d_x]

    def forward(self, tokens: Float[Tensor, "batch pos d_token"], alone: bool = False) -> Float[Tensor, "batch pos"]:
        """Predictions at every position; ``alone=True`` runs every position with its context removed
        (the contextual layer sees only the position itself; the rest of a block is position-wise)."""
        r = self.hook_embed(self.embed(self.check_tokens(tokens)))
        for block in self.blocks:
            r = block(r, alone)
        return self.read_out(r)

    def init_state(self, batch: int, max_len: int):
        return [b.mix.init_state(batch, max_len, self.dtype) for b in self.blocks]

    def step(self, token: Float[Tensor, "batch d_token"], states) -> tuple[Float[Tensor, " batch"], list]:
        """Decode one token with per-layer states (KV cache for softmax, fixed state otherwise)."""
        r = self.embed(token.to(self.dtype))
        new = []
        for block, st in zip(self.blocks, states):
            r, st = block.step(r, st)
            new.append(st)
        return self.read_out(r[:, None])[:, 0], new

    def state_bytes(self, states) -> int:
        return sum(b.mix.state_bytes(s) for b, s in zip(self.blocks, states))


def build_model(cfg: LabConfig, seed: int = 0) -> RegressionModel:
    torch.manual_seed(seed)
    return RegressionModel(cfg)


__all__ = ["LAB_FAMILY", "LabConfig", "LabFamily", "RegressionModel", "build_model"]
