"""Implicit trajectories W₀..Wₙ: exactness identity per step, agreement with token_patches,
closed-form metrics against dense reconstruction, decay fit, bad input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import icl_lens

from icl_lens import (
    NoContextError,
    PromptError,
    QueryPositionError,
    token_patches,
    trajectory,
    verify_trajectory,
)
from icl_lens.core._power_law import power_law_fit
from icl_lens.model._block_family import block_family

from icl_lens.model._tiny_models import TINY_NAMES

TINY_PROMPT = "ab=1;cd=2;ef=3;ab=1;cd="  # longer than the tiny models' windows of 6


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max().clamp_min(torch.finfo(b.dtype).tiny)
    return float((a - b).abs().max() / scale)


@pytest.mark.parametrize("name", TINY_NAMES)
def test_each_step_reproduces_prefix_forward_float64(load, name):
    model = load(name, torch.float64)
    traj = trajectory(model, TINY_PROMPT)
    n = traj.n_context
    check = verify_trajectory(model, TINY_PROMPT, traj, steps=[0, 1, 2, n // 2, n - 1, n])
    assert check.relative_error <= 1e-9, check.to_frame()
    # Every step genuinely changes something (the identity is not trivially satisfied); a
    # parallel block's patch is zero by definition and its correction carries the context.
    changed = traj.correction[:, -1].norm(dim=-1) if block_family(model).parallel else traj.cumulative_norms()[:, -1]
    assert float(changed.max()) > 1e-3


@pytest.mark.parametrize("name", TINY_NAMES)
def test_last_step_is_the_token_patch(load, name):
    model = load(name, torch.float64)
    traj = trajectory(model, TINY_PROMPT, query=-3)
    patches = token_patches(model, TINY_PROMPT)
    t, n = traj.query, traj.n_context
    assert t == len(patches.tokens) - 3 and traj.context_positions == tuple(range(int(patches.kept_bos), t))
    for field in ("u_in", "u_gate", "v", "correction"):
        mine, theirs = getattr(traj, field), getattr(patches, field)
        if theirs is None:
            assert mine is None
            continue
        assert _rel(mine[:, n], theirs[:, t]) <= 1e-9, field
    # Step 0 keeps {BOS, t}: nothing is removed, so the patch and the correction are zero.
    assert float(traj.u_in[:, 0].abs().max()) == 0.0 and float(traj.correction[:, 0].abs().max()) == 0.0


def test_gemma_float32_steps_are_exact(gemma):
    prompt = "red -> rouge, blue -> bleu, green ->"
    traj = trajectory(gemma, prompt)
    n = traj.n_context
    check = verify_trajectory(gemma, prompt, traj, steps=[1, n // 2, n])
    assert check.relative_error <= 1e-4, check.to_frame()
    patches = token_patches(gemma, prompt)
    assert _rel(traj.stacked_u()[:, n], patches.stacked_u()[:, traj.query]) <= 1e-4
    assert _rel(traj.v[:, n], patches.v[:, traj.query]) <= 1e-4


def test_layer_subset_matches_full(load):
    model = load("tiny-gemma3", torch.float64)
    full = trajectory(model, TINY_PROMPT)
    some = trajectory(model, TINY_PROMPT, layers=[2, -1])
    assert some.layers == (2, 3)
    assert _rel(some.stacked_u(), full.stacked_u()[2:4]) <= 1e-12
    assert _rel(some.v, full.v[2:4]) <= 1e-12


def test_metrics_match_dense_reconstruction(load):
    """Closed forms against explicit d_u × d_model matrices (test only; the library never builds them)."""
    model = load("tiny-llama", torch.float64)
    traj = trajectory(model, TINY_PROMPT)
    U, V = traj.stacked_u(), traj.v
    dense = torch.einsum("lsu,lsd->lsud", U, V)  # W_i − W per layer and step
    grads = dense[:, 1:] - dense[:, :-1]
    total = dense[:, -1] - dense[:, 0]
    flat = grads.flatten(2)
    norms = flat.norm(dim=-1)
    assert _rel(traj.meta_gradient_norms(), norms) <= 1e-10
    assert _rel(traj.cumulative_norms(), (dense - dense[:, :1]).flatten(2).norm(dim=-1)) <= 1e-10
    cons = (flat[:, :-1] * flat[:, 1:]).sum(-1) / (norms[:, :-1] * norms[:, 1:])
    assert torch.allclose(traj.consecutive_alignment(), cons, atol=1e-9)
    tot = (flat * total.flatten(1)[:, None]).sum(-1) / (norms * total.flatten(1).norm(dim=-1)[:, None])
    assert torch.allclose(traj.total_alignment(), tot, atol=1e-9)
    n = traj.n_context
    assert traj.meta_gradient_norms().shape == (3, n)
    assert traj.consecutive_alignment().shape == (3, n - 1)
    assert traj.total_alignment().shape == (3, n)
    assert traj.cumulative_norms().shape == (3, n + 1)


def test_step_metrics_equal_the_separate_methods(load):
    """The dashboard's one-pass metrics (u_gate and u_in summed, never stacked) are the methods' numbers."""
    model = load("tiny-gemma3", torch.float64)
    traj = trajectory(model, TINY_PROMPT)
    metrics = traj.step_metrics()
    assert _rel(metrics.meta_gradient_norms, traj.meta_gradient_norms()) <= 1e-12
    torch.testing.assert_close(metrics.consecutive_alignment, traj.consecutive_alignment(), rtol=0, atol=1e-12)
    torch.testing.assert_close(metrics.fit.exponent, traj.decay_fit().exponent, rtol=1e-10, atol=1e-12, equal_nan=True)
    frame = metrics.to_frame()
    n = traj.n_context
    assert len(frame) == len(traj.layers) * (n + n - 1)
    assert frame[frame.metric == "consecutive_alignment"].step.min() == 2


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-gpt2"])
def test_compact_trajectory_has_the_same_metrics(load, name):
    """compact=True keeps R δ instead of U: every Frobenius metric and the CSV frame are the same, and the
    factors refuse to be applied."""
    model = load(name, torch.float64)
    for order in ("prefix", "absorb"):
        dense = trajectory(model, TINY_PROMPT, order=order)
        compact = trajectory(model, TINY_PROMPT, order=order, compact=True)
        assert compact.compact and compact.u_gate is None and compact.u_in.shape[-1] == model.cfg.d_model
        for metric in ("meta_gradient_norms", "cumulative_norms", "consecutive_alignment", "total_alignment"):
            torch.testing.assert_close(getattr(compact, metric)(), getattr(dense, metric)(), rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(compact.step_metrics().fit.exponent, dense.decay_fit().exponent,
                                   rtol=1e-8, atol=1e-10, equal_nan=True)
        a, b = compact.to_frame(), dense.to_frame()
        assert a[["layer", "step", "metric"]].equals(b[["layer", "step", "metric"]])
        assert np.allclose(a.value, b.value, rtol=1e-9, atol=1e-10)
    with pytest.raises(ValueError, match="compact"):
        compact.stacked_u()
    with pytest.raises(ValueError, match="compact"):
        verify_trajectory(model, TINY_PROMPT, compact)


def test_power_law_fit_recovers_exponent():
    gen = torch.Generator().manual_seed(0)
    b = torch.rand(3, generator=gen, dtype=torch.float64) * 2
    c = torch.rand(3, generator=gen, dtype=torch.float64) + 0.5
    i = torch.arange(1, 21, dtype=torch.float64)
    norms = c[:, None] * i[None] ** (-b[:, None])
    norms[1, 4] = 0.0  # a zero step is left out, not log(0)
    fit = power_law_fit(norms)
    exponent, prefactor, r2, count = fit.exponent, fit.prefactor, fit.r_squared, fit.n_points
    assert torch.allclose(exponent, b, atol=1e-10) and torch.allclose(prefactor, c, atol=1e-10)
    assert torch.allclose(r2, torch.ones(3, dtype=torch.float64), atol=1e-12)
    assert count.tolist() == [20, 19, 20]
    noisy = norms * torch.exp(torch.randn(norms.shape, generator=gen, dtype=torch.float64))
    noisy[1, 4] = 1.0
    r2_noisy = power_law_fit(noisy).r_squared
    assert bool((r2_noisy < 1).all())
    few = power_law_fit(torch.tensor([[1.0, 0.0, 0.0]]))
    assert torch.isnan(few.exponent).all() and few.n_points.tolist() == [1]


def test_frames(load):
    model = load("tiny-gpt2", torch.float64)
    traj = trajectory(model, TINY_PROMPT, query=10)
    frame = traj.to_frame()
    assert list(frame.columns) == ["layer", "step", "token", "metric", "value"]
    n, layers = traj.n_context, len(traj.layers)
    counts = frame.groupby("metric").size().to_dict()
    assert counts == {"cumulative_norm": layers * (n + 1), "correction_norm": layers * (n + 1),
                      "meta_gradient_norm": layers * n, "total_alignment": layers * n,
                      "consecutive_alignment": layers * (n - 1)}
    first = frame[(frame.metric == "meta_gradient_norm") & (frame.step == 1)]
    assert set(first.token) == {traj.tokens[1]}
    fit = traj.decay_fit().to_frame()
    assert list(fit.layer) == list(traj.layers) and (fit.n_points <= n).all()
    assert frame.value.notna().all()


def test_bad_queries(load):
    model = load("tiny-llama", torch.float64)
    with pytest.raises(QueryPositionError):
        trajectory(model, "hello", query=99)
    with pytest.raises(QueryPositionError):
        trajectory(model, "hello", query=-99)
    with pytest.raises(NoContextError):
        trajectory(model, "hello", query=0)
    with pytest.raises(NoContextError):
        trajectory(model, "hello", query=1)  # right after the kept BOS
    with pytest.raises(PromptError):
        trajectory(model, "x" * (int(model.cfg.n_ctx) + 5))
    with pytest.raises(ValueError):
        trajectory(model, "hello", layers=[7])
    assert issubclass(QueryPositionError, ValueError) and issubclass(NoContextError, ValueError)


@pytest.mark.parametrize("name", ("tiny-gpt2", "tiny-gemma3", "tiny-mistral"))
def test_batched_equals_naive_prefix_forwards(load, name):
    from icl_lens.dynamics._trajectory_capture import trajectory_naive

    model = load(name, torch.float64)
    fast, slow = trajectory(model, TINY_PROMPT, query=14), trajectory_naive(model, TINY_PROMPT, query=14)
    assert _rel(fast.stacked_u(), slow.stacked_u()) <= 1e-9
    assert _rel(fast.v, slow.v) <= 1e-9 and _rel(fast.correction, slow.correction) <= 1e-9


def test_prompt_without_bos_starts_context_at_zero(load):
    model = load("tiny-llama", torch.float64)
    ids = model.to_tokens(TINY_PROMPT)[0][1:]  # drop the BOS: nothing is kept but the query
    traj = trajectory(model, ids)
    assert not traj.kept_bos and traj.context_positions == tuple(range(ids.numel() - 1))
    assert verify_trajectory(model, ids, traj, steps=[0, 1, traj.n_context]).relative_error <= 1e-9
    with pytest.raises(NoContextError):
        trajectory(model, ids, query=0)


@pytest.mark.parametrize("name", TINY_NAMES)
def test_absorb_order_identity_and_shared_endpoint_float64(load, name):
    """The paper's order: [BOS, c_{i+1}..cₙ, x_t] with Wᵢ (kept tokens patched likewise) gives the
    full-context logits; both orders start at 0 and end at the same token patch."""
    model = load(name, torch.float64)
    prefix = trajectory(model, TINY_PROMPT)
    absorb = trajectory(model, TINY_PROMPT, order="absorb")
    n = absorb.n_context
    assert absorb.order == "absorb" and prefix.order == "prefix" and n == prefix.n_context
    check = verify_trajectory(model, TINY_PROMPT, absorb, steps=[0, 1, n // 2, n - 1, n])
    assert check.relative_error <= 1e-9, check.to_frame()
    for field in ("u_in", "u_gate", "v", "correction"):
        a, p = getattr(absorb, field), getattr(prefix, field)
        if a is None:
            assert p is None
            continue
        assert _rel(a[:, n], p[:, n]) <= 1e-9, field
    assert float(absorb.u_in[:, 0].abs().max()) == 0.0 and float(absorb.correction[:, 0].abs().max()) == 0.0
    # The orders differ in between (otherwise the test above could not tell them apart). Not at
    # every step: with a sliding window c₁ may be out of the query's sight, and a parallel block's
    # W_in patch is zero (the whole effect is the correction), so compare all intermediate steps.
    mid = slice(1, n)
    both = lambda t: torch.cat([t.u_in[:, mid].flatten(), t.correction[:, mid].flatten()])  # noqa: E731
    assert _rel(both(absorb), both(prefix)) > 1e-3
    # Wrong patches break the identity: the prefix-order steps do not satisfy the absorb identity.
    from dataclasses import replace
    wrong = replace(absorb, u_in=prefix.u_in, v=prefix.v, u_gate=prefix.u_gate, correction=prefix.correction)
    assert verify_trajectory(model, TINY_PROMPT, wrong, steps=list(range(1, n))).relative_error > 1e-3


def test_absorb_step_is_the_token_patch_of_its_kept_set(load):
    model = load("tiny-llama", torch.float64)
    absorb = trajectory(model, TINY_PROMPT, order="absorb", query=-2)
    t, b = absorb.query, 1
    for i in (1, 4, absorb.n_context):
        patches = token_patches(model, model.to_tokens(TINY_PROMPT)[0][: t + 1], remove=range(b, b + i))
        assert patches.kept_positions(t) == [0] + list(range(b + i, t + 1))
        for field in ("u_in", "u_gate", "v", "correction"):
            assert _rel(getattr(absorb, field)[:, i], getattr(patches, field)[:, t]) <= 1e-12, (field, i)


def test_gemma_float32_absorb_steps_are_exact(gemma):
    prompt = "red -> rouge, blue -> bleu, green ->"
    traj = trajectory(gemma, prompt, order="absorb")
    n = traj.n_context
    check = verify_trajectory(gemma, prompt, traj, steps=[1, n // 2, n])
    assert check.relative_error <= 1e-4, check.to_frame()


def test_unknown_order_fails_fast(load):
    with pytest.raises(ValueError, match="order"):
        trajectory(load("tiny-gpt2", torch.float64), TINY_PROMPT, order="suffix")


def test_dynamics_imports_only_core_and_model():
    """The dynamics folder is a feature: it may import the math core and the model side, no other feature
    or front end; and neither core nor model imports it."""
    import ast
    import pathlib

    import icl_lens

    package = pathlib.Path(icl_lens.__file__).parent

    def modules(path):
        nodes = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
        return [name for n in nodes for name in ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""])]

    forbidden = tuple(f"icl_lens.{m}" for m in ("thought", "lab", "sweep", "ui", "cli", "evals"))
    for path in (package / "dynamics").rglob("*.py"):
        assert not [m for m in modules(path) if m.startswith(forbidden)], path.name
    for layer in ("core", "model"):
        for path in (package / layer).rglob("*.py"):
            assert not [m for m in modules(path) if m.startswith("icl_lens.dynamics")], path.name


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-llama"])
@pytest.mark.parametrize("order", ["prefix", "absorb"])
def test_coarse_trajectory_equals_the_full_one_at_its_steps_float64(load, name, order):
    """Issue 41: the coarse trajectory (a few log-spaced prefix lengths) holds exactly the full trajectory's
    W_i at those lengths, and its step metrics are the full ones at the context lengths it draws."""
    from icl_lens.dynamics._prefix_variants import log_spaced_steps

    model = load(name, torch.float64)
    text = "The cat sat on the mat and then the dog came over to sit near the cat by the warm fire again"
    full = icl_lens.trajectory(model, text, order=order)
    steps = log_spaced_steps(full.n_context, 5)
    assert steps[0] == 0 and steps[-1] == full.n_context and len(steps) < full.n_context + 1
    coarse = icl_lens.trajectory(model, text, order=order, steps=steps)
    assert coarse.coarse and coarse.step_lengths == steps
    cols = list(steps)
    for field in ("u_in", "u_gate", "v", "correction"):
        if getattr(full, field) is not None:
            assert _rel(getattr(coarse, field), getattr(full, field)[:, cols]) <= 1e-10, field
    mc, mf = coarse.step_metrics(), full.step_metrics()
    assert mc.norm_steps and set(mc.norm_steps) <= set(steps) and mc.alignment_steps
    assert _rel(mc.meta_gradient_norms, mf.meta_gradient_norms[:, [i - 1 for i in mc.norm_steps]]) <= 1e-9
    assert _rel(mc.consecutive_alignment, mf.consecutive_alignment[:, [i - 2 for i in mc.alignment_steps]]) <= 1e-9
    assert _rel(coarse.cumulative_norms(), full.cumulative_norms()[:, cols]) <= 1e-9
    frame = coarse.to_frame()
    assert set(frame["step"]) == set(steps)
    with pytest.raises(ValueError, match="coarse"):
        coarse.meta_gradient_norms()
    with pytest.raises(ValueError, match="increasing"):
        icl_lens.trajectory(model, text, order=order, steps=(0, 3, 2))
    # every step given: the full trajectory
    assert not icl_lens.trajectory(model, text, order=order, steps=range(full.n_context + 1)).coarse


@pytest.mark.parametrize("order", ["prefix", "absorb"])
def test_coarse_joined_with_the_other_steps_is_the_full_trajectory_float64(load, order):
    """Issue 41: the dashboard refines a coarse trajectory by computing only the steps it lacks and joining them;
    the join, in either order of the parts, is the full trajectory (every step in place), and parts of different
    queries or holding a step twice are refused."""
    from icl_lens.dynamics._prefix_variants import log_spaced_steps

    model = load("tiny-gemma3", torch.float64)
    text = "The cat sat on the mat and then the dog came over to sit near the cat by the warm fire again"
    full = icl_lens.trajectory(model, text, order=order, compact=True)
    steps = log_spaced_steps(full.n_context, 5)
    rest = tuple(i for i in range(full.n_context + 1) if i not in steps)
    coarse = icl_lens.trajectory(model, text, order=order, steps=steps, compact=True)
    other = icl_lens.trajectory(model, text, order=order, steps=rest, compact=True)
    for joined in (coarse.joined(other), other.joined(coarse)):
        assert not joined.coarse and joined.step_lengths == full.step_lengths
        for field in ("u_in", "v", "correction"):
            assert _rel(getattr(joined, field), getattr(full, field)) <= 1e-10, field
        assert _rel(joined.meta_gradient_norms(), full.meta_gradient_norms()) <= 1e-9
    part = coarse.joined(icl_lens.trajectory(model, text, order=order, steps=rest[:3], compact=True))
    assert part.coarse and part.step_lengths == tuple(sorted(steps + rest[:3]))
    with pytest.raises(ValueError, match="both trajectories hold steps"):
        coarse.joined(coarse)
    with pytest.raises(ValueError, match="differ in query"):
        coarse.joined(icl_lens.trajectory(model, text, query=-2, order=order, steps=(1,), compact=True))


def _readout_cases(model, text):
    """(trajectory with readout, the unpatched kept-only forward's logits of its query) for a full and a coarse
    trajectory, each without and with a PatchSession's keys and values."""
    from icl_lens.dynamics._prefix_variants import log_spaced_steps
    from icl_lens.patches._kept_only import kept_only_logits_many

    ids = model.to_tokens(text)[0]
    q = ids.numel() - 1
    patches = token_patches(model, ids)
    expected = kept_only_logits_many(model, [(ids, patches.keep_parts(w_in=False, correction=False), q)])[0]
    session = icl_lens.PatchSession(model, logits="lazy")
    session.update(ids)
    n = trajectory(model, ids, compact=True).n_context
    for steps in (None, log_spaced_steps(n, 4)):
        for s in (None, session):
            yield trajectory(model, ids, compact=True, steps=steps, session=s, readout=True), expected


@pytest.mark.parametrize("name", TINY_NAMES)
def test_readout_is_the_unpatched_kept_only_forward_float64(load, name):
    """Issue 41: ``readout=True`` keeps the step-0 copy's input to the unembedding, and through the unembedding it
    gives the unpatched kept-only forward's logits (the dashboard's "without context" predictions take them from
    the trajectory instead of a forward of their own), full or coarse, with or without a session's keys and
    values; the patches are the same as without readout; a join keeps it; where step 0 is not computed (or the
    absorb order, whose step 0 is the full context) readout is refused."""
    from icl_lens.model._greedy import unembedded

    model = load(name, torch.float64)
    for traj, expected in _readout_cases(model, TINY_PROMPT):
        got = unembedded(model, traj.kept_only_hidden[None])[0]
        assert _rel(got, expected) <= 1e-10, traj.steps
    plain = trajectory(model, TINY_PROMPT, compact=True)
    assert plain.kept_only_hidden is None
    assert _rel(traj.u_in, plain.u_in[:, list(traj.steps)]) <= 1e-12
    rest = tuple(i for i in range(plain.n_context + 1) if i not in traj.steps)
    joined = trajectory(model, TINY_PROMPT, compact=True, steps=rest).joined(traj)
    assert not joined.coarse and joined.kept_only_hidden is traj.kept_only_hidden
    with pytest.raises(ValueError, match="step 0"):
        trajectory(model, TINY_PROMPT, steps=rest, readout=True)
    with pytest.raises(ValueError, match="prefix order"):
        trajectory(model, TINY_PROMPT, order="absorb", readout=True)


def test_gemma_float32_readout_is_the_kept_only_forward(gemma):
    from icl_lens.model._greedy import unembedded

    for traj, expected in _readout_cases(gemma, "red -> rouge, blue -> bleu, green -> vert, white ->"):
        assert _rel(unembedded(gemma, traj.kept_only_hidden[None])[0], expected) <= 1e-4, traj.steps
