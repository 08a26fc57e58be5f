"""Thought patches: a prompt turned into a permanent weight edit (Mazzawi, Dherin et al. 2025, arXiv 2510.08734).

Everything about the feature lives here: :mod:`~icl_lens.thought.fit` (Algorithm 1,
layer by layer), :mod:`~icl_lens.thought.result` (the :class:`ThoughtPatch`, applied as
weight edits through hooks), :mod:`~icl_lens.thought.export` (a plain Hugging Face
directory with the edited weights), :mod:`~icl_lens.thought.evaluate` (accuracy on a
task), :mod:`~icl_lens.thought.steering` (the steering-vector baseline),
:mod:`~icl_lens.thought.locality` (what an edit changes outside its task),
:mod:`~icl_lens.thought.divergence` (next-token KL to the full instruction),
:mod:`~icl_lens.thought.diagnose` (where a patched forward departs from it, layer by
layer), :mod:`~icl_lens.thought.batches` (instruction + query token batches) and
:mod:`~icl_lens.thought.tasks` (the shipped task files and their builder). The least-squares fit itself is
the math core's :mod:`icl_lens.core.least_squares`.
"""
from icl_lens.lazy_exports import lazy_exports

_EXPORTS = {  # public name -> the module that defines it (imported on first use)
    "ThoughtEval": "icl_lens.thought.evaluate",
    "evaluate_thought": "icl_lens.thought.evaluate",
    "VectorNotExportableError": "icl_lens.thought.export",
    "thought_patch": "icl_lens.thought.fit",
    "ThoughtPatch": "icl_lens.thought.result",
    "SteeringVector": "icl_lens.thought.steering",
    "steering_vector": "icl_lens.thought.steering",
    "Task": "icl_lens.thought.tasks",
    "TaskFormatError": "icl_lens.thought.tasks",
    "load_task": "icl_lens.thought.tasks",
}
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)

__all__ = ["SteeringVector", "Task", "TaskFormatError", "ThoughtEval", "ThoughtPatch", "VectorNotExportableError",
           "evaluate_thought", "load_task", "steering_vector", "thought_patch"]
