"""Math core of icl_lens: pure torch on tensors, shared by two or more concepts; no model code.

Factored metrics of rank-1 updates (:func:`patch_norm`, :func:`gram_cosine`, ...), attention
over a kept set of keys (docs/design.md §2), the minimal token patch of one dense layer, the
attribution algebra of a patch (integrated Jacobians by Gauss–Legendre quadrature, head × token
shares: docs/design.md §7), the one least-squares fit (:func:`factored_least_squares`, :func:`input_map`), the one power-law fit
and the gain-free RMS norm. Nothing here imports transformer_lens, transformers, ipywidgets or
plotly; the model side (:mod:`icl_lens.model`) and the concepts build on it.
"""
from typing import TYPE_CHECKING

from icl_lens._lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.core._attribution import (gauss_legendre, head_source_parts, head_source_shares, integrated_jacobian,
                                            integrated_vjp, share_cotangent)
    from icl_lens.core._factored import diff_norm, gram_cosine, patch_cosine, patch_inner, patch_norm, sum_norm
    from icl_lens.core._kept_attention import bos_and_self_output, default_kept_mask, kept_set_output, removal_kept_mask
    from icl_lens.core._least_squares import SingularFitError, factored_least_squares, gram, input_map, relative_ridge
    from icl_lens.core._norms import rms_normalize
    from icl_lens.core._power_law import PowerLawFit, power_law_fit
    from icl_lens.core._token_patch import input_pseudo_inverse, token_patch

__getattr__, __dir__, __all__ = lazy_exports(globals())
