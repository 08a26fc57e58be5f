"""Model side of icl_lens: the TransformerLens adapter every concept reads and edits models through.

Loading (:func:`load_model`: embedded GGUF models, tiny random models, Hugging Face ids, your
own model), the block families (:func:`block_family`, docs/design.md §2), prompts and
tokenizers (:func:`encode_prompt`), the ``Model`` type, **the read door**
(:func:`activations_captured`: every hook that reads activations, every early-stopped forward)
and **the write door** (:func:`edits_applied`: every weight edit, as factored :class:`MLPEdit`\\ s).
Hooks live only inside those two context managers, which remove them (also after an error).
"""
from typing import TYPE_CHECKING

from icl_lens._lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.model._allocator import GLIBC_DEFAULT_PAD, keep_freed_memory, set_top_pad
    from icl_lens.model._attention import attention_pattern
    from icl_lens.model._block_family import (BlockFamily, UnsupportedArchitectureError, VectorSite, block_family,
                                              first_dense_weights)
    from icl_lens.model._byte_tokenizer import BOS_ID, EOS_ID, PAD_ID, save_byte_tokenizer
    from icl_lens.model._greedy import greedy_continuations, last_logits, tail_logits
    from icl_lens.model._loading import (ModelNotFoundError, TokenizerMismatchError, bridge_from_hf, cache_dir,
                                         check_device, load_model, prepare_embedded)
    from icl_lens.model._model_check import NotABridgeError, ProcessedWeightsError, ProcessedWeightsWarning
    from icl_lens.model._names import DEFAULT_MODEL, EMBEDDED_MODELS, known_model_names
    from icl_lens.model._prompts import PromptError, encode_prompt, pad_id, right_padded, str_tokens
    from icl_lens.model._reading import NonFiniteActivationError, activations_captured
    from icl_lens.model._residual_stream import recording_residual
    from icl_lens.model._types import Model, patch_dtype
    from icl_lens.model._weight_edits import MLPEdit, edits_applied

__getattr__, __dir__, __all__ = lazy_exports(globals())
