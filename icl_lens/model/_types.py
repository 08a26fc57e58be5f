"""The type of the ``model`` every public function takes (a TransformerLens 4 ``TransformerBridge``),
and the dtype icl_lens computes its patches and edits of that model in (:func:`patch_dtype`).

icl_lens reads models through TransformerLens hooks (Dherin et al. 2025, arXiv 2507.16003,
computed as in docs/design.md §2); TransformerLens 4 has no ``HookedTransformer``, so the model
is a ``TransformerBridge`` (``icl_lens.load_model`` returns one, and wraps a Hugging Face
model into one). ``Model`` is that class, for annotations::

    from icl_lens.model._types import Model

    def my_analysis(model: Model, prompt: str) -> float: ...

Importing ``Model`` at run time imports TransformerLens; icl_lens's own modules import it
for type checkers only (``if TYPE_CHECKING``), so ``import icl_lens`` stays light.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeAlias

    import torch

    from transformer_lens.model_bridge import TransformerBridge

    Model: TypeAlias = TransformerBridge


def patch_dtype(model) -> torch.dtype:
    """Patch arithmetic runs in float32 for half-precision models, else in the model's dtype."""
    import torch

    dtype = model.cfg.dtype
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def __getattr__(name: str) -> Any:
    if name == "Model":
        from transformer_lens.model_bridge import TransformerBridge

        return TransformerBridge
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Model", "patch_dtype"]
