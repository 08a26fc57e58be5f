"""Which transformer blocks icl_lens can patch exactly: one table, one entry per block family.

A *block family* is the layout of one decoder block as TransformerBridge exposes it
(docs/design.md §2). Its entry in :data:`FAMILIES` holds everything that differs between
families, and nothing about a family is decided anywhere else:

- the flags that say how the MLP input is formed: a norm in front of the MLP
  (``A = N(r + attn)``), none (OLMo-2: ``A = r + attn``, the raw residual), or a
  *parallel* block (GPT-NeoX/Pythia: attention and MLP both read ``N(r)``, so ``A = a``,
  the patch is zero and the whole context effect is the correction);
- norms after attention / after the MLP (the correction is measured after the first and
  added after the second), gated and fused ``gate_up`` MLPs (one patch
  ``u = W_gate_up δ``, stored as its gate and up halves), sliding windows on every layer;
- the hook points icl_lens reads and edits (templates with a ``{layer}`` field);
- where a thought vector goes (a bias after the MLP branch, or the gain of a post-FFN
  norm) and how ``save_pretrained`` writes it into the Hugging Face class;
- for a multimodal checkpoint, how to boot its text tower alone.

A model that is not a bridge (the regression lab's models) names its own hook points by
carrying a ``BlockFamily`` in its ``icl_lens_family`` attribute. An architecture missing
from the table fails fast with the list of supported families.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from enum import Enum

import torch
from jaxtyping import Float
from torch import Tensor, nn

from icl_lens.model._model_check import check_model


class UnsupportedArchitectureError(ValueError):
    """The model's blocks are not one of the supported families."""


class VectorSite(str, Enum):
    """Where a thought vector enters a block, and the :class:`~icl_lens.model.MLPEdit` field that carries it.

    ``BIAS``: added to the MLP branch output (``MLPEdit.bias``). ``GAIN``: a gain on the post-FFN
    RMSNorm, ``(1 + w + g) ⊙ ŷ`` with ``ŷ`` its normalised input (``MLPEdit.gain``; Gemma 2/3, OLMo-2),
    fitted against ``ŷ`` rather than as a constant. Compares equal to its value (``"bias"``, ``"gain"``).
    """

    BIAS = "bias"
    GAIN = "gain"

    def __str__(self) -> str:
        return self.value

    def edit(self, vector: Tensor | None) -> dict[str, Tensor]:
        """The :class:`~icl_lens.model.MLPEdit` keyword that puts ``vector`` at this site (none for ``None``)."""
        return {} if vector is None else {self.value: vector}


@dataclass(frozen=True)
class TextTower:
    """Where a multimodal checkpoint keeps its language model, and the causal-LM class that runs it alone.

    icl_lens boots TransformerBridge on that class (sharing the weights, no copy): only
    the text tower has token patches, and booting TransformerBridge on the multimodal
    class makes it fetch an image processor (and try to pip-install torchvision).
    """

    causal_lm: str                      # transformers class name, e.g. "Gemma3ForCausalLM"
    config: str = "text_config"         # attribute of the multimodal config holding the text config
    model: str = "model.language_model"  # the text model's module path
    lm_head: str = "lm_head"


@dataclass(frozen=True)
class BlockFamily:
    """Layout facts of a supported decoder block, and the hook names icl_lens uses.

    Hook names are templates with a ``{layer}`` field; the defaults are TransformerBridge's.
    ``vector_export`` says how an exported thought patch stores its vector:
    ``"mlp_out_bias"`` (the MLP's output layer has a bias), ``"mlp_bias_config"`` (the
    config's ``mlp_bias`` switch adds one), ``"post_norm_gain"`` (the post-FFN norm's
    weight), or ``None`` (the Hugging Face class has no parameter that adds a constant
    after the MLP branch: only the matrix part exports).
    """

    name: str
    summary: str = ""
    architectures: tuple[str, ...] = ()
    example: str = ""
    gated: bool = False
    fused_gate_up: str | None = None    # HF attribute of a fused [W_gate; W_up] matrix
    parallel: bool = False              # attention and MLP both read N(r): A = a
    pre_mlp_norm: bool = True           # False: the MLP reads the raw residual r + attn
    post_attention_norm: bool = False
    post_mlp_norm: bool = False
    sliding_every_layer: bool = False   # config.sliding_window applies to every layer
    vector_export: str | None = None
    text_towers: tuple[tuple[str, TextTower], ...] = ()
    mlp_input_hook: str = "blocks.{layer}.ln2.hook_out"
    dense_in_hook: str = "blocks.{layer}.mlp.in.hook_out"
    dense_gate_hook: str = "blocks.{layer}.mlp.gate.hook_out"
    # The inputs of W_in and W_gate (read by nothing else); None: a block whose first dense layer's input is not
    # hooked apart from other readers (its input maps take the factored form, MLPEdit(v=M, u_in=W_inᵀ)).
    dense_in_input_hook: str | None = "blocks.{layer}.mlp.in.hook_in"
    dense_gate_input_hook: str | None = "blocks.{layer}.mlp.gate.hook_in"
    mlp_out_hook: str = "blocks.{layer}.mlp.hook_out"
    dense_out_in_hook: str = "blocks.{layer}.mlp.out.hook_in"
    dense_out_out_hook: str = "blocks.{layer}.mlp.out.hook_out"
    attn_out_hook: str = "blocks.{layer}.hook_attn_out"

    @staticmethod
    def resid_pre(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_pre"

    @staticmethod
    def resid_post(layer: int) -> str:
        return f"blocks.{layer}.hook_resid_post"

    @staticmethod
    def values(layer: int) -> str:
        return f"blocks.{layer}.attn.hook_v"

    @staticmethod
    def scores(layer: int) -> str:
        """Pre-softmax scores, after any soft-capping (Gemma 2): what the softmax sees."""
        return f"blocks.{layer}.attn.hook_attn_scores"

    @staticmethod
    def pattern(layer: int) -> str:
        """Attention weights (after the softmax): the contextual ``α`` of every query and key."""
        return f"blocks.{layer}.attn.hook_pattern"

    @staticmethod
    def attention_projection_out(layer: int) -> str:
        """The output projection's output ``W_O z + b_O``, before any post-attention norm (``raw_C``)."""
        return f"blocks.{layer}.attn.o.hook_out"

    def attn_out(self, layer: int) -> str:
        """What the attention branch adds to the residual (after a post-attention norm): ``attn_C``."""
        return self.attn_out_hook.format(layer=layer)

    def mlp_input(self, layer: int) -> str:
        """The MLP's actual input: ``A`` in the contextual pass."""
        return self.mlp_input_hook.format(layer=layer)

    def dense_in_out(self, layer: int) -> str:
        """Output of ``W_in`` (``W_up`` for gated MLPs)."""
        return self.dense_in_hook.format(layer=layer)

    def dense_gate_out(self, layer: int) -> str:
        return self.dense_gate_hook.format(layer=layer)

    def dense_inputs(self, layer: int) -> list[str] | None:
        """The inputs of ``W_in`` and (gated MLPs) ``W_gate``, where each is hooked on its own; else None."""
        if self.dense_in_input_hook is None or (self.gated and self.dense_gate_input_hook is None):
            return None
        return [h.format(layer=layer) for h in (self.dense_in_input_hook,
                                                *((self.dense_gate_input_hook,) if self.gated else ()))]

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

    @property
    def vector_site(self) -> VectorSite:
        """Where a thought vector goes: the gain of the post-FFN norm if there is one, else the branch bias."""
        return VectorSite.GAIN if self.post_mlp_norm else VectorSite.BIAS

    def kept_attention_output(self, block, z0: Float[Tensor, "pos head d_head"]) -> Float[Tensor, "pos d_model"]:
        """``attn_0``: the kept-key attention ``z0`` through the output projection and any post-attention norm."""
        return self.attention_post_norm(block, block.attn.o(z0.reshape(1, z0.shape[0], -1)))[0]

    def attention_post_norm(self, block, raw: Float[Tensor, "*batch pos d_model"]) -> Float[Tensor, "*batch pos d_model"]:
        """What the attention branch adds for the projection output ``raw``: its post-attention norm, or ``raw``."""
        return block.ln1_post(raw) if self.post_attention_norm else raw

    def context_free_mlp_input(self, block, r: Float[Tensor, "pos d_model"], attn_0: Float[Tensor, "pos d_model"],
                               A: Float[Tensor, "pos d_model"]) -> Float[Tensor, "pos d_model"]:
        """``a``: the MLP input when the query sees only its kept keys (docs/design.md §2).

        Goes through the bridge's own norm so it is rounded exactly as the kept-only
        forward will round it. A parallel block's MLP reads ``N(r)``, unchanged: ``a = A``.
        """
        if self.parallel:
            return A
        mid = r + attn_0
        return block.ln2(mid[None])[0] if self.pre_mlp_norm else mid

    def sliding_layout(self, model) -> tuple[list[str] | None, int] | None:
        """``(layer kinds, window)`` when some layer attends through a sliding window, else None.

        Layer kinds are the HF config's ``layer_types`` (the model takes one mask per
        kind); ``None`` kinds mean every layer slides (the model takes one mask).
        """
        hf_cfg = model.original_model.config
        window = getattr(hf_cfg, "sliding_window", None)
        if window is None:
            return None
        if self.sliding_every_layer:
            return None, int(window)
        kinds = list(getattr(hf_cfg, "layer_types", None) or [])
        return (kinds, int(window)) if "sliding_attention" in kinds else None


_SANDWICH = dict(gated=True, post_attention_norm=True, post_mlp_norm=True, vector_export="post_norm_gain")

FAMILIES: tuple[BlockFamily, ...] = (
    BlockFamily("gpt2", "LayerNorm, biases, absolute positions, plain GELU MLP",
                ("GPT2LMHeadModel",), "openai-community/gpt2", vector_export="mlp_out_bias"),
    BlockFamily("gpt_neox", "parallel attention and MLP (each reads its own LayerNorm of r), partial RoPE, plain MLP",
                ("GPTNeoXForCausalLM",), "EleutherAI/pythia-160m", parallel=True, vector_export="mlp_out_bias"),
    BlockFamily("llama", "RMSNorm, gated SiLU MLP, RoPE, grouped-query attention",
                ("LlamaForCausalLM",), "HuggingFaceTB/SmolLM2-135M", vector_export="mlp_bias_config",
                gated=True),
    BlockFamily("mistral", "the Llama block with a sliding window on every layer",
                ("MistralForCausalLM",), "mistralai/Mistral-7B-v0.1", sliding_every_layer=True, gated=True),
    BlockFamily("qwen2", "the Llama block with q/k/v biases (sliding layers where the config asks)",
                ("Qwen2ForCausalLM",), "Qwen/Qwen2.5-0.5B", gated=True),
    BlockFamily("qwen3", "the Llama block with per-head RMSNorm of queries and keys (QK-norm)",
                ("Qwen3ForCausalLM",), "Qwen/Qwen3-0.6B", gated=True),
    BlockFamily("phi3", "the Llama block with fused qkv and fused gate_up matrices",
                ("Phi3ForCausalLM",), "microsoft/Phi-3-mini-4k-instruct", fused_gate_up="gate_up_proj",
                sliding_every_layer=True, gated=True),
    BlockFamily("olmo2", "RMSNorms after attention and after the MLP only (the MLP reads the raw residual), QK-norm",
                ("Olmo2ForCausalLM",), "allenai/OLMo-2-0425-1B", pre_mlp_norm=False,
                mlp_input_hook="blocks.{layer}.mlp.hook_in", **_SANDWICH),
    BlockFamily("gemma2", "sandwich RMSNorms, gated GeLU, attention and final-logit soft-capping, alternating sliding layers",
                ("Gemma2ForCausalLM",), "google/gemma-2-2b", **_SANDWICH),
    BlockFamily("gemma3", "sandwich RMSNorms, gated GeLU, QK-norm, sliding layers; for 4B-27B the text tower",
                ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"), "google/gemma-3-270m, google/gemma-3-4b-pt",
                text_towers=(("Gemma3ForConditionalGeneration", TextTower("Gemma3ForCausalLM")),), **_SANDWICH),
)
FAMILY_OF_ARCHITECTURE: dict[str, BlockFamily] = {arch: f for f in FAMILIES for arch in f.architectures}


def supported_families_text() -> str:
    return "; ".join(f"{f.name} ({', '.join(f.architectures)}): {f.summary}" for f in FAMILIES)


def family_of_architectures(archs, what: str) -> BlockFamily:
    """The family of the first known architecture in ``archs``, or a clear error listing what is supported."""
    for arch in archs:
        if arch in FAMILY_OF_ARCHITECTURE:
            return FAMILY_OF_ARCHITECTURE[arch]
    raise UnsupportedArchitectureError(
        f"icl_lens cannot patch {what} exactly (architecture {list(archs) or 'unknown'}; encoder-only, "
        f"mixture-of-experts and recurrent models are not supported). Supported block families: "
        f"{supported_families_text()}."
    )


def _layout_error(family: BlockFamily, arch: str, why: str) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"{arch} booted with a block layout icl_lens does not know for family {family.name!r}: {why}. "
        f"Supported block families: {supported_families_text()}."
    )


def _checked_layout(family: BlockFamily, model, arch: str) -> BlockFamily:
    """``family`` after checking the bridge's block against it (a config can switch a layout off)."""
    block = model.blocks[0]
    parallel = "hook_resid_mid" not in getattr(block, "hook_aliases", {"hook_resid_mid": None})
    if parallel != family.parallel:
        raise _layout_error(family, arch, f"parallel attention and MLP is {parallel}, expected {family.parallel}")
    expected = {"ln1_post": family.post_attention_norm, "ln2_post": family.post_mlp_norm, "ln2": family.pre_mlp_norm}
    for part, wanted in expected.items():
        if (part in block._modules) != wanted:
            raise _layout_error(family, arch, f"{part} is {'present' if not wanted else 'missing'}")
    if ("gate" in block.mlp._modules) != family.gated:
        raise _layout_error(family, arch, "the MLP's gating differs")
    return family


def block_family(model) -> BlockFamily:
    """The family of ``model`` (a TransformerBridge), or a clear error listing what is supported."""
    own = getattr(model, "icl_lens_family", None)
    if isinstance(own, BlockFamily):
        return own
    check_model(model)
    arch = getattr(model.cfg, "architecture", None) or type(getattr(model, "original_model", model)).__name__
    return _checked_layout(family_of_architectures([arch], f"architecture {arch!r}"), model, arch)


def text_tower(hf_model: nn.Module) -> nn.Module:
    """The causal LM to boot for ``hf_model``: itself, or the text tower of a multimodal model (weights shared)."""
    import transformers

    arch = type(hf_model).__name__
    family = FAMILY_OF_ARCHITECTURE.get(arch)
    towers = dict(family.text_towers) if family is not None else {}
    if arch not in towers:
        return hf_model
    tower = towers[arch]
    config = copy.deepcopy(getattr(hf_model.config, tower.config))
    config.architectures = [tower.causal_lm]
    config._attn_implementation = "eager"
    with torch.device("meta"):
        lm = getattr(transformers, tower.causal_lm)(config)
    lm.model = hf_model.get_submodule(tower.model)
    lm.lm_head = hf_model.get_submodule(tower.lm_head)
    lm.model.config = lm.config
    return lm.eval()


def dense_weight(module: nn.Module) -> torch.Tensor:
    """The ``[d_out, d_in]`` weight of a dense layer (``nn.Linear`` or GPT-2's ``Conv1D``), no copy."""
    inner = getattr(module, "original_component", module)
    if isinstance(inner, nn.Linear):
        return inner.weight
    if type(inner).__name__ == "Conv1D":  # transformers.pytorch_utils.Conv1D stores [d_in, d_out]
        return inner.weight.T
    raise UnsupportedArchitectureError(f"unexpected dense layer type {type(inner).__name__}")


def first_dense_modules(model, layer: int) -> dict[str, nn.Module]:
    """The MLP's first dense layers of ``layer``: ``{"in": W_in}`` plus ``{"gate": W_gate}`` if gated.

    For a fused ``gate_up`` matrix these are TransformerBridge's split views of it.
    """
    mlp = model.blocks[layer].mlp
    modules = {"in": mlp.__getattr__("in")}
    if block_family(model).gated:
        modules["gate"] = mlp.gate
    return modules


def stored_dense_modules(model, layer: int) -> list[nn.Module]:
    """The HF modules that store the first dense weights (one fused ``gate_up`` module where the MLP has one)."""
    family = block_family(model)
    if family.fused_gate_up:
        return [getattr(original(model.blocks[layer].mlp), family.fused_gate_up)]
    return [original(m) for m in first_dense_modules(model, layer).values()]


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
    """``eps`` of layer ``layer``'s post-FFN RMSNorm (Gemma 2/3, OLMo-2)."""
    norm = original(model.blocks[layer].ln2_post)
    return float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6)))
