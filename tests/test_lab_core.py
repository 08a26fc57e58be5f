"""Identities of the architecture-free math used by the ICL lab (core/)."""
from __future__ import annotations

import math

import pytest
import torch

from icl_lens.core._factored import sum_cosine, sum_inner, sum_norm
from icl_lens.lab._kernel_regression import feature_kernel_regression, nadaraya_watson
from icl_lens.lab._online_regression import delta_loss, delta_update, hebbian_loss, hebbian_update, loss_gradient
from icl_lens.core._least_squares import input_map, mean_vector
from icl_lens.core._power_law import power_law_fit

G = torch.Generator().manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, generator=G, dtype=torch.float64)


def test_nadaraya_watson_is_softmax_attention():
    q, k, v = rand(3, 7, 8), rand(3, 9, 8), rand(3, 9, 5)
    mask = torch.rand(7, 9, generator=G) > 0.3
    mask[:, 0] = True
    ref = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~mask, float("-inf")), -1) @ v
    assert (nadaraya_watson(q, k, v, mask=mask) - ref).abs().max() <= 1e-12 * ref.abs().max()


def test_feature_kernel_regression_weights_sum_to_one():
    q, k, v = rand(4, 8).exp(), rand(6, 8).exp(), torch.ones(6, 3, dtype=torch.float64)
    assert torch.allclose(feature_kernel_regression(q, k, v), torch.ones(4, 3, dtype=torch.float64))


def test_nadaraya_watson_rejects_bad_input():
    with pytest.raises(ValueError, match="keys but"):
        nadaraya_watson(rand(2, 4), rand(3, 4), rand(2, 4))
    with pytest.raises(ValueError, match="at least one"):
        nadaraya_watson(rand(2, 4), rand(3, 4), rand(3, 4), mask=torch.zeros(2, 3, dtype=torch.bool))


def test_updates_are_gradient_steps_on_their_losses():
    S, k, v = rand(5, 4, 3), rand(5, 3), rand(5, 4)
    beta = torch.rand(5, generator=G, dtype=torch.float64)
    assert torch.allclose(hebbian_update(S, k, v) - S, -loss_gradient(hebbian_loss, S, k, v), atol=1e-13)
    assert torch.allclose(delta_update(S, k, v, beta) - S, -beta[:, None, None] * loss_gradient(delta_loss, S, k, v), atol=1e-13)
    kn = torch.nn.functional.normalize(k, dim=-1)
    shrink = delta_loss(delta_update(S, kn, v, beta), kn, v) / delta_loss(S, kn, v)
    assert torch.allclose(shrink, (1 - beta) ** 2, atol=1e-12)


def test_sum_cosine_matches_dense():
    U1, V1, U2, V2 = rand(3, 6), rand(3, 4), rand(2, 6), rand(2, 4)
    M1, M2 = U1.T @ V1, U2.T @ V2
    assert torch.allclose(sum_inner(U1, V1, U2, V2), (M1 * M2).sum())
    assert torch.allclose(sum_norm(U1, V1), M1.norm())
    assert torch.allclose(sum_cosine(U1, V1, U2, V2), (M1 * M2).sum() / (M1.norm() * M2.norm()))
    assert sum_cosine(U1, V1, torch.zeros(1, 6, dtype=torch.float64), V2[:1]) == 0


def test_power_law_fit_recovers_exponent_at_given_x():
    n = torch.arange(3, 67, dtype=torch.float64)
    y = torch.stack([3 * n ** -0.5, 2 * n ** 0.0])
    fit = power_law_fit(y, x=n)
    assert torch.allclose(fit.exponent, torch.tensor([0.5, 0.0], dtype=torch.float64), atol=1e-12)
    assert torch.allclose(fit.prefactor, torch.tensor([3.0, 2.0], dtype=torch.float64))
    assert fit.n_points.tolist() == [64, 64]
    assert power_law_fit(-y, x=n).exponent.isnan().all()  # no positive point enters
    with pytest.raises(ValueError, match="positive x"):
        power_law_fit(y, x=n - 10)


def test_thought_matrix_interpolates_when_inputs_are_independent():
    W, A, a = rand(10, 6), rand(4, 6), rand(4, 6)  # 4 independent inputs in 6 dims
    D = W @ input_map(A - a, a)
    assert torch.allclose(a @ (W + D).T, A @ W.T, atol=1e-10)
    ridge = W @ input_map(A - a, a, ridge=1e3)
    assert ridge.norm() < D.norm()
    assert torch.allclose(mean_vector(A - a), (A - a).mean(0))
    with pytest.raises(ValueError):
        input_map(A - a, a[:3])


def test_import_icl_lens_loads_no_lab_code_until_asked():
    import subprocess
    import sys

    code = ("import icl_lens, sys; print([m for m in sys.modules if m.startswith('icl_lens.lab')]); "
            "icl_lens.lab.loss_curves; print('icl_lens.lab.experiments._loss_curves' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "True"
