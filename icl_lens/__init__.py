"""icl_lens: see in-context learning as weight updates.

A transformer reading a prompt behaves exactly as if the first dense weights of each
MLP had received a rank-1 update per token, the *token patch* (Dherin et al. 2025,
arXiv 2507.16003). icl_lens computes those patches exactly for every layer and token
of real models, from one forward pass, and builds dynamics, thought patches and
dashboards on them. Definitions: docs/design.md; usage: README.md.

The names below are imported on first use (:mod:`icl_lens.lazy_exports`): ``import icl_lens``
alone imports neither torch nor TransformerLens, so the command line starts fast.
"""
from icl_lens.lazy_exports import lazy_exports

_EXPORTS = {  # public name -> the module that defines it
    "TokenPatches": "icl_lens.core.patch_set",
    "SpikeFlags": "icl_lens.core.spike_scores",
    "spike_scores": "icl_lens.core.spike_scores",
    "spike_scores_from_norms": "icl_lens.core.spike_scores",
    "UnsupportedArchitectureError": "icl_lens.model.block_family",
    "patch_norms": "icl_lens.model.batches",
    "NonFiniteActivationError": "icl_lens.model.capture",
    "ZeroNormWarning": "icl_lens.model.capture",
    "token_patches": "icl_lens.model.capture",
    "GenerationPatches": "icl_lens.model.generation",
    "generate_with_patches": "icl_lens.model.generation",
    "PatchSession": "icl_lens.model.incremental",
    "UpdateStats": "icl_lens.model.incremental",
    "DEFAULT_MODEL": "icl_lens.model.names",
    "EMBEDDED_MODELS": "icl_lens.model.names",
    "ModelNotFoundError": "icl_lens.model.loading",
    "known_model_names": "icl_lens.model.names",
    "load_model": "icl_lens.model.loading",
    "EquivalenceReport": "icl_lens.model.kept_only",
    "patches_applied": "icl_lens.model.kept_only",
    "verify_equivalence": "icl_lens.model.kept_only",
    "PromptError": "icl_lens.model.prompts",
    "DEFAULT_SPIKE_THRESHOLD": "icl_lens.model.spike_thresholds",
    "SpikeThreshold": "icl_lens.model.spike_thresholds",
    "spike_threshold": "icl_lens.model.spike_thresholds",
    "AlignmentTable": "icl_lens.core.finetune_alignment",
    "FinetuneAlignment": "icl_lens.core.finetune_alignment",
    "trajectory_sgd_cosines": "icl_lens.core.finetune_alignment",
    "DecayFit": "icl_lens.core.trajectory",
    "Trajectory": "icl_lens.core.trajectory",
    "context_alignment": "icl_lens.model.context_alignment",
    "ContextEffect": "icl_lens.model.context_effect",
    "context_effect": "icl_lens.model.context_effect",
    "ContextTokenSteps": "icl_lens.model.explicit_finetune",
    "context_token_steps": "icl_lens.model.explicit_finetune",
    "finetune_alignment": "icl_lens.model.explicit_finetune",
    "NoContextError": "icl_lens.model.trajectory_capture",
    "QueryPositionError": "icl_lens.model.trajectory_capture",
    "TrajectoryCheck": "icl_lens.model.trajectory_capture",
    "trajectory": "icl_lens.model.trajectory_capture",
    "verify_trajectory": "icl_lens.model.trajectory_capture",
    "Task": "icl_lens.thought",
    "TaskFormatError": "icl_lens.thought",
    "ThoughtEval": "icl_lens.thought",
    "ThoughtPatch": "icl_lens.thought",
    "VectorNotExportableError": "icl_lens.thought",
    "evaluate_thought": "icl_lens.thought",
    "load_task": "icl_lens.thought",
    "thought_patch": "icl_lens.thought",
}
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS, submodules=("lab",))

__version__ = "0.1.0"


def dashboard(model=None, **kwargs):
    """The live JupyterLab dashboard (imports ipywidgets/plotly only when called); see ``icl_lens.ui``."""
    from icl_lens.ui.dashboard import dashboard as _dashboard

    return _dashboard(model, **kwargs)


__all__ = [
    "AlignmentTable",
    "ContextEffect",
    "ContextTokenSteps",
    "DEFAULT_MODEL",
    "DEFAULT_SPIKE_THRESHOLD",
    "DecayFit",
    "EMBEDDED_MODELS",
    "EquivalenceReport",
    "GenerationPatches",
    "FinetuneAlignment",
    "ModelNotFoundError",
    "NoContextError",
    "NonFiniteActivationError",
    "PatchSession",
    "PromptError",
    "QueryPositionError",
    "SpikeFlags",
    "SpikeThreshold",
    "Task",
    "TaskFormatError",
    "ThoughtEval",
    "ThoughtPatch",
    "TokenPatches",
    "Trajectory",
    "TrajectoryCheck",
    "UnsupportedArchitectureError",
    "UpdateStats",
    "VectorNotExportableError",
    "ZeroNormWarning",
    "context_alignment",
    "context_effect",
    "context_token_steps",
    "dashboard",
    "generate_with_patches",
    "finetune_alignment",
    "evaluate_thought",
    "known_model_names",
    "lab",
    "load_model",
    "load_task",
    "patch_norms",
    "patches_applied",
    "spike_scores",
    "spike_scores_from_norms",
    "spike_threshold",
    "thought_patch",
    "token_patches",
    "trajectory",
    "trajectory_sgd_cosines",
    "verify_equivalence",
    "verify_trajectory",
]
