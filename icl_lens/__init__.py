"""icl_lens: see in-context learning as weight updates.

A transformer reading a prompt behaves exactly as if the first dense weights of each
MLP had received a rank-1 update per token, the *token patch* (Dherin et al. 2025,
arXiv 2507.16003). icl_lens computes those patches exactly for every layer and token
of real models, from one forward pass, and builds dynamics, thought patches and
dashboards on them. Definitions: docs/design.md; usage: README.md.
"""
from icl_lens.core.dense_weights import DenseWeights, StaleWeightsError
from icl_lens.core.patch_set import TokenPatches
from icl_lens.core.spike_scores import SpikeFlags, spike_scores, spike_scores_from_norms
from icl_lens.model.block_family import UnsupportedArchitectureError
from icl_lens.model.batches import patch_norms
from icl_lens.model.capture import NonFiniteActivationError, ZeroNormWarning, dense_weights
from icl_lens.model.generation import GenerationPatches, generate_with_patches
from icl_lens.model.incremental import PatchSession, UpdateStats
from icl_lens.model.model_check import NotABridgeError, ProcessedWeightsError, ProcessedWeightsWarning
from icl_lens.model.loading import DEFAULT_MODEL, EMBEDDED_MODELS, ModelNotFoundError, known_model_names, load_model
from icl_lens.model.kept_only import patches_applied
from icl_lens.model.patches import EquivalenceReport, token_patches, verify_equivalence
from icl_lens.model.prompts import PromptError
from icl_lens.model.spike_thresholds import DEFAULT_SPIKE_THRESHOLD, SpikeThreshold, spike_threshold
from icl_lens.model.context_effect import ContextEffect, context_effect
from icl_lens.dynamics import (
    AlignmentTable,
    ContextTokenSteps,
    DecayFit,
    FinetuneAlignment,
    NoContextError,
    QueryPositionError,
    Trajectory,
    TrajectoryCheck,
    context_alignment,
    context_token_steps,
    finetune_alignment,
    trajectory,
    trajectory_sgd_cosines,
    verify_trajectory,
)
from icl_lens.thought import (
    Task,
    TaskFormatError,
    ThoughtEval,
    ThoughtPatch,
    VectorNotExportableError,
    evaluate_thought,
    load_task,
    thought_patch,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    """``icl_lens.lab`` imports on first use, so ``import icl_lens`` loads no lab experiment code."""
    if name == "lab":
        import importlib

        return importlib.import_module("icl_lens.lab")
    raise AttributeError(f"module 'icl_lens' has no attribute {name!r}")


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
    "NotABridgeError",
    "PatchSession",
    "ProcessedWeightsError",
    "ProcessedWeightsWarning",
    "PromptError",
    "QueryPositionError",
    "SpikeFlags",
    "SpikeThreshold",
    "Task",
    "TaskFormatError",
    "ThoughtEval",
    "ThoughtPatch",
    "TokenPatches",
    "StaleWeightsError",
    "DenseWeights",
    "dense_weights",
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
