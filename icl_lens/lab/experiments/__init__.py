"""The lab experiments; each returns a frozen result with ``.to_frame()`` (and ``.summary()``)."""
from typing import TYPE_CHECKING

from icl_lens._lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.lab.experiments._attention_regression import RegressionViewResult, attention_as_regression
    from icl_lens.lab.experiments._capacity import METHODS, CapacityResult, capacity_test
    from icl_lens.lab.experiments._convergence import ConvergenceResult, convergence_by_architecture
    from icl_lens.lab.experiments._equivalence import EquivalenceResult, numerical_equivalence
    from icl_lens.lab.experiments._implicit_explicit import AlignmentResult, implicit_vs_explicit
    from icl_lens.lab.experiments._loss_curves import LossCurves, loss_curves
    from icl_lens.lab.experiments._memory_cost import MemoryCostResult, decode_matches_forward, memory_and_cost
    from icl_lens.lab.experiments._patch_parts import PatchPartsResult, patch_parts
    from icl_lens.lab.experiments._solution_signs import (POPULATIONS, SELECTIVE, SolutionSigns, population,
                                                          solution_signs)
    from icl_lens.lab.experiments._thought_patch import ThoughtPatchResult, fit_thought_patch, static_thought_patch

__getattr__, __dir__, __all__ = lazy_exports(globals())
