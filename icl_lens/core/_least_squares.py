"""The one least-squares fit of icl_lens: static weight edits from many tokens (arXiv 2510.08734).

A token patch (Dherin et al. 2025, arXiv 2507.16003) makes one query's context-free MLP
input ``a`` act like its contextual input ``A``: ``(W + ΔW) a = W A``. Fitting one edit
to the calibration tokens ``i`` of many queries gives the token-independent updates of
Mazzawi, Dherin et al. 2025 (arXiv 2510.08734, Theorem 2.1):

    thought matrix   Δ(I) = (Σᵢ W δᵢ aᵢᵀ)(Σᵢ aᵢ aᵢᵀ + λI)⁻¹   (δᵢ = Aᵢ − aᵢ)
    thought vector   δ(I) = (1/n) Σᵢ ρᵢ                     (ρᵢ: block-output residual)

``W`` factors out of the matrix: ``Δ(I) = W M`` with the ``d_model × d_model`` *input
map* ``M = D Aᵀ (A Aᵀ + λI)⁻¹ = D (AᵀA + λI)⁻¹ Aᵀ`` (columns of ``D`` and ``A`` are the
``δᵢ`` and ``aᵢ``). So one ``M`` serves every dense layer that reads the MLP input:
``W_in`` of a plain MLP, and ``W_gate`` and ``W_up`` of a gated MLP, which get the two
separate least-squares fits ``Δ_gate = W_gate M`` and ``Δ_up = W_up M`` of the paper's
Gemma adaptation. The ``n × n`` form is used (``n`` calibration tokens, usually
``n < d_model``). Both the real models (:mod:`icl_lens.thought`) and the regression lab
(:mod:`icl_lens.lab.experiments._thought_patch`) fit through :func:`input_map`.

The same least squares fits the *down-projection map* of :mod:`icl_lens.thought` (the
per-token part of the block-output residual that a constant vector leaves, fitted on the
MLP's hidden activations ``hᵢ``: ``ΔW_out hᵢ ≈ rᵢ``): :func:`factored_least_squares`
returns ``M = Σ_k u[k] v[k]ᵀ`` as its ``n`` factor rows, never the dense
``d_model × d_mlp`` matrix (``u = (H Hᵀ + λI)⁻¹ R``, ``v = H``; for ``λ = 0``
``u = R``, ``v = (H⁺)ᵀ``). :func:`input_map` is its dense product ``uᵀ v``.

Preserve penalty (locality; MEMIT, Meng et al. 2023, arXiv 2210.07229, eq. 14). An edit
``M`` fitted to the calibration rows also acts on every other input; to keep it from
changing what the model computes on general text, the fit may add the penalty
``Σ_k ‖M k₀‖² = tr(M K₀K₀ᵀ Mᵀ)`` over *preserved keys* ``k₀`` (the same layer's inputs
on texts the model reads as it is), weighted: the normal equations become
``M (Σᵢ xᵢxᵢᵀ + P + λI) = Σᵢ tᵢxᵢᵀ`` with ``P = w · K₀K₀ᵀ`` (``d_in × d_in``), so
``M = Tᵀ X (XᵀX + P + λI)⁻¹``: :func:`factored_least_squares` with ``penalty=P`` then
solves in the ``d_in × d_in`` form and still returns ``n`` factor rows
(``u = T``, ``v = X (XᵀX + P + λI)⁻¹``). :func:`preserve_weight` makes ``w`` scale-free:
``strength · tr(XᵀX) / tr(K₀K₀ᵀ)`` (strength 1: the preserved keys weigh as much in all
as the calibration rows). The gain form takes the diagonal ``Σ_k ŷ₀ ⊙ ŷ₀`` (a
per-coordinate penalty) and the mean form the count of preserved tokens.

Ridge scale. :func:`relative_ridge` turns a scale-free ``ridge`` into
``λ = ridge · tr(Σᵢ aᵢaᵢᵀ) / d_in`` (the mean eigenvalue of the ``d_in × d_in`` Gram
matrix), so one value means the same shrinkage for every layer, model and fit (input
map, gain, down-projection map, the regression lab).

Singular systems. With ``λ = 0`` and ``Σ aᵢaᵢᵀ`` singular (always when ``n < d_model``),
``Z⁻¹`` is replaced by the Moore–Penrose pseudo-inverse: ``M = D A⁺``, the
minimum-Frobenius-norm least-squares solution (singular values below
``rtol·σ_max``, ``rtol = n_max·eps``, count as zero). For one calibration token it is
exactly the token patch ``W δ aᵀ/‖a‖²``. Non-finite inputs raise; the result is never NaN.

Gain form of the vector (for blocks whose MLP branch ends in an RMSNorm, Gemma 3): a
bias after the post-FFN norm has no slot in the Hugging Face architecture, so the vector
is fitted as an update ``g`` of that norm's gain instead: the branch output becomes
``(1 + w + g) ⊙ ŷ`` (``ŷ`` = the RMS-normalised MLP output), and ``g`` solves the
per-coordinate least squares ``min Σᵢ ‖ρᵢ − g ⊙ ŷᵢ‖²``:
``g = Σᵢ ρᵢ ⊙ ŷᵢ / (Σᵢ ŷᵢ⊙ŷᵢ + λ)`` (0 where the denominator is 0). For one calibration
token it adds exactly ``ρ``, like the bias (Goldwaser, Munn, Gonzalvo, Dherin,
arXiv 2511.17864, patch the norm parameters of sandwich-norm blocks the same way).
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from icl_lens.core._token_patch import zero_norm_threshold


class SingularFitError(FloatingPointError):
    """A least-squares fit produced non-finite numbers (inputs are checked before)."""


GRAM_BLOCK = 256  # columns per product in :func:`gram`


def gram(x: Float[Tensor, "n d"], block: int = GRAM_BLOCK) -> Float[Tensor, "d d"]:
    """``xᵀx``, the sum of the outer products of the rows of ``x`` (a preserve penalty's ``K₀K₀ᵀ``, from its keys as
    rows). Only the ``block``-column strips on and right of the diagonal are multiplied, and mirrored below it:
    ``(k + 1)/(2k)`` of ``x.T @ x``'s products for ``k`` strips (5/8 for Gemma 3 270M's ``d_mlp``, 2048), and
    exactly symmetric; the same entries as ``x.T @ x`` up to rounding."""
    d = x.shape[-1]
    out = x.new_empty(d, d)
    for start in range(0, d, block):
        strip = x[:, start:start + block].T @ x[:, start:]
        width = min(block, d - start)
        strip[:, :width] = strip[:, :width].triu() + strip[:, :width].triu(1).T  # the diagonal block from its upper half
        out[start:start + block, start:] = strip
        out[start:, start:start + block] = strip.T
    return out


def _check_finite(x: Tensor, what: str) -> None:
    """Raise unless every entry is finite. A NaN or inf entry makes the sum non-finite, so a finite sum (one
    reduction, no mask) settles it; a sum that overflowed with finite entries gets the exact test."""
    if not torch.isfinite(x.sum()) and not torch.isfinite(x).all():
        raise SingularFitError(f"non-finite values in {what}")


def pinv_rtol(n_rows: int, n_cols: int, dtype: torch.dtype) -> float:
    """Relative singular-value cutoff of the pseudo-inverse fallback: ``max(m, n)·eps``."""
    return max(n_rows, n_cols) * float(torch.finfo(dtype).eps)


def relative_ridge(inputs: Float[Tensor, "n d_in"], ridge: float) -> float:
    """Absolute ``λ = ridge · tr(Σᵢ xᵢxᵢᵀ) / d_in`` for the rows ``xᵢ`` of ``inputs`` (``ridge ≥ 0``)."""
    if not ridge >= 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    return float(ridge) * float((inputs.double() ** 2).sum()) / inputs.shape[-1]


def preserve_weight(inputs: Float[Tensor, "n d_in"], covariance: Float[Tensor, "d_in d_in"] | Float[Tensor, " d_in"],
                    strength: float) -> float:
    """Scale-free weight ``w = strength · tr(XᵀX) / tr(K₀K₀ᵀ)`` of a preserve penalty (a covariance, or its diagonal)."""
    if not strength >= 0:
        raise ValueError(f"preserve strength must be >= 0, got {strength}")
    trace = float(covariance.diagonal().sum() if covariance.ndim == 2 else covariance.sum())
    return 0.0 if trace == 0.0 else float(strength) * float((inputs.double() ** 2).sum()) / trace


def factored_least_squares(
    targets: Float[Tensor, "n d_out"],
    inputs: Float[Tensor, "n d_in"],
    *,
    ridge: float = 0.0,
    penalty: Float[Tensor, "d_in d_in"] | None = None,
) -> tuple[Float[Tensor, "n d_out"], Float[Tensor, "n d_in"]]:
    """Factors ``(u, v)`` of ``M = uᵀ v`` minimising ``Σᵢ ‖tᵢ − M xᵢ‖² + tr(M P Mᵀ) + λ‖M‖²_F`` (``λ = ridge``,
    absolute; ``P = penalty``, the weighted covariance of preserved keys, or none).

    ``M x = Σ_k u[k] (v[k]·x)``. ``λ = 0`` and no penalty: the minimum-norm solution ``T X⁺``.
    """
    if targets.ndim != 2 or inputs.ndim != 2 or targets.shape[0] != inputs.shape[0]:
        raise ValueError(f"targets and inputs must be [n, d_out] and [n, d_in]; got {tuple(targets.shape)}, "
                         f"{tuple(inputs.shape)}")
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    _check_finite(targets, "least-squares targets")
    _check_finite(inputs, "least-squares inputs")
    n = inputs.shape[0]
    if penalty is not None:  # the d_in × d_in form: v = X (XᵀX + P + λI)⁻¹ (the system is symmetric)
        _check_finite(penalty, "preserve penalty")
        gram = inputs.T @ inputs + penalty.to(inputs.dtype)
        if ridge > 0:  # positive definite: Cholesky (half LU's work), LU where rounding made it indefinite
            gram.diagonal().add_(ridge)
            chol, info = torch.linalg.cholesky_ex(gram)
            v = (torch.cholesky_solve(inputs.T, chol) if int(info) == 0 else torch.linalg.solve(gram, inputs.T)).T
            u = targets
        else:
            u, v = targets, inputs @ torch.linalg.pinv(gram, rtol=pinv_rtol(*gram.shape, gram.dtype), hermitian=True)
    elif ridge > 0:
        gram = inputs @ inputs.T + ridge * torch.eye(n, dtype=inputs.dtype, device=inputs.device)
        u, v = torch.linalg.solve(gram, targets), inputs  # M = Tᵀ (X Xᵀ + λI)⁻¹ X
    else:
        u, v = targets, torch.linalg.pinv(inputs, rtol=pinv_rtol(*inputs.shape, inputs.dtype)).T  # M = Tᵀ (X⁺)ᵀ
    _check_finite(u, "least-squares factors")
    _check_finite(v, "least-squares factors")
    return u, v


def input_map(
    delta: Float[Tensor, "n d_model"],
    inputs: Float[Tensor, "n d_model"],
    *,
    ridge: float = 0.0,
    penalty: Float[Tensor, "d_model d_model"] | None = None,
) -> Float[Tensor, "d_model d_model"]:
    """``M`` with ``Δ = W M`` the least-squares thought matrix: ``M aᵢ ≈ δᵢ`` for every row ``i``.

    Rows of ``delta`` are ``δᵢ = Aᵢ − aᵢ`` (or any residual to fit), rows of ``inputs``
    the context-free MLP inputs ``aᵢ``. ``ridge`` is ``λ`` (absolute, ``≥ 0``; see
    :func:`relative_ridge`); ``λ = 0`` uses the minimum-norm pseudo-inverse. ``penalty``: the preserve
    penalty ``P`` (see :func:`factored_least_squares`).
    """
    if delta.shape != inputs.shape or delta.ndim != 2:
        raise ValueError(f"delta and inputs must both be [n, d_model]; got {tuple(delta.shape)}, {tuple(inputs.shape)}")
    u, v = factored_least_squares(delta, inputs, ridge=ridge, penalty=penalty)
    m = u.T @ v  # D (AᵀA+λI)⁻¹ Aᵀ, or D A⁺
    _check_finite(m, "thought matrix input map")
    return m


def mean_vector(residuals: Float[Tensor, "n d_model"], *, penalty: float = 0.0) -> Float[Tensor, " d_model"]:
    """Thought vector: ``Σ ρᵢ / (n + p)``, least squares over a constant with the preserve penalty ``p‖c‖²``
    (``p``: the weighted count of preserved tokens, which a constant moves alike); ``p = 0``: the mean residual."""
    _check_finite(residuals, "vector residuals ρ")
    return residuals.sum(0) / (residuals.shape[0] + float(penalty))


def gain_vector(
    residuals: Float[Tensor, "n d_model"],
    normalized: Float[Tensor, "n d_model"],
    *,
    ridge: float = 0.0,
    penalty: Float[Tensor, " d_model"] | None = None,
) -> Float[Tensor, " d_model"]:
    """Gain update ``g`` minimising ``Σᵢ ‖ρᵢ − g ⊙ ŷᵢ‖²`` (+ ``λ‖g‖²`` + ``Σ_d penalty_d g_d²``, the preserve
    penalty: the weighted ``Σ_k ŷ₀ ⊙ ŷ₀`` of preserved tokens), coordinate by coordinate."""
    _check_finite(residuals, "vector residuals ρ")
    _check_finite(normalized, "normalised MLP outputs ŷ")
    num = (residuals * normalized).sum(0)
    den = (normalized * normalized).sum(0) + ridge + (0.0 if penalty is None else penalty.to(num.dtype))
    tiny = zero_norm_threshold(den.dtype)
    return torch.where(den > tiny, num / torch.where(den > tiny, den, torch.ones_like(den)), torch.zeros_like(num))


def relative_residual(target: Float[Tensor, "n d"], fitted: Float[Tensor, "n d"]) -> float:
    """``‖target − fitted‖_F / ‖target‖_F`` (0 when the target is 0)."""
    den = float(torch.linalg.norm(target))
    return 0.0 if den == 0.0 else float(torch.linalg.norm(target - fitted)) / den
