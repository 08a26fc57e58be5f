"""ICL lab: small models trained on in-context linear regression, and the papers' experiments on them.

Models (10-layer Pre-LN blocks whose contextual layer is softmax attention, linear
attention, a delta rule or a GRU; the paper's single block; one-block ablations of the
Pre-LN block; TransformerLens hook points everywhere, :data:`LAB_MODELS`) ship trained in
``icl_lens/lab/checkpoints``; ``python -m icl_lens.lab.train`` retrains them. The
experiments (Dherin et al. 2025, arXiv 2507.16003; Mazzawi, Dherin et al. 2025, arXiv
2510.08734; McDermott, Heath, Parhi 2026, arXiv 2606.25342) each return a frozen result
with ``.to_frame()``; ``python -m experiments.lab`` writes ``reports/eval_lab.md`` and
``python -m experiments.finetune_alignment`` the implicit-vs-explicit section. Softmax attention
solves the regression task in one of two mirror-image ways (attend to inputs similar or opposite
to the query, :mod:`icl_lens.lab.mirror`); which one a training seed finds is set at
initialisation and decides the sign of its alignment with SGD (:func:`solution_signs`).

The lab speaks the package's dialect: its token patches are a batched :class:`icl_lens.TokenPatches`
(``layer × prompt × position``), its implicit trajectories are :class:`icl_lens.Trajectory`, and
its hook names come from its block-family entry :data:`LAB_FAMILY`.
"""
from icl_lens.lab.checkpoints import LAB_MODELS, CheckpointNotFoundError, load_lab_model, training_record
from icl_lens.lab.experiments.attention_regression import RegressionViewResult, attention_as_regression
from icl_lens.lab.experiments.convergence import ConvergenceResult, convergence_by_architecture
from icl_lens.lab.experiments.equivalence import EquivalenceResult, numerical_equivalence
from icl_lens.lab.experiments.implicit_explicit import AlignmentResult, implicit_vs_explicit
from icl_lens.lab.experiments.loss_curves import LossCurves, loss_curves
from icl_lens.lab.experiments.memory_cost import MemoryCostResult, decode_matches_forward, memory_and_cost
from icl_lens.lab.experiments.patch_parts import PatchPartsResult, patch_parts
from icl_lens.lab.experiments.solution_signs import SolutionSigns, solution_signs
from icl_lens.lab.experiments.thought_patch import ThoughtPatchResult, fit_thought_patch, static_thought_patch
from icl_lens.lab.mirror import label_response, orient_attention, similarity_preference
from icl_lens.lab.mixers import ARCHITECTURES
from icl_lens.lab.model import LAB_FAMILY, LabConfig, RegressionModel
from icl_lens.lab.patching import lab_token_patches, patched_context_free, patched_forward
from icl_lens.lab.regression_dynamics import (
    ExplicitSGD,
    explicit_sgd,
    implicit_trajectory,
    pair_gradients,
    reproduced_predictions,
    sgd_on_pairs,
    step_edits,
    trajectory_identity_errors,
)
from icl_lens.lab.tasks import RegressionPrompts, sample_prompts

__all__ = [
    "ARCHITECTURES", "AlignmentResult", "CheckpointNotFoundError", "ConvergenceResult", "EquivalenceResult",
    "ExplicitSGD", "LAB_FAMILY", "LAB_MODELS", "LabConfig", "LossCurves", "MemoryCostResult", "PatchPartsResult",
    "RegressionModel", "RegressionPrompts", "RegressionViewResult", "SolutionSigns", "ThoughtPatchResult",
    "attention_as_regression", "convergence_by_architecture", "decode_matches_forward", "explicit_sgd",
    "fit_thought_patch", "implicit_trajectory", "implicit_vs_explicit", "lab_token_patches", "label_response",
    "load_lab_model", "loss_curves", "memory_and_cost", "numerical_equivalence", "orient_attention", "pair_gradients",
    "patch_parts", "patched_context_free", "patched_forward", "reproduced_predictions", "sample_prompts",
    "sgd_on_pairs", "similarity_preference", "solution_signs", "static_thought_patch", "step_edits",
    "training_record", "trajectory_identity_errors",
]
