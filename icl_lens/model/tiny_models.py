"""Seeded random tiny models, one per supported block family (docs/design.md §5).

- ``tiny-gpt2``: LayerNorm, biases everywhere, learned absolute positions, GELU MLP.
- ``tiny-llama``: RMSNorm, gated SiLU MLP, RoPE, grouped-query attention.
- ``tiny-gemma3``: sandwich RMSNorms, gated GeLU MLP, QK-norm, alternating
  sliding-window (window 6) and global layers, so prompts longer than the window test
  the sliding mask.

Weights are drawn with a larger init scale than HF's default (0.02) so that attention is
far from uniform and the patches are not trivially small.
"""
from __future__ import annotations

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
)

from icl_lens.model.byte_tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

TINY_SEED = 0
TINY_CONTEXT = 256
INIT_STD = 0.2
SLIDING_WINDOW = 6


def _config(name: str):
    common = dict(vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                  initializer_range=INIT_STD)
    if name == "tiny-gpt2":
        return GPT2LMHeadModel, GPT2Config(n_positions=TINY_CONTEXT, n_embd=64, n_layer=3, n_head=4, **common)
    if name == "tiny-llama":
        return LlamaForCausalLM, LlamaConfig(
            hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=TINY_CONTEXT, tie_word_embeddings=False, **common)
    if name == "tiny-gemma3":
        cfg = Gemma3TextConfig(
            hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=SLIDING_WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            max_position_embeddings=TINY_CONTEXT, **common)
        return Gemma3ForCausalLM, cfg
    raise KeyError(name)


TINY_NAMES = ("tiny-gpt2", "tiny-llama", "tiny-gemma3")


def build_tiny_model(name: str, *, seed: int = TINY_SEED) -> PreTrainedModel:
    """The seeded random HF model ``name`` (one of :data:`TINY_NAMES`), in eval mode, float32."""
    cls, cfg = _config(name)
    cfg.architectures = [cls.__name__]
    cfg._attn_implementation = "eager"
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = cls(cfg)
        if name == "tiny-gemma3":
            # Gemma's norms start at weight 0 (scale 1 + w); random gains exercise them.
            with torch.no_grad():
                for mod_name, p in model.named_parameters():
                    if "norm" in mod_name:
                        p.normal_(0.0, 0.3)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.eval()
