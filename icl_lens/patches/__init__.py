"""Token patches: the rank-1 MLP weight updates a prompt's context makes, exact for every layer and position.

Dherin et al. 2025, arXiv 2507.16003 (docs/design.md §2): :class:`TokenPatches` (factored, with
the model's :class:`DenseWeights` for the output factors on demand), :func:`token_patches` (one
contextual forward; a list of prompts is batched), its reference method
:func:`token_patches_naive` and :func:`verify_equivalence`, :func:`patch_norms` (norms of many
prompts, no factors), :class:`PatchSession` (a growing prompt), :func:`patches_applied` (the
kept-only forward), :func:`context_effect` (where the context effect lives),
:func:`estimate_patches_memory` / :func:`available_memory` (what a prompt needs, what the process may use) and who
wrote a patch (docs/design.md §7): :func:`patch_attribution` (the exact split of a patch over heads and context
tokens, :class:`PatchAttribution`), :func:`patch_writes` (what it writes through the unembedding,
:class:`PatchWrites`) and :func:`patch_authors` (every query's top shares, the sweep's column).
"""
from typing import TYPE_CHECKING

from icl_lens._lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.patches._attribution import (PatchAttribution, PatchWrites, patch_attribution, patch_authors,
                                               patch_writes)
    from icl_lens.patches._batches import QUERY_CHUNK, PromptBatch, length_batches, patch_norms, prompt_batch
    from icl_lens.patches._capture import ZeroNormWarning, dense_weights
    from icl_lens.patches._context_effect import ContextEffect, context_effect
    from icl_lens.patches._dense_weights import DenseWeights, NonFiniteWeightsError, StaleWeightsError
    from icl_lens.patches._incremental import PatchSession, UpdateStats
    from icl_lens.patches._kept_only import patches_applied
    from icl_lens.patches._memory import (MemoryEstimate, available_memory, cgroup_memory_available,
                                          estimate_patches_memory, memory_limits)
    from icl_lens.patches._patch_set import (NORM_COLUMNS, NotHeldError, PatchFileError, TokenPatch, TokenPatches,
                                             norm_frame)
    from icl_lens.patches._token_patches import (EquivalenceReport, noise_floor, token_patches, token_patches_naive,
                                                 verify_equivalence)

__getattr__, __dir__, __all__ = lazy_exports(globals())
