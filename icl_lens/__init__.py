"""icl_lens: see in-context learning as weight updates.

A transformer reading a prompt behaves exactly as if the first dense weights of each
MLP had received a rank-1 update per token, the *token patch* (Dherin et al. 2025,
arXiv 2507.16003). icl_lens computes those patches exactly for every layer and token
of real models, from one forward pass, and builds dynamics, thought patches and
dashboards on them. Definitions: docs/design.md; usage: README.md.

The names below are imported on first use (``icl_lens/_lazy_exports.py``): ``import icl_lens``
alone imports neither torch nor TransformerLens, so the command line starts fast.
"""
from typing import TYPE_CHECKING, Any

from icl_lens._lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.model import (
        DEFAULT_MODEL,
        EMBEDDED_MODELS,
        ModelNotFoundError,
        NonFiniteActivationError,
        NotABridgeError,
        ProcessedWeightsError,
        ProcessedWeightsWarning,
        PromptError,
        TokenizerMismatchError,
        UnsupportedArchitectureError,
        known_model_names,
        load_model,
    )
    from icl_lens.patches import (
        ContextEffect,
        DenseWeights,
        EquivalenceReport,
        NonFiniteWeightsError,
        NotHeldError,
        PatchAttribution,
        PatchFileError,
        PatchSession,
        PatchWrites,
        StaleWeightsError,
        TokenPatch,
        TokenPatches,
        UpdateStats,
        ZeroNormWarning,
        context_effect,
        dense_weights,
        patch_attribution,
        patch_norms,
        patches_applied,
        token_patches,
        verify_equivalence,
    )
    from icl_lens.spikes import (
        DEFAULT_SPIKE_THRESHOLD,
        GenerationPatches,
        SpikeFlags,
        SpikeSettings,
        SpikeThreshold,
        generate_with_patches,
        spike_scores,
        spike_scores_from_norms,
        spike_threshold,
    )
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
        ThoughtFit,
        ThoughtPatch,
        VectorNotExportableError,
        evaluate_thought,
        load_task,
        thought_patch,
        thought_patch_joint,
    )
    from icl_lens import lab

__getattr__, __dir__, _EXPORTED = lazy_exports(globals(), submodules=("lab",))

if TYPE_CHECKING:
    from icl_lens.model import Model
    from icl_lens.ui import Dashboard

__version__ = "0.1.0"



def dashboard(model: "Model | str | None" = None, **kwargs: Any) -> "Dashboard":
    """The live JupyterLab dashboard (imports ipywidgets/plotly only when called); see ``icl_lens.ui``."""
    from icl_lens.ui import dashboard as _dashboard

    return _dashboard(model, **kwargs)


__all__ = sorted({*_EXPORTED, "dashboard"})
