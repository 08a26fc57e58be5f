"""Thought patches: a prompt turned into a permanent weight edit (Mazzawi, Dherin et al. 2025, arXiv 2510.08734).

Everything about the feature lives here: :mod:`~icl_lens.thought.fit` (Algorithm 1,
layer by layer), :mod:`~icl_lens.thought.result` (the :class:`ThoughtPatch`, applied as
weight edits through hooks), :mod:`~icl_lens.thought.hf_export` (a plain Hugging Face
directory with the edited weights), :mod:`~icl_lens.thought.evaluate` (accuracy on a
task), :mod:`~icl_lens.thought.steering` (the steering-vector baseline),
:mod:`~icl_lens.thought.distill` (the context-distillation baseline),
:mod:`~icl_lens.thought.preserve` (the model's own samples, whose keys the fit preserves),
:mod:`~icl_lens.thought.locality` (what an edit changes outside its task),
:mod:`~icl_lens.thought.divergence` (next-token KL to the full instruction),
:mod:`~icl_lens.thought.diagnose` (where a patched forward departs from it, layer by
layer), :mod:`~icl_lens.thought.instruction_batches` (instruction + query token batches) and
:mod:`~icl_lens.thought.tasks` (the shipped task files and their builder). The least-squares fit itself is
the math core's :mod:`icl_lens.core.least_squares`.
"""
from typing import TYPE_CHECKING

from icl_lens.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.thought.distill import distill_patch
    from icl_lens.thought.evaluate import ThoughtEval, evaluate_thought
    from icl_lens.thought.hf_export import VectorNotExportableError
    from icl_lens.thought.fit import thought_patch, thought_patch_joint
    from icl_lens.thought.result import ThoughtPatch
    from icl_lens.thought.steering import SteeringVector, steering_vector
    from icl_lens.thought.tasks import Task, TaskFormatError, load_task

__getattr__, __dir__, __all__ = lazy_exports(globals())

