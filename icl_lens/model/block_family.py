"""Which transformer blocks icl_lens can patch exactly, and where their parts live.

A *block family* names the layout of one decoder block as TransformerBridge exposes it
(docs/design.md §2): its flags (gated MLP, norms after attention / after the MLP) and
the hook points icl_lens reads and edits. Three are supported and tested for the
equivalence identity:

- ``gpt2``: LayerNorm, biases, absolute positions, plain MLP ``W_in`` (GPT-2 and kin);
- ``llama``: RMSNorm, gated SiLU MLP (``W_gate``, ``W_up``), RoPE, GQA (Llama, SmolLM2);
- ``gemma3``: sandwich RMSNorms (``ln1_post``, ``ln2_post``), gated GeLU, QK-norm,
  sliding-window layers (Gemma 3).

A model that is not a bridge (the regression lab's models) names its own hook points by
carrying a ``BlockFamily`` in its ``icl_lens_family`` attribute.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

FAMILY_OF_ARCHITECTURE = {
    "GPT2LMHeadModel": "gpt2",
    "LlamaForCausalLM": "llama",
    "Gemma3ForCausalLM": "gemma3",
}
SUPPORTED_FAMILIES = {
    "gpt2": "LayerNorm + biases + absolute positions + plain MLP (GPT2LMHeadModel)",
    "llama": "RMSNorm + gated SiLU MLP + RoPE + GQA (LlamaForCausalLM)",
    "gemma3": "sandwich RMSNorms + gated GeLU + QK-norm + sliding windows (Gemma3ForCausalLM)",
}


class UnsupportedArchitectureError(ValueError):
    """The model's blocks are not one of the supported families."""


def supported_families_text() -> str:
    return "; ".join(f"{k}: {v}" for k, v in SUPPORTED_FAMILIES.items())


@dataclass(frozen=True)
class BlockFamily:
    """Layout facts of a supported decoder block, and the hook names icl_lens uses.

    Hook names are templates with a ``{layer}`` field; the defaults are TransformerBridge's.
    """

    name: str
    gated: bool
    post_attention_norm: bool = False
    post_mlp_norm: bool = False
    mlp_input_hook: str = "blocks.{layer}.ln2.hook_out"
    dense_in_hook: str = "blocks.{layer}.mlp.in.hook_out"
    dense_gate_hook: str = "blocks.{layer}.mlp.gate.hook_out"
    mlp_out_hook: str = "blocks.{layer}.mlp.hook_out"
    dense_out_in_hook: str = "blocks.{layer}.mlp.out.hook_in"
    dense_out_out_hook: str = "blocks.{layer}.mlp.out.hook_out"

    @staticmethod
    def resid_pre(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_pre"

    @staticmethod
    def resid_mid(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_mid"

    @staticmethod
    def resid_post(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_post"

    @staticmethod
    def values(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_v"

    @staticmethod
    def scores(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_attn_scores"

    def mlp_input(self, layer: int) -> str:
        """The MLP's input (after the pre-MLP norm): ``A`` in the contextual pass."""
        return self.mlp_input_hook.format(layer=layer)

    def dense_in_out(self, layer: int) -> str:
        """Output of ``W_in`` (``W_up`` for gated MLPs)."""
        return self.dense_in_hook.format(layer=layer)

    def dense_gate_out(self, layer: int) -> str:
        return self.dense_gate_hook.format(layer=layer)

    def dense_out_input(self, layer: int) -> str:
        """Input of the down projection ``W_out`` (the MLP's hidden activation)."""
        return self.dense_out_in_hook.format(layer=layer)

    def dense_out_output(self, layer: int) -> str:
        """Output of the down projection ``W_out`` (before any post-FFN norm)."""
        return self.dense_out_out_hook.format(layer=layer)

    def mlp_branch_out(self, layer: int) -> str:
        """Where the skip correction is added: after the post-FFN norm if the block has one."""
        return f"blocks.{layer}.ln2_post.hook_out" if self.post_mlp_norm else self.mlp_out_hook.format(layer=layer)

    @staticmethod
    def post_norm_input(layer: int) -> str:
        """Input of the post-FFN norm (the raw MLP output), for gain edits."""
        return f"blocks.{layer}.ln2_post.hook_in"


def block_family(model) -> BlockFamily:
    """The family of ``model`` (a TransformerBridge), or a clear error listing what is supported."""
    own = getattr(model, "icl_lens_family", None)
    if isinstance(own, BlockFamily):
        return own
    arch = getattr(model.cfg, "architecture", None) or type(getattr(model, "original_model", model)).__name__
    name = FAMILY_OF_ARCHITECTURE.get(arch)
    if name is None:
        raise UnsupportedArchitectureError(
            f"icl_lens cannot patch architecture {arch!r} exactly. Supported block families: "
            f"{supported_families_text()}."
        )
    block = model.blocks[0]
    return BlockFamily(
        name=name,
        gated="gate" in block.mlp._modules,
        post_attention_norm="ln1_post" in block._modules,
        post_mlp_norm="ln2_post" in block._modules,
    )


def dense_weight(module: nn.Module) -> torch.Tensor:
    """The ``[d_out, d_in]`` weight of a dense layer (``nn.Linear`` or GPT-2's ``Conv1D``), no copy."""
    inner = getattr(module, "original_component", module)
    if isinstance(inner, nn.Linear):
        return inner.weight
    if type(inner).__name__ == "Conv1D":  # transformers.pytorch_utils.Conv1D stores [d_in, d_out]
        return inner.weight.T
    raise UnsupportedArchitectureError(f"unexpected dense layer type {type(inner).__name__}")


def first_dense_modules(model, layer: int) -> dict[str, nn.Module]:
    """The MLP's first dense layers of ``layer``: ``{"in": W_in}`` plus ``{"gate": W_gate}`` if gated."""
    mlp = model.blocks[layer].mlp
    modules = {"in": mlp.__getattr__("in")}
    if block_family(model).gated:
        modules["gate"] = mlp.gate
    return modules


def first_dense_weights(model, layer: int) -> dict[str, torch.Tensor]:
    """``[d_mlp, d_model]`` weights of :func:`first_dense_modules` (views, no copy)."""
    return {name: dense_weight(module) for name, module in first_dense_modules(model, layer).items()}


def down_weight(model, layer: int) -> torch.Tensor:
    """``[d_model, d_mlp]`` weight of the MLP's down projection ``W_out`` of ``layer`` (a view, no copy)."""
    return dense_weight(model.blocks[layer].mlp.out)


def original(module: nn.Module) -> nn.Module:
    """The HF module a bridge component wraps (calling it fires no TransformerLens hooks)."""
    return getattr(module, "original_component", None) or module


def post_norm_eps(model, layer: int) -> float:
    """``eps`` of layer ``layer``'s post-FFN RMSNorm (Gemma 3)."""
    norm = original(model.blocks[layer].ln2_post)
    return float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6)))
