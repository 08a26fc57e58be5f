"""Verdicts over seeds: the seed cache, the two-stage bootstrap, the exact split of a per-step cosine, the capacity
fit of W_in, the convergence drift, and the reading sentences that flip when their numbers do."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from experiments import finetune_alignment as fa
from icl_lens.dynamics._sgd_alignment import step_sides, trajectory_sgd_cosines
from icl_lens.lab import seeds
from icl_lens.lab._checkpoints import RECIPES
from icl_lens.lab.experiments._capacity import _predict, ridge_w_in
from icl_lens.lab.experiments._convergence import convergence_by_architecture
from icl_lens.lab._tasks import sample_prompts
from icl_lens.stats._bootstrap import MeanCI, bootstrap_mean, bootstrap_mean_nested

pytestmark = pytest.mark.usefixtures("one_thread")


def test_step_sides_multiply_to_the_per_step_cosine():
    g = torch.Generator().manual_seed(0)
    iu, iv = torch.randn(3, 6, 5, generator=g, dtype=torch.float64), torch.randn(3, 6, 4, generator=g, dtype=torch.float64)
    eu, ev = torch.randn(3, 5, 5, generator=g, dtype=torch.float64), torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    _, step = trajectory_sgd_cosines(iu, iv, eu[..., None, :], ev[..., None, :])
    out, share = step_sides(iu, iv, eu, ev)
    assert torch.allclose(out * share, step, atol=1e-12)
    assert ((share >= 0) & (share <= 1 + 1e-12)).all()
    # a rank-1 implicit step (fixed row factor, as in the prefix order of one block): share = |cos(v, a)|
    iv1 = iv[:, :1].expand_as(iv).clone()
    _, share1 = step_sides(iu, iv1, eu, ev)
    expected = torch.nn.functional.cosine_similarity(iv1[:, 1:], ev, dim=-1).abs()
    assert torch.allclose(share1, expected, atol=1e-12)
    with pytest.raises(ValueError, match="n \\+ 1 and n"):
        step_sides(iu, iv, eu[:, :4], ev[:, :4])


def test_nested_bootstrap_resamples_seeds_then_prompts():
    rng = np.random.default_rng(0)
    one = rng.normal(size=50)
    assert bootstrap_mean_nested([one]) == bootstrap_mean(one)
    groups = [rng.normal(loc=m, scale=0.1, size=40) for m in (0.0, 1.0, 2.0)]
    nested, pooled = bootstrap_mean_nested(groups), bootstrap_mean(np.concatenate(groups))
    assert nested.n == 3 and abs(nested.mean - 1.0) < 0.05
    # seed-to-seed spread is part of the interval: far wider than treating 120 prompts as independent
    assert nested.high - nested.low > 5 * (pooled.high - pooled.low)
    with pytest.raises(ValueError):
        bootstrap_mean_nested([])
    with pytest.raises(ValueError):
        bootstrap_mean_nested([[1.0], [np.nan]])


def test_seed_cache_trains_once_and_keys_on_config_and_seed(tmp_path, monkeypatch):
    name = "sb_task"
    assert seeds.cache_key(name, 1) != seeds.cache_key(name, 2)
    assert seeds.cache_key(name, 1) != seeds.cache_key("sb_embed", 1)
    monkeypatch.setitem(RECIPES, name, {"steps": 3, "lr": 1e-2})
    key = seeds.cache_key(name, 1)
    monkeypatch.setitem(RECIPES, name, {"steps": 2, "lr": 1e-2})
    assert seeds.cache_key(name, 1) != key  # a changed recipe never reads a stale file
    with pytest.raises(FileNotFoundError, match="python -m icl_lens.lab.seeds"):
        seeds.seed_model(name, 1, cache_dir=tmp_path, train_missing=False)
    model, record = seeds.seed_model(name, 1, cache_dir=tmp_path)
    assert record["steps"] == 2 and record["seed"] == 1 and seeds.is_cached(name, 1, tmp_path)
    again, record2 = seeds.seed_model(name, 1, cache_dir=tmp_path, train_missing=False)
    assert record2 == record
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    # seed 0 of a shipped model is its shipped checkpoint
    assert seeds.is_cached("one_block", 0, tmp_path) and not seeds.is_cached("one_block", 7, tmp_path)


def test_ridge_fit_of_w_in_lowers_the_error_on_the_pairs():
    model, _ = seeds.seed_model("one_block", 0, train_missing=False)
    cfg = model.cfg
    p = sample_prompts(3, 8, cfg.d_x, generator=torch.Generator().manual_seed(3), query_flag=cfg.query_flag)
    xs, ys = p.context_pairs()
    none = torch.zeros(3, cfg.n_layers, 0, cfg.d_mlp)
    before = ((_predict(model, xs, none, none[..., : cfg.d_model]) - ys) ** 2).mean(-1)
    U, V = ridge_w_in(model, xs, ys, ridge=1e-2, iterations=2)
    after = ((_predict(model, xs, U, V) - ys) ** 2).mean(-1)
    assert (after < 0.5 * before).all(), (before, after)
    with pytest.raises(ValueError, match="ridge > 0"):
        ridge_w_in(model, xs, ys, ridge=0.0)


def test_drift_is_the_distance_of_the_implicit_weights_and_the_tail_sum_bounds_it():
    conv = convergence_by_architecture(("softmax",), n_prompts=2, n_max=24, seeds=(0, 99))  # seed 99: not cached
    assert conv.seeds("softmax") == (0,)
    d = conv.distances["softmax"]
    steps = torch.diagonal(d[:, 1:, :-1], dim1=1, dim2=2)
    assert torch.allclose(steps, conv.total_norms("softmax"), rtol=1e-3, atol=1e-5)
    drift, tail = conv.drift("softmax", 16), conv.tail_sum("softmax", 16)
    assert (drift > 0).all() and (drift <= tail * (1 + 1e-4)).all()
    manual = max(float(d[0, 20, 16]), float(d[0, 24, 16])) / float(d[0, 16, 0])
    assert float(conv.drift("softmax", 16)[0]) >= manual - 1e-6
    with pytest.raises(ValueError):
        conv.drift("softmax", 24)


def _ci(mean, half=0.02):
    return MeanCI(mean, mean - half, mean + half, 3)


def test_range_sentence_states_the_range_and_flips_with_the_numbers():
    zero = _ci(0.0)
    text = fa.range_sentence([("a absorb step", _ci(0.6), zero), ("a prefix step", _ci(0.3), zero),
                              ("b absorb step", _ci(0.01), zero)])
    assert "ranges from +0.010 (b absorb step) to +0.600 (a absorb step)" in text
    assert "*holds* for 1 (a absorb step); *weak* for 1 (a prefix step); *no* for 1 (b absorb step)" in text
    flipped = fa.range_sentence([("a absorb step", _ci(0.2), zero), ("a prefix step", _ci(0.3), zero)])
    assert "*weak* for 2" in flipped and "holds" not in flipped


def test_capacity_sentence_follows_the_fit():
    cap = {"W0": {"mean": 1.0, "train_mse": 1.2}, "in context": {"mean": 0.2}, "SGD one pass": {"mean": 0.95},
           "SGD small steps": {"mean": 0.9}, "ridge least squares": {"mean": 0.5, "train_mse": 0.1}}
    text = fa.capacity_sentence("m", cap)
    assert "one-pass SGD does not lower it (0.950)" in text and "ridge least-squares fit of W_in lowers it (0.500" in text
    assert "pairs 1.200 → 0.100" in text
    cap["ridge least squares"]["mean"] = 0.85
    assert "ridge least-squares fit of W_in does not lower it (0.850" in fa.capacity_sentence("m", cap)


class _Table:
    def __init__(self, means):
        self.means = means

    def ci(self, key):
        return _ci(self.means.get(key, 0.0))


def test_ablation_sentence_names_the_factor_that_moves_the_cosine():
    key = "sgd:absorb:step"
    tables = {"single_block": _Table({key: 0.4}), "sb_no_attn_bias": _Table({key: 0.41}),
              "sb_wide": _Table({key: 0.05}), "one_block": _Table({key: 0.06})}
    text = fa.ablation_sentence(tables)
    assert "furthest from the single block is sb_wide (-0.350)" in text
    assert "disjoint from the single block's: sb_wide, one_block." in text
    tables["sb_no_attn_bias"] = _Table({key: -0.2})
    assert "furthest from the single block is sb_no_attn_bias (-0.600)" in fa.ablation_sentence(tables)
    assert fa.ablation_sentence({"softmax": _Table({})}) is None


def test_function_space_sentence_names_only_models_whose_changes_follow_the_residual():
    def entry(ctx, ft):
        return {"same_prompt": {"mean": 0.8}, "control": {"mean": 0.0}, "context_vs_residual": {"mean": ctx},
                "finetuned_vs_residual": {"mean": ft}}

    text = fa.function_space_sentence({"a": entry(0.95, 0.9), "b": entry(0.95, 0.1)})
    assert "for a: there a high function-space cosine" in text and "b +0.80 (control +0.00" in text
    assert "For no model" in fa.function_space_sentence({"b": entry(0.95, 0.1)})


def test_seed_cache_lives_with_the_models_cache(tmp_path, monkeypatch):
    """Trained seeds go under ``$ICL_LENS_CACHE/lab`` like the dequantised models, never beside the installed
    package; the file name (and the key in it) stays ``<name>-s<seed>-<key>.pt``."""
    monkeypatch.setenv("ICL_LENS_CACHE", str(tmp_path / "cache"))
    path = seeds.cache_path("sb_embed", 2)
    assert path == tmp_path / "cache" / "lab" / f"sb_embed-s2-{seeds.cache_key('sb_embed', 2)}.pt"
    assert seeds.cache_path("sb_embed", 2, tmp_path / "own").parent == tmp_path / "own"
