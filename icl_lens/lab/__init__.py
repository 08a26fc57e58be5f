"""ICL lab: small models trained on in-context linear regression, and the papers' experiments on them.

Models (10-layer Pre-LN blocks whose contextual layer is softmax attention, linear attention, a
delta rule or a GRU; the paper's single block; one-block ablations; TransformerLens hook points
everywhere, :data:`LAB_MODELS`) ship trained in ``icl_lens/lab/checkpoints/``; ``python -m
icl_lens.lab.train`` retrains them and ``python -m icl_lens.lab.seeds`` trains other seeds into the
user cache (:mod:`icl_lens.lab.seeds`). The experiments (:mod:`icl_lens.lab.experiments`; Dherin
et al. 2025, arXiv 2507.16003; Mazzawi, Dherin et al. 2025, arXiv 2510.08734; McDermott, Heath,
Parhi 2026, arXiv 2606.25342) each return a frozen result with ``.to_frame()``; ``python -m
experiments.lab`` writes ``reports/eval_lab.md`` and ``python -m experiments.finetune_alignment`` the
implicit-vs-explicit section. Softmax attention solves the regression task in one of two mirror-image
ways (attend to inputs similar or opposite to the query, ``_mirror.py``: :func:`similarity_preference`,
:func:`orient_attention`); which one a training seed finds is set at initialisation and decides the
sign of its alignment with SGD (:func:`solution_signs`). ``sb_oriented`` (:data:`ORIENTED_MODELS`)
starts every seed in the similar-input basin; :data:`FACTOR_MODELS` vary one factor of it at a time.

The lab speaks the package's dialect: its token patches are a batched :class:`icl_lens.TokenPatches`
(``layer × prompt × position``), its implicit trajectories are :class:`icl_lens.Trajectory`, and
its hook names come from its block-family entry :data:`LAB_FAMILY`.
"""
from typing import TYPE_CHECKING

from icl_lens._lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.lab._checkpoints import (ABLATION_FACTOR, ABLATION_MODELS, FACTOR, FACTOR_MODELS, LAB_MODELS,
                                           ORIENTED_MODELS, RECIPES, CheckpointNotFoundError, load_lab_model,
                                           training_record)
    from icl_lens.lab._mirror import (label_response, orient_attention, probe_prompts, readout_slope,
                                      similarity_preference)
    from icl_lens.lab._mixers import ARCHITECTURES
    from icl_lens.lab._model import LAB_FAMILY, LabConfig, RegressionModel
    from icl_lens.lab._patching import lab_token_patches, patched_context_free, patched_forward
    from icl_lens.lab._regression_dynamics import (ExplicitSGD, explicit_sgd, implicit_trajectory, pair_gradients,
                                                   reproduced_predictions, sgd_on_pairs, step_edits,
                                                   trajectory_identity_errors)
    from icl_lens.lab._tasks import RegressionPrompts, sample_prompts
    from icl_lens.lab.experiments import (AlignmentResult, ConvergenceResult, EquivalenceResult, LossCurves,
                                          MemoryCostResult, PatchPartsResult, RegressionViewResult, SolutionSigns,
                                          ThoughtPatchResult, attention_as_regression, convergence_by_architecture,
                                          decode_matches_forward, fit_thought_patch, implicit_vs_explicit,
                                          loss_curves, memory_and_cost, numerical_equivalence, patch_parts,
                                          solution_signs, static_thought_patch)

__getattr__, __dir__, __all__ = lazy_exports(globals(), submodules=("experiments", "seeds", "train"))
