"""Verdicts over seeds: the seed cache (oriented initialisation included), the rules of experiments.lab_rules, the
exact split of a per-step cosine, the capacity fit of W_in, the convergence drift and its trend, the mirror solutions,
and the reading sentences that flip when their numbers do."""
from __future__ import annotations

import pytest
import torch

from experiments import finetune_alignment as fa
from icl_lens.dynamics._sgd_alignment import step_sides, trajectory_sgd_cosines
from icl_lens.lab import seeds
from icl_lens.lab._checkpoints import RECIPES
from icl_lens.lab.experiments._capacity import _predict, ridge_w_in
from icl_lens.lab.experiments._convergence import convergence_by_architecture
from icl_lens.lab._regression_dynamics import implicit_trajectory
from icl_lens.lab._tasks import sample_prompts

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


def test_drift_is_the_distance_of_the_whole_implicit_update_and_the_tail_sum_bounds_it():
    conv = convergence_by_architecture(("softmax",), n_prompts=2, n_max=24, seeds=(0, 99))  # seed 99: not cached
    assert conv.seeds("softmax") == (0,)
    d = conv.distances["softmax"]
    # the whole update: W_in patches AND the skip corrections (a Pre-LN model carries most of the effect in them)
    model, _ = seeds.seed_model("softmax", 0, train_missing=False)
    p = sample_prompts(2, 24, 4, generator=torch.Generator().manual_seed(2))
    traj = implicit_trajectory(model, p.tokens[0, :-1], p.tokens[0, -1])
    w_in = traj.cumulative_norms().double().pow(2).sum(0).sqrt()  # ‖P(i)‖ of the W_in patches alone
    whole = (w_in.pow(2) + traj.correction.double().pow(2).sum((0, -1))).sqrt()
    assert torch.allclose(d[0, :, 0].double(), whole, rtol=1e-4, atol=1e-6)
    assert (whole[1:] > 1.5 * w_in[1:]).all()  # the corrections are most of it here
    steps = conv.whole_steps("softmax")
    drift, tail = conv.drift("softmax", 16), conv.tail_sum("softmax", 16)
    assert (drift > 0).all() and (drift <= tail * (1 + 1e-4)).all()
    manual = max(float(d[0, 20, 16]), float(d[0, 24, 16])) / float(d[0, 16, 0])
    assert float(conv.drift("softmax", 16)[0]) >= manual - 1e-6
    assert torch.allclose(steps[:, 0], d[:, 1, 0].double())
    with pytest.raises(ValueError):
        conv.drift("softmax", 24)


def test_trend_is_the_slope_of_log_drift_inside_the_trained_length():
    conv = convergence_by_architecture(("gru",), n_prompts=3, n_max=16, seeds=(0,))
    assert conv.trend_ns() == (2, 4, 8)  # 2n ≤ 16 trained pairs
    ns, log_drift, slope = conv.trend("gru")
    manual = torch.stack([conv.drift("gru", n, 2 * n).log().mean() for n in ns])
    assert torch.allclose(log_drift[0], manual)
    x = torch.log(torch.tensor(ns, dtype=torch.float64))
    fit = torch.linalg.lstsq(torch.stack([x, torch.ones_like(x)], 1), manual[:, None]).solution[0, 0]
    assert abs(float(slope[0]) - float(fit)) < 1e-9
    short = convergence_by_architecture(("gru",), n_prompts=2, n_max=6, seeds=(0,))
    with pytest.raises(ValueError, match="two doublings"):
        short.trend("gru")


def test_mirror_solutions_and_the_oriented_initialisation():
    """The shipped single block attends to similar inputs (ρ > 0, readout > 0); an initialisation whose head prefers
    opposite inputs is oriented by negating its query projection, which negates its scores and nothing else."""
    from icl_lens import lab as mirror  # the face exports the mirror diagnostics
    from icl_lens.lab import LAB_MODELS
    from icl_lens.lab._model import build_model

    model, record = seeds.seed_model("single_block", 0, train_missing=False)
    assert float(mirror.similarity_preference(model)[0]) > 0.9
    rho, task = mirror.label_response(model)
    assert float(rho.mean()) > 0.5 and task > 0.5 and float(mirror.readout_slope(model).mean()) > 0
    # ρ is Σⱼ ∂ŷ_q/∂yⱼ: a finite difference of every context label agrees
    p = mirror.probe_prompts(model, 8)
    shifted = p.tokens.clone()
    shifted[:, :-1, 2] += 1e-3
    with torch.no_grad():
        fd = (model(shifted)[:, -1] - model(p.tokens)[:, -1]) / 1e-3
    assert torch.allclose(mirror.label_response(model, p)[0], fd, atol=2e-2)
    cfg = LAB_MODELS["single_block"]
    untrained = next(build_model(cfg, seed=s) for s in range(20)
                     if float(mirror.similarity_preference(build_model(cfg, seed=s))[0]) < -0.2)
    before = mirror.similarity_preference(untrained)
    q = mirror.probe_prompts(untrained, 4)
    with torch.no_grad():
        out_before = untrained(q.tokens)
    flipped = mirror.orient_attention(untrained)
    assert flipped.tolist() == [True]
    assert torch.allclose(mirror.similarity_preference(untrained), -before, atol=1e-6)
    with torch.no_grad():
        assert torch.allclose(untrained(q.tokens)[:, 0], out_before[:, 0], atol=1e-6)  # position 0 sees only itself
    assert not mirror.orient_attention(untrained).any()  # already oriented: nothing flips
    with pytest.raises(ValueError, match="softmax"):
        mirror.similarity_preference(seeds.seed_model("gru", 0, train_missing=False)[0])


def test_solution_signs_of_the_shipped_single_block():
    from icl_lens.lab.experiments import population, solution_signs

    model, record = seeds.seed_model("single_block", 0, train_missing=False)
    s = solution_signs("single_block", 0, model, record)
    assert s.population == "similar" and s.preference[0] > 0.9 and s.preference_init[0] > 0
    assert s.sgd_uniform_share > 0.9  # an SGD step on W_in shifts every context-free prediction alike
    assert s.readout_slope > 0 and s.task_slope > 0.5 and s.in_context_mse == record["eval_loss_n_train"]
    assert population([-0.3]) == "unselective" and population([0.2, -0.7]) == "opposite" and len(s.to_frame()) == 1
    with pytest.raises(ValueError, match="softmax"):
        solution_signs("gru", 0, *seeds.seed_model("gru", 0, train_missing=False))


def test_oriented_training_starts_every_head_on_the_similar_side(tmp_path, monkeypatch):
    from icl_lens import lab as mirror
    from icl_lens.lab._checkpoints import RECIPES

    monkeypatch.setitem(RECIPES, "sb_oriented", {"steps": 2, "lr": 1e-2, "orient": True})
    monkeypatch.setitem(RECIPES, "single_block", {"steps": 2, "lr": 1e-2})
    key = seeds.cache_key("sb_oriented", 9)
    assert key != seeds.cache_key("single_block", 9)  # same configuration, the recipe's orientation differs
    oriented, record = seeds.seed_model("sb_oriented", 9, cache_dir=tmp_path)
    assert record["oriented_heads"] == [True]  # seed 9 starts on the opposite side (issue 39)
    plain, record_plain = seeds.seed_model("single_block", 9, cache_dir=tmp_path)
    assert "oriented_heads" not in record_plain
    assert float(mirror.similarity_preference(oriented)[0]) > 0 > float(mirror.similarity_preference(plain)[0])


def test_end_of_context_cosine_is_both_orders_last_step():
    from icl_lens.lab.experiments import implicit_vs_explicit

    r = implicit_vs_explicit("single_block", n_prompts=3, lr=1e-2)
    end = r.cosines["sgd:end:cumulative"]
    assert end.shape[-1] == 1
    for order in ("absorb", "prefix"):
        assert torch.allclose(end[..., 0], r.cosines[f"sgd:{order}:cumulative"][..., -1], atol=1e-6)
    assert torch.allclose(r.cosines["full_batch:end:cumulative"][..., 0], r.cosines["small_lr:prefix:cumulative"][..., -1],
                          atol=1e-6)
    assert {"control:end:cumulative", "full_batch_control:end:cumulative"} <= set(r.cosines)


def test_cell_verdicts_follow_the_seed_level_intervals():
    from experiments import lab_rules as rules

    zero = [0.01, -0.01, 0.0, 0.02, -0.02]
    assert rules.cell_verdict([0.6, 0.7, 0.65, 0.62, 0.68], zero) == "holds"
    assert rules.cell_verdict([0.2, 0.3, 0.25, 0.22, 0.28], zero) == "weak"
    assert rules.cell_verdict([0.05, 0.06, 0.055, 0.052, 0.058], zero) == "negligible"
    assert rules.cell_verdict([-0.4, -0.5, -0.45, -0.42, -0.48], zero) == "reversed"
    # two mirror populations: a positive mean that no seed-level interval supports
    assert rules.cell_verdict([0.6, 0.65, 0.62, -0.5, -0.45], zero) == "no"
    # above 0 but not above a control that is as high
    assert rules.cell_verdict([0.2, 0.3, 0.25, 0.22, 0.28], [0.2, 0.3, 0.25, 0.22, 0.28]) == "no"
    assert rules.cell_verdict([0.6], [0.0]) == "one seed"
    s = rules.cell_summary([0.6, -0.5, 0.62], [0.0, 0.1, -0.1])
    assert s["signs"] == "+−+" and s["seeds"] == 3 and s["interval"]["n"] == 3 and abs(s["control_mean"]) < 1e-12
    with pytest.raises(ValueError, match="one control value per seed"):
        rules.cell_verdict([0.1, 0.2], [0.0])


def test_claim_wording_names_the_cells_and_notes_multiplicity():
    from experiments import lab_rules as rules

    good = ([0.6, 0.7, 0.65, 0.62, 0.68, 0.66], [0.0] * 6)
    null = ([0.05, -0.04, 0.02, -0.03, 0.01, -0.02], [0.0] * 6)
    barely = ([0.25, 0.05, 0.2, 0.08, 0.3, 0.12], [0.0] * 6)  # aligned at 95%, not at the Bonferroni level of 8
    cells = {("a", "prefix", "step"): good, **{("b", o, "step"): null for o in ("absorb", "prefix")}}
    w = rules.claim_wording(cells)
    assert w["verdict"] == "reproduced only in" and w["aligned"] == [["a", "prefix", "step"]]
    assert "reproduced only in a (prefix step): 1 of 3 cells aligned at 95% each" in w["sentence"]
    assert "multiplicity" not in w["sentence"]  # 1 of 3 is more than a quarter
    many = {**cells, **{("c", o, k): null for o in ("absorb", "prefix") for k in ("step", "cumulative")},
            ("d", "end", "cumulative"): barely}
    w = rules.claim_wording(many)
    assert w["m"] == 8 and abs(w["family_level"] - (1 - 0.05 / 8)) < 1e-12
    assert "2 of 8 cells aligned at 95% each" in w["sentence"] and "1 remain: a (prefix step)" in w["sentence"]
    assert "(multiplicity: the verdict rests on 2 of 8 cells)" in w["sentence"]
    assert rules.claim_wording({("a", "prefix", "step"): good})["verdict"] == "reproduced"
    assert rules.claim_wording({("b", "prefix", "step"): null})["verdict"] == "not reproduced"
    assert rules.claim_wording({("a", "prefix", "step"): ([0.6], [0.0])})["verdict"] == "undecided"


def test_factor_and_trend_rules():
    from experiments import lab_rules as rules

    base = [0.6, 0.62, 0.64, 0.58, 0.61]
    assert rules.factor_verdict([0.01, 0.02, 0.0, 0.015, 0.01], base)["verdict"] == "lowers"
    assert rules.factor_verdict([0.9, 0.92, 0.88, 0.91, 0.9], base)["verdict"] == "raises"
    assert rules.factor_verdict([0.5, 0.7, 0.65, 0.55, 0.6], base)["verdict"] == "no change detected"
    assert rules.trend_verdict([-0.5, -0.55, -0.48, -0.52])["verdict"] == "converges"
    assert rules.trend_verdict([0.0, 0.05, -0.05, 0.02])["verdict"] == "does not converge"
    assert rules.trend_verdict([-0.3, -0.5, -0.6, -0.2])["verdict"] == "undecided"
    assert rules.trend_verdict([-0.2, -0.9, -0.5, -0.6])["verdict"] == "undecided"  # mean −0.55: the interval decides
    softmax, gru = [-0.5, -0.55, -0.48, -0.52], [0.0, 0.05, -0.05, 0.02]
    assert rules.settling_claim({"softmax": softmax, "gru": gru})["verdict"] == "reproduced"
    partly = rules.settling_claim({"softmax": [-0.3, -0.28, -0.32, -0.3], "gru": gru})
    assert partly["verdict"] == "partly" and partly["softmax"]["verdict"] == "does not converge"
    assert rules.settling_claim({"softmax": gru, "gru": softmax})["verdict"] == "not"
    assert rules.settling_claim({"softmax": softmax})["verdict"] == "not tested"


def test_capacity_sentence_follows_the_fit():
    cap = {"W0": {"mean": 1.0, "train_mse": 1.2}, "in context": {"mean": 0.2}, "SGD one pass": {"mean": 0.95},
           "SGD small steps": {"mean": 0.9}, "ridge least squares": {"mean": 0.5, "train_mse": 0.1}}
    text = fa.capacity_sentence("m", cap)
    assert "one-pass SGD does not lower it (0.950)" in text and "ridge least-squares fit of W_in lowers it (0.500" in text
    assert "pairs 1.200 → 0.100" in text
    cap["ridge least squares"]["mean"] = 0.85
    assert "ridge least-squares fit of W_in does not lower it (0.850" in fa.capacity_sentence("m", cap)


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


def test_results_cache_keeps_each_model_seed_measurement(tmp_path):
    """A rerun reuses a (model, seed) measurement when nothing it depends on changed, and measures again when the
    settings or the library code it depends on change."""
    first = fa.run_lab(["single_block"], 2, 4, False, seeds=(0,), full=(), results_cache=tmp_path)
    files = list(tmp_path.glob("single_block-s0-*.pt"))
    assert len(files) == 1 and first["single_block"]["runs"][0]["cpu_seconds"] > 0
    again = fa.run_lab(["single_block"], 2, 4, False, seeds=(0,), full=(), results_cache=tmp_path)
    a, b = first["single_block"]["runs"][0]["align"], again["single_block"]["runs"][0]["align"]
    assert all(torch.equal(a.cosines[k], b.cosines[k]) for k in a.cosines)
    fa.run_lab(["single_block"], 3, 4, False, seeds=(0,), full=(), results_cache=tmp_path)  # other settings
    assert len(list(tmp_path.glob("single_block-s0-*.pt"))) == 2
    record = first["single_block"]["runs"][0]["record"]
    changed = fa._source_hash(fa.RESULT_SOURCES[:-1])  # as if the library code had changed
    assert fa.result_key("single_block", 0, record, {"prompts": 2}, changed) != fa.result_key("single_block", 0, record,
                                                                                               {"prompts": 2})
