"""The gain-free RMS normalisation ``x / sqrt(mean(x²) + eps)``.

Gemma-style blocks end their MLP branch in an RMSNorm with gain ``(1 + w)``; a thought
vector fitted as a gain update ``g`` adds ``g ⊙ ŷ`` with ``ŷ`` this normalised output
(docs/design.md §4; Goldwaser, Munn, Gonzalvo, Dherin, arXiv 2511.17864).
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor


def rms_normalize(x: Float[Tensor, "*batch d"], eps: float) -> Float[Tensor, "*batch d"]:
    """``x / sqrt(mean(x²) + eps)`` (computed in float32 at least)."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
