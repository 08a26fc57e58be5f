"""Tests for the faults a fault-injection run planted and the rest of the suite missed (issue 26).

Each test compares the code with an independent computation of what its docstring says, on
inputs where the planted fault changes the answer: an edit in the middle of a prompt, a ridge
> 0, overlapping intervals, a λ that matters, layers of unequal size, metrics that differ,
a noise floor that must be the model's own.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from icl_lens import PatchSession, token_patches, trajectory
from icl_lens.spikes._scores import MAD_TO_SIGMA, spike_scores_from_norms
from icl_lens.model._block_family import block_family
from icl_lens.patches._token_patches import noise_floor
from icl_lens.model._prompts import encode_prompt
from icl_lens.model._reading import activations_captured
from icl_lens.stats._auroc import auroc
from icl_lens.stats._logistic import choose_lambda, fit_logistic, grouped_folds
from icl_lens.thought._fit import thought_patch
from icl_lens.thought._instruction_batches import calibration_ids, with_bos
from workshop.claims import verdict_above

TEXT = "Typing a prompt one keystroke at a time, with edits in between."


# --- PatchSession: edits in the middle of the prompt ----------------------------------------------

@pytest.mark.parametrize("edited", [
    TEXT[:5] + "X" + TEXT[6:],                 # one character replaced, same length
    TEXT[:5] + "inserted " + TEXT[5:],         # text inserted: every later position moves
    TEXT[:5] + TEXT[15:],                      # text deleted
], ids=["replace", "insert", "delete"])
def test_session_after_an_edit_in_the_middle_matches_a_fresh_computation(load, edited):
    model = load("tiny-gemma3", torch.float64)
    session = PatchSession(model)
    session.update(TEXT)
    patches = session.update(edited)
    fresh = token_patches(model, edited)
    assert session.last_stats.reused == 6  # BOS + the 5 unchanged bytes, nothing after the edit
    assert session.last_stats.recomputed == fresh.n_positions - 6
    assert patches.tokens == fresh.tokens and torch.equal(patches.token_ids, fresh.token_ids)
    for name in ("u_in", "u_gate", "v", "correction"):
        x, y = getattr(patches, name), getattr(fresh, name)
        assert x.shape == y.shape, name
        assert (x - y).abs().max() <= 1e-10 * y.abs().max(), name
    full_logits = model(encode_prompt(model, edited)[None])[0, -1]
    assert torch.allclose(session.last_logits, full_logits, atol=1e-10)


# --- thought fit: the ridge scaling ---------------------------------------------------------------

def test_thought_matrix_with_ridge_is_the_documented_ridge_solution(load):
    """kind "matrix", one layer: ``M = Σ δᵢaᵢᵀ (Σ aᵢaᵢᵀ + λI)⁻¹`` with ``λ = ridge · Σ‖aᵢ‖² / d_model``
    over every row (query tokens and the anchor rows BOS and prefix, whose target δ is 0)."""
    model = load("tiny-llama", torch.float64)
    instruction, queries, ridge = "Answer with the capital.\n", ["France:", "Peru is"], 0.5
    patch = thought_patch(model, instruction, queries, kind="matrix", ridge=ridge, layers=[0], answer_tokens=0,
                          preserve=())
    instr, query_ids, prefix = calibration_ids(model, instruction, queries, "\n")
    hook = block_family(model).mlp_input(0)

    def mlp_input(ids):
        with activations_captured(model, [hook], stop_after=hook) as got:
            model(torch.tensor([ids], device=model.cfg.device), return_type=None)
        return got[hook][0].double()

    rows, targets = [], []
    for q in query_ids:
        A = mlp_input(with_bos(model, instr + q))[-len(q):]
        a_all = mlp_input(with_bos(model, prefix + q))
        a, anchors = a_all[-len(q):], a_all[:-len(q)]
        rows += [anchors, a]
        targets += [torch.zeros_like(anchors), A - a]
    X, D = torch.cat(rows), torch.cat(targets)
    d = X.shape[1]
    lam = ridge * float((X ** 2).sum()) / d
    expected = D.T @ X @ torch.linalg.inv(X.T @ X + lam * torch.eye(d, dtype=X.dtype))
    got = patch.maps[0].double()
    assert float((got - expected).abs().max()) <= 1e-8 * float(expected.abs().max())
    # The ridge is doing something: the unregularised solution is far from this one.
    plain = D.T @ torch.linalg.pinv(X.T)
    assert float((plain - expected).abs().max()) > 0.05 * float(expected.abs().max())


# --- claims: verdicts on overlapping intervals ---------------------------------------------------

def test_verdict_is_no_when_the_intervals_overlap():
    control = {"mean": 0.0, "low": -0.1, "high": 0.1}
    # The mean (even the whole upper half) lies above the control, but the interval reaches into it.
    assert verdict_above({"mean": 0.4, "low": 0.05, "high": 0.8}, control) is False
    assert verdict_above({"mean": 0.12, "low": 0.099, "high": 0.2}, control) is False
    assert verdict_above({"mean": 0.1, "low": 0.1, "high": 0.3}, control) is False  # touching is not above
    assert verdict_above({"mean": 0.0, "low": -0.2, "high": 0.2}, control) is False  # containing it
    assert verdict_above({"mean": 0.2, "low": 0.101, "high": 0.3}, control) is True  # just clear of it


# --- logistic fit: the choice of λ ---------------------------------------------------------------

def _pooled_oof_auroc(x, y, folds, lam):
    scores = np.empty(len(y))
    for f in np.unique(folds):
        test = folds == f
        scores[test] = fit_logistic(x[~test], y[~test], lam=lam).decision(x[test])
    return auroc(scores, y)


@pytest.mark.parametrize("n_noise", [2, 40], ids=["few-features", "many-noise-features"])
def test_choose_lambda_picks_the_best_pooled_out_of_fold_auroc(n_noise):
    rng = np.random.default_rng(7)
    n, groups = 90, np.repeat(np.arange(18), 5)
    signal = rng.normal(size=n)
    y = signal + rng.normal(scale=1.0, size=n) > 0
    x = np.column_stack([signal + rng.normal(scale=0.5, size=n), rng.normal(size=(n, n_noise))])
    lambdas = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
    folds = grouped_folds(groups, 4, seed=3)
    aucs = {lam: _pooled_oof_auroc(x, y, folds, lam) for lam in lambdas}
    best = max(aucs.values())
    expected = max(lam for lam, a in aucs.items() if a >= best - 1e-9)  # ties: the larger λ
    assert len({round(a, 9) for a in aucs.values()}) > 1  # λ matters on this data
    assert choose_lambda(x, y, groups, k=4, lambdas=lambdas, seed=3) == expected


def test_choose_lambda_breaks_ties_towards_the_larger_lambda():
    # A constant feature: every λ fits w = 0 and the same intercepts, so every AUROC ties.
    rng = np.random.default_rng(1)
    x = np.ones((40, 1))
    y = rng.random(40) < 0.5
    groups = np.arange(40) % 8
    assert choose_lambda(x, y, groups, k=4, lambdas=(0.01, 0.1, 1.0)) == 1.0
    assert choose_lambda(x, y, groups, k=4, lambdas=(1.0, 0.1, 0.01)) == 1.0


# --- spike scores: the "norm" statistic with unequal layers --------------------------------------

def test_norm_statistic_is_the_robust_z_of_the_whole_patch_norm():
    gen = torch.Generator().manual_seed(0)
    n, window = 40, 8
    norms = torch.stack([1 + torch.rand(n, generator=gen, dtype=torch.float64),          # a small layer
                         20 * torch.rand(n, generator=gen, dtype=torch.float64),         # a large one
                         5 + 3 * torch.rand(n, generator=gen, dtype=torch.float64)])     # a third, unused
    flags = spike_scores_from_norms(norms, window=window, statistic="norm", layers=[0, 1])
    total = np.sqrt((norms[:2].numpy() ** 2).sum(0))  # ‖ΔW‖_F of the selected layers' whole patch
    expected = np.full(n, np.nan)
    for t in range(window, n):
        past = total[t - window:t]
        med = np.median(past)
        expected[t] = (total[t] - med) / (MAD_TO_SIGMA * np.median(np.abs(past - med)))
    np.testing.assert_allclose(flags.scores.numpy(), expected, rtol=1e-12, atol=0, equal_nan=True)
    assert flags.layers == (0, 1)


# --- Trajectory.to_frame: each metric's values under its own name --------------------------------

def test_trajectory_frame_holds_each_metric_under_its_name(load):
    model = load("tiny-gemma3", torch.float64)
    traj = trajectory(model, "ab=1;cd=2;ef=3;ab=1;cd=", query=12, layers=[3, 1])
    frame = traj.to_frame()
    series = {"cumulative_norm": (traj.cumulative_norms(), 0), "correction_norm": (traj.correction_norms(), 0),
              "meta_gradient_norm": (traj.meta_gradient_norms(), 1), "total_alignment": (traj.total_alignment(), 1),
              "consecutive_alignment": (traj.consecutive_alignment(), 2)}
    words = traj.step_tokens()
    for metric, (values, first) in series.items():
        rows = frame[frame.metric == metric]
        for k, layer in enumerate(traj.layers):
            mine = rows[rows.layer == layer].sort_values("step")
            assert mine.step.tolist() == list(range(first, first + values.shape[1])), metric
            assert mine.token.tolist() == [words[s] for s in mine.step], metric
            np.testing.assert_array_equal(mine.value.to_numpy(), values[k].double().numpy(), err_msg=metric)
    # The metrics differ from each other, so a swap of two of them cannot pass.
    per_metric = {m: tuple(np.round(frame[frame.metric == m].value.to_numpy()[:3], 12)) for m in series}
    assert len(set(per_metric.values())) == len(series)


# --- the half-precision noise floor ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_noise_floor_is_the_half_models_own_distance_from_float32(load, dtype):
    half, full = load("tiny-llama", dtype), load("tiny-llama", torch.float32)
    prompt = "In-context learning: the cat sat on the mat."
    ids = encode_prompt(half, prompt)
    with torch.no_grad():
        direct = float((half(ids[None])[0].float() - full(ids[None])[0].float()).abs().max())
    assert noise_floor(half, full, prompt) == pytest.approx(direct, rel=1e-6)
    assert noise_floor(half, full, prompt, chunk_size=4) == pytest.approx(direct, rel=1e-6)
    assert direct > 0
