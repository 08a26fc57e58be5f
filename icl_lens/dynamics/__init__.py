"""Implicit learning dynamics: how a query's weights move as its context is read (docs/design.md §3).

Dherin et al. 2025, arXiv 2507.16003, §3-4. Files: ``_trajectory.py`` (the :class:`Trajectory`
``W₀..Wₙ`` of one query, factored, and its power-law :class:`DecayFit`), ``_trajectory_metrics.py``
(meta-gradient norms and cosines in closed form), ``_prefix_variants.py`` (the prefix and absorb
orders as one batched sequence), ``_trajectory_capture.py`` (:func:`trajectory` of a language model
from one forward, its reference method and exactness check), ``_explicit_finetune.py`` (explicit
SGD on the first dense MLP weights, factored), ``_sgd_alignment.py`` (implicit vs explicit
cosines) and ``_context_alignment.py`` (the paper's per-context-token protocol on many prompts).
"""
from typing import TYPE_CHECKING

from icl_lens._lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.dynamics._context_alignment import context_alignment
    from icl_lens.dynamics._explicit_finetune import ContextTokenSteps, context_token_steps, finetune_alignment
    from icl_lens.dynamics._sgd_alignment import AlignmentTable, FinetuneAlignment, trajectory_sgd_cosines
    from icl_lens.dynamics._trajectory import DecayFit, Trajectory
    from icl_lens.dynamics._trajectory_capture import (NoContextError, QueryPositionError, TrajectoryCheck, trajectory,
                                                       trajectory_naive, verify_trajectory)

__getattr__, __dir__, __all__ = lazy_exports(globals())
