"""Leave-one-kind-out, the shipping rule and the within-stratum flag rates (issue 37), on planted signals.

Each rule is tested against the fault it guards: a split that lets the left-out kind into the
fit, a shipping rule that looks only at the patch detectors, flag rates pooled over kinds.
"""
from __future__ import annotations

import numpy as np
import pytest

from experiments.factual_prompts import same_answer
from experiments.spikes import loko as loko_module
from experiments.spikes.loko import Candidate, fit_candidate, leave_one_kind_out
from experiments.spikes.summary import (
    LOKO_CANDIDATES,
    LOKO_SINGLE,
    Row,
    Table,
    flag_rates,
    kind_only_flag,
    ship_rule,
)
from icl_lens.stats import (
    auroc,
    choose_lambda,
    grouped_folds,
    lambda_path,
    stratum_mean_auroc,
    stratum_mean_auroc_difference,
)
from icl_lens.stats import MeanAuroc

KINDS = 6


def _kind_specific(seed: int = 0, per_kind: int = 80):
    """Answers of ``KINDS`` kinds; in kind k only feature k tells wrong from right, and feature KINDS carries a
    signal shared by every kind. A detector that never saw kind k cannot know feature k matters."""
    rng = np.random.default_rng(seed)
    n = KINDS * per_kind
    strata = np.repeat([f"k{k}" for k in range(KINDS)], per_kind)
    groups = np.array([f"s{i // 2}" for i in range(n)])  # two answers per subject, same kind
    wrong = rng.random(n) < 0.5
    x = rng.normal(size=(n, KINDS + 1))
    for k in range(KINDS):
        sel = strata == f"k{k}"
        x[sel, k] += 3.0 * wrong[sel]
    shared = 0.4 * wrong + rng.normal(size=n)
    x[:, KINDS] = shared
    calibrate = np.isin(groups, np.unique(groups)[::2])
    return x, wrong, strata, groups, calibrate


def test_leave_one_kind_out_never_fits_on_the_kind_it_scores(monkeypatch):
    x, wrong, strata, groups, calibrate = _kind_specific()
    seen = []
    real = loko_module.fit_candidate

    def spy(name, x_, train, *args, **kwargs):
        seen.append((name, train.copy()))
        return real(name, x_, train, *args, **kwargs)

    monkeypatch.setattr(loko_module, "fit_candidate", spy)
    out = leave_one_kind_out([Candidate("probe", x, True), Candidate("shared", x[:, KINDS], False)], wrong, strata,
                             calibrate, inner_k=3, lambdas=(0.1, 1.0), progress=False)
    assert out.kinds == tuple(f"k{k}" for k in range(KINDS))
    assert len(seen) == 2 * KINDS
    for (name, train), kind in zip(seen, np.repeat(out.kinds, 2)):
        assert not (train & (strata == kind)).any(), f"{name} was fitted on the kind it scores ({kind})"
        assert not (train & ~calibrate).any(), f"{name} was fitted on held-out subjects"
    held = ~calibrate
    assert np.isfinite(out.scores["probe"][held]).all() and np.isnan(out.scores["probe"][calibrate]).all()


def test_leave_one_kind_out_cannot_learn_what_only_the_left_out_kind_shows():
    """The planted fault (fitting on the left-out kind too) would read feature k and score near 1."""
    x, wrong, strata, groups, calibrate = _kind_specific(1)
    probe = Candidate("probe", x, True)
    out = leave_one_kind_out([probe], wrong, strata, calibrate, inner_k=3, lambdas=(0.1, 1.0), progress=False)
    held = ~calibrate
    honest = stratum_mean_auroc(out.scores["probe"][held], wrong[held], strata[held], groups=groups[held], n_boot=200)
    leaky = fit_candidate("probe", x, calibrate, wrong, strata, supervised=True, inner_k=3, lambdas=(0.1, 1.0))
    seen = stratum_mean_auroc(leaky.decision(x[held]), wrong[held], strata[held], groups=groups[held], n_boot=200)
    assert seen.auroc > 0.8  # every kind seen in training: feature k is learned
    assert honest.auroc < 0.75 and honest.auroc < seen.auroc - 0.15  # only the weak shared signal carries over
    assert honest.n_strata == KINDS and set(honest.per_stratum) == set(out.kinds)


def test_fitted_candidate_platt_threshold_and_folded_pca():
    rng = np.random.default_rng(2)
    x, wrong, strata, _, calibrate = _kind_specific(2)
    noise = np.concatenate([x, rng.normal(size=(len(x), 20))], axis=1)
    f = fit_candidate("pca", noise, calibrate, wrong, strata, supervised=True, inner_k=3, lambdas=(0.1, 1.0), pca=5)
    assert f.basis is not None and f.basis[1].shape == (noise.shape[1], 5)
    w, b = f.linear_on_raw()  # PCA and standardisation folded into one linear map, as the library ships it
    np.testing.assert_allclose(noise @ w + b, f.decision(noise), rtol=1e-9, atol=1e-9)
    p = f.p_wrong(f.oof)
    right = ~wrong[calibrate]
    assert (p[right] > f.threshold).mean() <= 0.05  # the threshold keeps ≤ 5% of the fitted rows' correct answers
    single = fit_candidate("s", x[:, KINDS], calibrate, wrong, strata, supervised=False, inner_k=3)
    assert single.model is None and np.array_equal(single.decision(x[:5, KINDS]), x[:5, KINDS])
    assert single.platt[0] > 0  # higher shared signal → more likely wrong


def _table(values: dict[str, float]) -> Table:
    rows = {n: Row(n, "x", 1 if n in LOKO_SINGLE else 100, MeanAuroc(v, v - 0.05, v + 0.05, {"k": v}), {})
            for n, v in values.items()}
    return Table("leave one kind out", {"−log p": "−mean log p, answer"}, rows)


def test_the_shipping_rule_ships_a_baseline_when_it_wins():
    values = {n: 0.6 for n in LOKO_CANDIDATES}
    values["−mean log p, answer"] = 0.8
    assert ship_rule(_table(values)) == "−mean log p, answer"
    values["sampling disagreement"] = 0.81
    assert ship_rule(_table(values)) == "sampling disagreement"
    values["patch, answer tokens"] = 0.82
    assert ship_rule(_table(values)) == "patch, answer tokens"
    tie = {n: 0.7 for n in LOKO_CANDIDATES}
    assert ship_rule(_table(tie)) in LOKO_SINGLE  # ties go to fewer features
    assert {"hidden, PCA", "sampling disagreement", "answer length in tokens", "−min log p, answer",
            "entropy, first answer token", "hidden, answer + last prompt token"} <= set(LOKO_CANDIDATES)


def test_flag_rates_within_stratum_and_the_kind_only_flag():
    # stratum a: always wrong; stratum b: half wrong, the flag catches 3 of 4 wrong and 1 of 4 correct
    strata = np.array(["a"] * 4 + ["b"] * 8)
    wrong = np.array([True] * 4 + [True] * 4 + [False] * 4)
    groups = np.array([f"s{i}" for i in range(12)])
    flagged = np.array([True] * 4 + [True, True, True, False, True, False, False, False])
    r = flag_rates("d", "test", flagged, wrong, strata, groups, n_boot=200)
    a, b = r.strata
    assert (a.correct, a.wrong, a.wrong_flagged) == (0, 4, 1.0) and a.correct_flagged != a.correct_flagged
    assert (b.correct, b.wrong, b.correct_flagged, b.wrong_flagged) == (4, 4, 0.25, 0.75)
    assert r.correct_flagged == 0.25 and r.wrong_flagged == 7 / 8 and r.precision == 7 / 8
    assert r.within_detection == pytest.approx(0.5)  # only b holds both classes
    assert r.max_correct_flagged == 0.25 and (r.strata_correct_ok, r.strata_with_correct) == (0, 1)
    assert not r.meets_within and not r.meets_pooled
    # the kind-only flag: flags every answer of a kind whose calibration error rate is high, nothing else
    calibrate = np.tile([True, False], 6)
    kind = kind_only_flag(wrong, strata, calibrate)
    assert kind.tolist() == [True] * 4 + [False] * 8
    k = flag_rates("kind only", "test", kind, wrong, strata, groups, n_boot=200)
    assert k.within_detection == 0.0 and k.wrong_flagged == 0.5 and k.correct_flagged == 0.0
    assert k.precision == 1.0  # precise pooled, and detects nothing within a stratum


def test_stratum_mean_auroc_is_the_mean_of_the_strata_and_pairs_its_resamples():
    rng = np.random.default_rng(4)
    strata = np.repeat(["a", "b", "c"], 60)
    groups = np.array([f"s{i // 3}" for i in range(180)])
    wrong = rng.random(180) < 0.4
    s1 = wrong * 1.0 + rng.normal(size=180)
    s2 = wrong * 0.3 + rng.normal(size=180)
    m = stratum_mean_auroc(s1, wrong, strata, groups=groups, n_boot=500)
    by_hand = [auroc(s1[strata == s], wrong[strata == s]) for s in "abc"]
    assert m.auroc == pytest.approx(np.mean(by_hand)) and m.low < m.auroc < m.high and m.n_strata == 3
    d = stratum_mean_auroc_difference(s1, s2, wrong, strata, groups=groups, n_boot=500)
    assert d.difference == pytest.approx(m.auroc - stratum_mean_auroc(s2, wrong, strata, n_boot=10).auroc)
    same = stratum_mean_auroc_difference(s1, s1, wrong, strata, groups=groups, n_boot=200)
    assert (same.difference, same.low, same.high) == (0.0, 0.0, 0.0)
    one_class = np.where(strata == "c", False, wrong)  # stratum c carries no AUROC
    assert set(stratum_mean_auroc(s1, one_class, strata, n_boot=50).per_stratum) == {"a", "b"}


def test_lambda_path_keeps_choose_lambda_and_scores_within_strata():
    x, wrong, strata, groups, _ = _kind_specific(5, per_kind=40)
    lambdas = (0.01, 0.1, 1.0)
    path = lambda_path(x, wrong, grouped_folds(groups, 3, 0), lambdas=lambdas)
    assert path.best == choose_lambda(x, wrong, groups, k=3, lambdas=lambdas)
    assert path.aurocs[path.best] == max(path.aurocs.values())
    for lam in lambdas:
        assert len(path.models[lam]) == 3 and np.isfinite(path.oof[lam]).all()
    within = lambda_path(x, wrong, grouped_folds(strata, 3, 0), lambdas=lambdas, strata=strata)
    assert within.aurocs[within.best] == pytest.approx(auroc(within.oof[within.best], wrong, strata))


def test_sampling_agreement_uses_the_correctness_rule():
    assert same_answer(" Paris\n", " paris, France") and same_answer(" The euro", " Euro\n")
    assert same_answer(" Bogotá", " BOGOTA") and not same_answer(" Lima", " Lim")
    assert same_answer("\n", " \n") and not same_answer(" x", "\n")
