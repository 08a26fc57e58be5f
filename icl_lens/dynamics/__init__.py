"""Implicit learning dynamics: how a query's weights move as its context is read (docs/design.md §3).

Everything about the concept lives here (Dherin et al. 2025, arXiv 2507.16003, §3-4):
:mod:`~icl_lens.dynamics.trajectory` (the :class:`Trajectory` ``W₀..Wₙ`` of one query,
factored, and its power-law :class:`DecayFit`), :mod:`~icl_lens.dynamics.trajectory_metrics`
(meta-gradient norms and cosines in closed form), :mod:`~icl_lens.dynamics.prefix_variants`
(the prefix and absorb orders as one batched sequence), :mod:`~icl_lens.dynamics.trajectory_capture`
(the trajectory of a language model from one forward, and its exactness check),
:mod:`~icl_lens.dynamics.explicit_finetune` (explicit SGD on the first dense MLP weights,
factored), :mod:`~icl_lens.dynamics.sgd_alignment` (implicit vs explicit cosines) and
:mod:`~icl_lens.dynamics.context_alignment` (the paper's per-context-token protocol on many prompts).
"""
from icl_lens.dynamics.context_alignment import context_alignment
from icl_lens.dynamics.explicit_finetune import ContextTokenSteps, context_token_steps, finetune_alignment
from icl_lens.dynamics.sgd_alignment import AlignmentTable, FinetuneAlignment, trajectory_sgd_cosines
from icl_lens.dynamics.trajectory import DecayFit, Trajectory
from icl_lens.dynamics.trajectory_capture import (
    NoContextError,
    QueryPositionError,
    TrajectoryCheck,
    trajectory,
    verify_trajectory,
)

__all__ = ["AlignmentTable", "ContextTokenSteps", "DecayFit", "FinetuneAlignment", "NoContextError",
           "QueryPositionError", "Trajectory", "TrajectoryCheck", "context_alignment", "context_token_steps",
           "finetune_alignment", "trajectory", "trajectory_sgd_cosines", "verify_trajectory"]
