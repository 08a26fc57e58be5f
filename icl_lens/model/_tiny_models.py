"""Seeded random tiny models, one per supported block family (docs/design.md §5).

Each is built from its own transformers config (byte tokenizer, 2–4 layers, width 32–64):

- ``tiny-gpt2``: LayerNorm, biases everywhere, learned absolute positions, GELU MLP;
- ``tiny-gpt-neox``: parallel attention and MLP, partial rotary (Pythia);
- ``tiny-llama``: RMSNorm, gated SiLU MLP, RoPE, grouped-query attention;
- ``tiny-mistral``: the Llama block with a sliding window on every layer;
- ``tiny-qwen2``: q/k/v biases, one sliding layer and one global layer;
- ``tiny-qwen3``: QK-norm;
- ``tiny-phi3``: fused qkv and gate_up matrices, sliding window on every layer;
- ``tiny-olmo2``: norms after attention and after the MLP only, QK-norm;
- ``tiny-gemma2``: sandwich norms, attention and final-logit soft-capping, alternating
  sliding and global layers;
- ``tiny-gemma3``: sandwich norms, QK-norm, alternating sliding and global layers;
- ``tiny-gemma3-vision``: a ``Gemma3ForConditionalGeneration`` (tiny SigLIP tower), of
  which icl_lens boots the text tower, as it does for Gemma 3 4B–27B.

Sliding windows are 6 tokens, so prompts longer than that test the window masks.
Weights are drawn with a larger init scale than HF's default (0.02) so that attention is
far from uniform and the patches are not trivially small; norm gains are random too
(around 0 for Gemma's ``1 + w`` norms, around 1 elsewhere), so every norm's gain matters.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import transformers
from transformers import PreTrainedModel

from icl_lens.model._byte_tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE
from icl_lens.model._names import TINY_NAMES

TINY_SEED = 0
TINY_CONTEXT = 256
INIT_STD = 0.2
NORM_STD = 0.3
SLIDING_WINDOW = 6

_COMMON = dict(vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
               initializer_range=INIT_STD)
_ROPE = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=TINY_CONTEXT)
_ALTERNATING = ["sliding_attention", "full_attention"]


def _gemma3_text(layers: int = 4):
    return transformers.Gemma3TextConfig(
        hidden_size=64, intermediate_size=160, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, query_pre_attn_scalar=16, sliding_window=SLIDING_WINDOW, layer_types=_ALTERNATING * (layers // 2),
        max_position_embeddings=TINY_CONTEXT, **_COMMON)


def _gemma3_vision():
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    # Image special tokens sit at the top of the byte vocabulary, which text never produces.
    return transformers.Gemma3Config(text_config=_gemma3_text(layers=2).to_dict(), vision_config=vision.to_dict(),
                                     mm_tokens_per_image=4, boi_token_index=VOCAB_SIZE - 3,
                                     eoi_token_index=VOCAB_SIZE - 2, image_token_index=VOCAB_SIZE - 1,
                                     initializer_range=INIT_STD)


# name -> (HF class, config factory, norm gains centred at 0 (Gemma's 1 + w) or 1)
_TINY: dict[str, tuple[str, Callable[[], object], float | None]] = {
    "tiny-gpt2": ("GPT2LMHeadModel", lambda: transformers.GPT2Config(
        n_positions=TINY_CONTEXT, n_embd=64, n_layer=3, n_head=4, **_COMMON), None),
    "tiny-gpt-neox": ("GPTNeoXForCausalLM", lambda: transformers.GPTNeoXConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, rotary_pct=0.5,
        max_position_embeddings=TINY_CONTEXT, tie_word_embeddings=False, **_COMMON), 1.0),
    "tiny-llama": ("LlamaForCausalLM", lambda: transformers.LlamaConfig(
        hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=TINY_CONTEXT, tie_word_embeddings=False, **_COMMON), None),
    "tiny-mistral": ("MistralForCausalLM", lambda: transformers.MistralConfig(
        num_hidden_layers=2, sliding_window=SLIDING_WINDOW, tie_word_embeddings=False, **_ROPE, **_COMMON), 1.0),
    "tiny-qwen2": ("Qwen2ForCausalLM", lambda: transformers.Qwen2Config(
        num_hidden_layers=2, use_sliding_window=True, sliding_window=SLIDING_WINDOW, max_window_layers=0,
        layer_types=_ALTERNATING, tie_word_embeddings=False, **_ROPE, **_COMMON), 1.0),
    "tiny-qwen3": ("Qwen3ForCausalLM", lambda: transformers.Qwen3Config(
        num_hidden_layers=2, head_dim=16, tie_word_embeddings=False, **_ROPE, **_COMMON), 1.0),
    "tiny-phi3": ("Phi3ForCausalLM", lambda: transformers.Phi3Config(
        num_hidden_layers=2, sliding_window=SLIDING_WINDOW, tie_word_embeddings=False, **_ROPE, **_COMMON), 1.0),
    "tiny-olmo2": ("Olmo2ForCausalLM", lambda: transformers.Olmo2Config(
        num_hidden_layers=2, tie_word_embeddings=False, **_ROPE, **_COMMON), 1.0),
    "tiny-gemma2": ("Gemma2ForCausalLM", lambda: transformers.Gemma2Config(
        num_hidden_layers=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=SLIDING_WINDOW,
        layer_types=_ALTERNATING, attn_logit_softcapping=5.0, final_logit_softcapping=3.0, **_ROPE, **_COMMON), 0.0),
    "tiny-gemma3": ("Gemma3ForCausalLM", _gemma3_text, 0.0),
    "tiny-gemma3-vision": ("Gemma3ForConditionalGeneration", _gemma3_vision, 0.0),
}
if tuple(_TINY) != TINY_NAMES:  # names.py lists them for the torch-free command line
    raise ImportError(f"tiny models {tuple(_TINY)} differ from icl_lens.model._names.TINY_NAMES {TINY_NAMES}")


def build_tiny_model(name: str, *, seed: int = TINY_SEED) -> PreTrainedModel:
    """The seeded random HF model ``name`` (one of :data:`TINY_NAMES`), in eval mode, float32."""
    if name not in _TINY:
        raise KeyError(f"unknown tiny model {name!r}; tiny models: {', '.join(TINY_NAMES)}")
    cls_name, make_config, norm_centre = _TINY[name]
    cfg = make_config()
    cfg.architectures = [cls_name]
    cfg._attn_implementation = "eager"
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = getattr(transformers, cls_name)(cfg)
        if norm_centre is not None:  # random gains exercise every norm (HF starts them at 0 or 1)
            with torch.no_grad():
                for param_name, p in model.named_parameters():
                    if "norm" in param_name and p.ndim == 1:
                        p.normal_(0.0 if param_name.endswith("bias") else norm_centre, NORM_STD)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.eval()
