"""`TokenPatches`: the factored token patches of every layer and position of a prompt.

For layer ``l`` and position ``t`` (docs/design.md §2; Dherin et al. 2025, arXiv 2507.16003):

    ΔW_in[l,t]   = u_in[l,t]   v[l,t]ᵀ        (W_up for gated MLPs)
    ΔW_gate[l,t] = u_gate[l,t] v[l,t]ᵀ        (gated MLPs only)
    b_out[l,t]  += correction[l,t]            (skip-connection term attn_C − attn_0)

with ``u = W δ``, ``v = a/‖a‖²``, ``δ = A − a``. The patch norm plotted everywhere is
``‖ΔW‖_F = sqrt(‖u_gate‖² + ‖u_in‖²)·‖v‖``; the correction norm stands beside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from icl_lens.core.factored import patch_norm, stack_outputs


@dataclass(frozen=True, eq=False)
class TokenPatches:
    """Token patches of one prompt, all layers × positions, in factored form."""

    model_name: str
    tokens: tuple[str, ...]
    token_ids: Int[Tensor, " pos"]
    u_in: Float[Tensor, "layer pos d_mlp"]
    u_gate: Float[Tensor, "layer pos d_mlp"] | None
    v: Float[Tensor, "layer pos d_model"]
    correction: Float[Tensor, "layer pos d_model"]
    kept: Bool[Tensor, "pos pos"]
    kept_bos: bool
    zero_input: Bool[Tensor, "layer pos"] = field(repr=False)

    @property
    def n_layers(self) -> int:
        return self.v.shape[0]

    @property
    def n_positions(self) -> int:
        return self.v.shape[1]

    @property
    def positions(self) -> list[int]:
        return list(range(self.n_positions))

    @property
    def gated(self) -> bool:
        return self.u_gate is not None

    def stacked_u(self) -> Float[Tensor, "layer pos d_u"]:
        """``[u_gate; u_in]`` (or ``u_in``): the output factor of the whole patch."""
        return stack_outputs(self.u_in, self.u_gate)

    def norms(self) -> Float[Tensor, "layer pos"]:
        """Frobenius norm of each token patch, ``sqrt(‖u_gate‖²+‖u_in‖²)·‖v‖``."""
        return patch_norm(self.stacked_u(), self.v)

    def correction_norms(self) -> Float[Tensor, "layer pos"]:
        """Norm of the skip-connection correction ``‖attn_C − attn_0‖``."""
        return torch.linalg.vector_norm(self.correction, dim=-1)

    def kept_positions(self, query: int) -> list[int]:
        """Positions the context-free input of ``query`` keeps (sorted)."""
        return torch.nonzero(self.kept[query]).flatten().tolist()

    def keep_parts(self, *, w_in: bool = True, correction: bool = True) -> "TokenPatches":
        """The same patches with the weight part (``u_in``, ``u_gate``) and/or the skip correction zeroed."""
        zero = lambda t: None if t is None else torch.zeros_like(t)  # noqa: E731
        return replace(self, u_in=self.u_in if w_in else zero(self.u_in),
                       u_gate=self.u_gate if w_in else zero(self.u_gate),
                       correction=self.correction if correction else zero(self.correction))

    def to(self, device: torch.device | str) -> "TokenPatches":
        """A copy with every tensor on ``device``."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return replace(
            self,
            token_ids=move(self.token_ids),
            u_in=move(self.u_in),
            u_gate=move(self.u_gate),
            v=move(self.v),
            correction=move(self.correction),
            kept=move(self.kept),
            zero_input=move(self.zero_input),
        )

    def to_frame(self) -> pd.DataFrame:
        """Tidy table: one row per (layer, position) with token, norm and correction norm."""
        norms = self.norms().detach().cpu().double()
        corr = self.correction_norms().detach().cpu().double()
        rows = [
            {
                "layer": layer,
                "position": pos,
                "token": self.tokens[pos],
                "norm": float(norms[layer, pos]),
                "correction_norm": float(corr[layer, pos]),
            }
            for layer in range(self.n_layers)
            for pos in range(self.n_positions)
        ]
        return pd.DataFrame(rows, columns=["layer", "position", "token", "norm", "correction_norm"])
