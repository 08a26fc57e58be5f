"""ICL lab: small models trained on in-context linear regression, and the papers' experiments on them.

Models (10-layer Pre-LN blocks whose contextual layer is softmax attention, linear
attention, a delta rule or a GRU; TransformerLens hook points everywhere) ship trained in
``icl_lens/lab/checkpoints``; ``python -m icl_lens.lab.train`` retrains them. The six
experiments (Dherin et al. 2025, arXiv 2507.16003; Mazzawi, Dherin et al. 2025, arXiv
2510.08734; McDermott, Heath, Parhi 2026, arXiv 2606.25342) each return a frozen result
with ``.to_frame()``; ``python -m icl_lens.evals.lab`` writes ``reports/eval_lab.md``.
"""
from icl_lens.lab.checkpoints import CheckpointNotFoundError, load_lab_model, training_record
from icl_lens.lab.dynamics import ExplicitSGD, ImplicitTrajectory, explicit_sgd, implicit_trajectory
from icl_lens.lab.experiments.attention_regression import RegressionViewResult, attention_as_regression
from icl_lens.lab.experiments.convergence import ConvergenceResult, convergence_by_architecture
from icl_lens.lab.experiments.equivalence import EquivalenceResult, numerical_equivalence
from icl_lens.lab.experiments.implicit_explicit import AlignmentResult, implicit_vs_explicit
from icl_lens.lab.experiments.memory_cost import MemoryCostResult, decode_matches_forward, memory_and_cost
from icl_lens.lab.experiments.thought_patch import ThoughtPatchResult, fit_thought_patch, static_thought_patch
from icl_lens.lab.mixers import ARCHITECTURES
from icl_lens.lab.model import LabConfig, RegressionModel
from icl_lens.lab.patching import LabPatches, lab_token_patches, patched_context_free
from icl_lens.lab.tasks import RegressionPrompts, sample_prompts

__all__ = [
    "ARCHITECTURES", "AlignmentResult", "CheckpointNotFoundError", "ConvergenceResult", "EquivalenceResult",
    "ExplicitSGD", "ImplicitTrajectory", "LabConfig", "LabPatches", "MemoryCostResult", "RegressionModel",
    "RegressionPrompts", "RegressionViewResult", "ThoughtPatchResult", "attention_as_regression",
    "convergence_by_architecture", "decode_matches_forward", "explicit_sgd", "fit_thought_patch",
    "implicit_trajectory", "implicit_vs_explicit", "lab_token_patches", "load_lab_model", "memory_and_cost",
    "numerical_equivalence", "patched_context_free", "sample_prompts", "static_thought_patch", "training_record",
]
