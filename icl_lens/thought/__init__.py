"""Thought patches: a prompt turned into a permanent weight edit (Mazzawi, Dherin et al. 2025, arXiv 2510.08734).

Files: ``_fit.py`` (Algorithm 1, layer by layer), ``_result.py`` (the :class:`ThoughtPatch`,
applied through the write door), ``_hf_export.py`` (a plain Hugging Face directory with the
edited weights), ``_evaluate.py`` (accuracy on a task), ``_steering.py`` and ``_distill.py``
(the steering-vector and context-distillation baselines), ``_preserve.py`` (the texts whose
keys the fit preserves), ``_locality.py`` (what an edit changes outside its task, on one fixed set or a :class:`LocalitySet`),
``_null_space.py`` (the AlphaEdit-style projection of a fit's key-side updates),
``_divergence.py`` (KL to the full instruction), ``_diagnose.py`` (where a patched forward
departs from it), ``_instruction_batches.py`` (instruction + query token batches), ``_defaults.py``
(the kinds, the :class:`ThoughtFit` settings and the documented defaults) and :mod:`icl_lens.thought.tasks` (the shipped tasks). The
least-squares fit itself is the math core's (:func:`icl_lens.core.factored_least_squares`).
"""
from typing import TYPE_CHECKING

from icl_lens._lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.thought._defaults import (CONDITIONS, DEFAULT_ANSWER_TOKENS, DEFAULT_KIND, DEFAULT_PRESERVE_STRENGTH,
                                            DEFAULT_QUERY_PREFIX, DEFAULT_RIDGE, DISTILL_BATCH, DISTILL_LR,
                                            DISTILL_STEPS, KINDS, PRESERVE_SET, ThoughtFit)
    from icl_lens.thought._diagnose import LayerDiagnosis, diagnose
    from icl_lens.thought._distill import distill_patch
    from icl_lens.thought._divergence import answer_kl, text_kl
    from icl_lens.thought._evaluate import ThoughtEval, evaluate_edit, evaluate_thought
    from icl_lens.thought._fit import thought_patch, thought_patch_joint
    from icl_lens.thought._hf_export import VectorNotExportableError
    from icl_lens.thought._instruction_batches import (QueryBatch, continuation_ids, prefix_ids, query_batch, text_ids,
                                                       with_bos)
    from icl_lens.thought._locality import (LocalityProbe, LocalitySet, LocalitySetProbe, SetLocality, load_locality,
                                            load_locality_set, locality_probe, locality_set_probe)
    from icl_lens.thought._preserve import (FEW_SHOT_FILE, N_SAMPLES, PRESERVE_DIR, SAMPLE_SEED, SAMPLE_TOKENS,
                                            bos_samples, few_shot_texts, preserve_file, preserve_texts)
    from icl_lens.thought._result import ThoughtPatch
    from icl_lens.thought._steering import SteeringVector, steering_vector
    from icl_lens.thought.tasks import SHIPPED_TASKS, Task, TaskFormatError, load_task

__getattr__, __dir__, __all__ = lazy_exports(globals())
