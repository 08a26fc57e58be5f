"""icl_lens.stats as API: AUROC (overall and within strata) against a brute-force pair count, the Wilson
interval against its closed forms, bootstrap intervals that cover, the logistic fit at its optimum
(gradient ≈ 0) and on closed forms, grouped folds; and the package imports numpy and torch only."""
import ast
import itertools
import pathlib
from statistics import NormalDist

import numpy as np
import pytest
import torch

import icl_lens.stats as stats
from icl_lens.stats import (
    auroc,
    bootstrap_auroc,
    bootstrap_auroc_difference,
    bootstrap_mean,
    bootstrap_ratio,
    fit_logistic,
    fit_with_inner_cv,
    grouped_folds,
    logistic_loss,
    percentile_interval,
    t_interval,
    t_quantile,
    welch_interval,
    wilson_interval,
)


# ---------------------------------------------------------------- AUROC

def _brute_auroc(scores, positive, strata=None) -> float:
    """Every (positive, negative) pair, one at a time: 1 if the positive scores higher, ½ on a tie."""
    wins = pairs = 0.0
    for i, j in itertools.product(range(len(scores)), repeat=2):
        if positive[i] and not positive[j] and (strata is None or strata[i] == strata[j]):
            pairs += 1
            wins += 1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
    return wins / pairs


def test_auroc_is_the_pair_count():
    rng = np.random.default_rng(3)
    for trial in range(20):
        n = int(rng.integers(4, 40))
        scores = rng.integers(0, 5, size=n).astype(float)  # few values: many ties
        positive = rng.random(n) < 0.5
        positive[:2] = [True, False]
        strata = rng.integers(0, 3, size=n)
        strata[:2] = 0  # stratum 0 holds a positive and a negative
        assert auroc(scores, positive) == pytest.approx(_brute_auroc(scores, positive), abs=1e-12)
        assert auroc(scores, positive, strata) == pytest.approx(_brute_auroc(scores, positive, strata), abs=1e-12)


def test_auroc_rejects_bad_input():
    with pytest.raises(ValueError, match="same length"):
        auroc([0.1, 0.2, 0.3], [True, False])
    with pytest.raises(ValueError, match="finite"):
        auroc([0.1, float("nan")], [True, False])
    with pytest.raises(ValueError, match="no stratum"):
        auroc([0.1, 0.2], [True, False], strata=["a", "b"])


def test_bootstrap_auroc_resamples_are_pair_counts():
    """The matrix-product resamples agree with the brute-force count on the same resampled examples."""
    from icl_lens.stats._bootstrap import resample_counts

    rng = np.random.default_rng(0)
    s, y = rng.normal(size=30), rng.random(30) < 0.4
    r = bootstrap_auroc(s, y, n_boot=200, seed=5)
    counts = resample_counts(30, 200, 5)
    values = []
    for w in counts:
        idx = np.repeat(np.arange(30), w.astype(int))
        if y[idx].any() and not y[idx].all():
            values.append(_brute_auroc(s[idx], y[idx]))
    assert (r.low, r.high) == pytest.approx(percentile_interval(np.array(values)), abs=1e-12)


# ---------------------------------------------------------------- Wilson interval

def test_wilson_interval_closed_forms():
    """At k = 0 the interval is [0, z²/(n + z²)], at k = n [n/(n + z²), 1]; k and n − k mirror each other."""
    for level in (0.9, 0.95, 0.99):
        z = NormalDist().inv_cdf(0.5 + level / 2)
        for n in (1, 7, 24, 500):
            low, high = wilson_interval(0, n, level)
            assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(z * z / (n + z * z), rel=1e-12)
            low, high = wilson_interval(n, n, level)
            assert high == pytest.approx(1.0, abs=1e-12) and low == pytest.approx(n / (n + z * z), rel=1e-12)
            for k in range(0, n + 1, max(1, n // 5)):
                low, high = wilson_interval(k, n, level)
                mirror = wilson_interval(n - k, n, level)
                assert (low, high) == pytest.approx((1 - mirror[1], 1 - mirror[0]), abs=1e-12)
                assert low - 1e-12 <= k / n <= high + 1e-12  # (k = 0 gives low ≈ 3e-17 in floating point)
    with pytest.raises(ValueError, match="level"):
        wilson_interval(1, 2, level=1.0)
    with pytest.raises(ValueError, match="n must be"):
        wilson_interval(0, 0)


# ---------------------------------------------------------------- bootstrap

def test_bootstrap_mean_interval_covers_the_true_mean():
    """Over many samples of a known distribution the 95% interval holds the true mean about 95% of the time."""
    rng = np.random.default_rng(1)
    trials, covered = 300, 0
    for t in range(trials):
        ci = bootstrap_mean(rng.exponential(2.0, size=60), n_boot=400, seed=t)
        assert ci.low <= ci.mean <= ci.high and ci.n == 60
        covered += ci.low <= 2.0 <= ci.high
    assert 0.88 <= covered / trials <= 0.99
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_mean([])


def _logistic_data(n=400, d=12, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 5.0, size=d) + rng.normal(size=d)
    w = np.zeros(d)
    w[:3] = [1.5, -1.0, 0.5]
    y = ((x - x.mean(0)) / x.std(0)) @ w + rng.logistic(size=n) > 0
    return x, y, w


def test_logistic_fit_is_the_minimum():
    x, y, w_true = _logistic_data()
    for lam, method in ((1e-3, "newton"), (1.0, "newton"), (1e-3, "lbfgs")):
        m = fit_logistic(x, y, lam=lam, tol=1e-9, method=method)
        xt = torch.tensor((x - m.mean) / m.scale)
        w = torch.tensor(m.w, requires_grad=True)
        b = torch.tensor(m.b, requires_grad=True)
        logistic_loss(xt, torch.tensor(y, dtype=torch.float64), w, b, lam).backward()
        assert w.grad.abs().max() < 1e-7 and abs(float(b.grad)) < 1e-7  # ∇L = 0
    for lam in (1e-4, 1.0):  # Newton (default at this size) and L-BFGS reach the same minimum
        newton, lbfgs = (fit_logistic(x, y, lam=lam, tol=1e-9, method=m) for m in ("newton", "lbfgs"))
        np.testing.assert_allclose(newton.w, lbfgs.w, atol=1e-5)
        assert newton.b == pytest.approx(lbfgs.b, abs=1e-6)
    m = fit_logistic(x, y, lam=1e-3)
    cos = m.w @ w_true / np.linalg.norm(m.w) / np.linalg.norm(w_true)
    assert cos > 0.9  # recovers the planted direction
    assert auroc(m.decision(x), y) > 0.75
    one = fit_logistic(x, np.ones(len(y), bool), lam=1.0)
    assert np.all(one.w == 0) and one.b > 10  # one class: the constant model
    with pytest.raises(ValueError, match="NaN"):
        fit_logistic(np.full((3, 2), np.nan), np.array([True, False, True]), lam=1.0)


def test_logistic_fit_matches_closed_forms():
    # one binary feature, (almost) no penalty: the fitted probabilities are the two groups' label rates,
    # σ(score(0)) = 10/50 and σ(score(1)) = 35/50, whatever the standardisation
    x = np.repeat([0.0, 1.0], 50)[:, None]
    y = np.concatenate([np.arange(50) < 10, np.arange(50) < 35])
    m = fit_logistic(x, y, lam=1e-10, tol=1e-12)
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    np.testing.assert_allclose(m.decision(np.array([[0.0], [1.0]])), [logit(0.2), logit(0.7)], atol=1e-6)
    # a strong penalty shrinks w to ~0 but not the bias: σ(b) is then the positive rate, 45/100
    m = fit_logistic(x, y, lam=1e4, tol=1e-12)
    assert abs(m.w[0]) < 1e-4 and m.b == pytest.approx(logit(0.45), abs=1e-6)
    # separable, symmetric: x̃ = ±1, y = [x > 0], so b = 0 and L(w) = log(1 + e^(−w)) + λw²/2,
    # whose minimiser solves σ(−w) = λw (found here by bisection); w grows without bound as λ → 0
    x = np.repeat([-1.0, 1.0], 20)[:, None]
    y = x[:, 0] > 0
    previous = 0.0
    for lam in (1.0, 0.1, 0.01, 0.001):
        lo, hi = 0.0, 1.0 / lam
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if 1 / (1 + np.exp(mid)) > lam * mid else (lo, mid)
        for method in ("newton", "lbfgs"):
            m = fit_logistic(x, y, lam=lam, tol=1e-12, method=method)
            assert m.w[0] == pytest.approx(lo, rel=1e-6) and abs(m.b) < 1e-8
        assert lo > previous
        previous = lo
        assert auroc(m.decision(x), y) == 1.0


def test_grouped_folds_keep_groups_together():
    groups = np.array([f"g{i // 3}" for i in range(60)] + ["big"] * 9)
    folds = grouped_folds(groups, 5, seed=1)
    for g in np.unique(groups):
        assert len(set(folds[groups == g])) == 1
    sizes = np.bincount(folds, minlength=5)
    assert sizes.max() - sizes.min() <= 9 and set(folds) == set(range(5))
    with pytest.raises(ValueError):
        grouped_folds(["a", "a", "b"], 3)


def test_paired_auroc_difference():
    rng = np.random.default_rng(0)
    y = rng.random(200) < 0.4
    good, noise = y + rng.normal(scale=0.8, size=200), rng.normal(size=200)
    same = bootstrap_auroc_difference(good, good, y, n_boot=300)
    assert same.difference == 0 and same.low == 0 and same.high == 0
    d = bootstrap_auroc_difference(good, noise, y, n_boot=300)
    assert d.difference == pytest.approx(auroc(good, y) - auroc(noise, y))
    assert 0 < d.low <= d.difference <= d.high


def test_auroc_identities():
    assert auroc([0.1, 0.2, 0.8, 0.9], [False, False, True, True]) == 1.0
    assert auroc([0.1, 0.2, 0.8, 0.9], [True, True, False, False]) == 0.0
    assert auroc([1.0, 1.0, 1.0], [True, False, False]) == 0.5
    g = torch.Generator().manual_seed(0)
    s, y = torch.rand(100, generator=g).numpy(), (torch.rand(100, generator=g) < 0.5).numpy()
    r = bootstrap_auroc(s, y, n_boot=300)
    assert r.low <= r.auroc <= r.high and 0 <= r.low and r.high <= 1
    flipped = auroc(-s, y)
    assert flipped == pytest.approx(1 - r.auroc)
    with pytest.raises(ValueError):
        auroc([0.1, 0.2], [True, True])
    # within-stratum AUROC: a score that only separates the strata earns 0.5
    strata = [0, 0, 0, 1, 1, 1]
    between = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    labels = [True, False, False, True, True, False]
    assert auroc(between, labels) > 0.5 and auroc(between, labels, strata) == 0.5


def test_bootstrap_intervals():
    """The percentile interval of known values, and the paired ratio interval of patched/full accuracies."""
    assert percentile_interval(np.arange(101.0), 0.9) == pytest.approx((5.0, 95.0))
    x = np.array([1, 1, 0, 1, 1, 0, 1, 1])
    low, high = bootstrap_ratio(x, np.ones(8))
    assert low <= x.mean() <= high and high <= 1.0
    assert bootstrap_ratio(x, np.zeros(8)) is None


def test_wilson_interval_known_values():
    # p = 1/2, n = 24, z = 1.96: centre 0.5, half 1.96·sqrt(1/96 + z²/2304)/1.16007 = 0.18573
    low, high = wilson_interval(12, 24)
    assert low == pytest.approx(0.31427, abs=1e-4) and high == pytest.approx(0.68573, abs=1e-4)
    low, high = wilson_interval(0, 24)
    assert low == 0.0 and high == pytest.approx(0.1380, abs=1e-3)
    assert wilson_interval(24, 24)[1] == 1.0
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_fit_with_inner_cv_is_at_its_optimum():
    """The λ chosen by the inner folds is one of the grid, and the returned model has ∇L ≈ 0 at that λ."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(120, 4))
    y = x[:, 0] + rng.logistic(size=120) > 0
    groups = np.arange(120) // 3
    m = fit_with_inner_cv(x, y, groups, k=3)
    assert m.lam in stats.LAMBDAS
    xt = torch.tensor((x - m.mean) / m.scale)
    w, b = torch.tensor(m.w, requires_grad=True), torch.tensor(m.b, requires_grad=True)
    logistic_loss(xt, torch.tensor(y, dtype=torch.float64), w, b, m.lam).backward()
    assert w.grad.abs().max() < 1e-5 and abs(float(b.grad)) < 1e-5


# ---------------------------------------------------------------- the package

def test_stats_exports_and_imports_numpy_and_torch_only():
    assert all(hasattr(stats, name) for name in stats.__all__)
    allowed = ("numpy", "torch", "icl_lens.stats", "__future__", "dataclasses", "math", "statistics")
    for path in (pathlib.Path(stats.__file__).parent).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert all(n.startswith(allowed) for n in names), f"{path.name} imports {names}"


def test_cluster_bootstrap_counts_each_subject_once():
    """Copying every example k times inside its own cluster must not narrow a cluster-bootstrap
    interval: with the same seed it equals the interval over the unique examples, exactly
    (while the example bootstrap, which treats copies as independent, is narrower)."""
    rng = np.random.default_rng(3)
    n, k = 40, 5
    scores, positive = rng.normal(size=n), rng.random(n) < 0.4
    positive[:2] = [True, False]
    strata = rng.integers(0, 2, n)
    dup = lambda x: np.repeat(x, k)  # noqa: E731
    groups = dup(np.arange(n))
    counts = stats.resample_counts(n * k, 50, 0, groups)
    assert (counts.reshape(50, n, k) == counts.reshape(50, n, k)[:, :, :1]).all()  # one count per cluster
    assert (counts.sum(1) == n * k).all()
    one = stats.bootstrap_auroc(scores, positive, strata=strata, n_boot=300)
    clustered = stats.bootstrap_auroc(dup(scores), dup(positive), strata=dup(strata), groups=groups, n_boot=300)
    naive = stats.bootstrap_auroc(dup(scores), dup(positive), strata=dup(strata), n_boot=300)
    assert (clustered.low, clustered.high) == pytest.approx((one.low, one.high), abs=1e-12)
    assert naive.high - naive.low < 0.7 * (clustered.high - clustered.low)
    other = rng.normal(size=n)
    d1 = stats.bootstrap_auroc_difference(scores, other, positive, n_boot=300)
    d2 = stats.bootstrap_auroc_difference(dup(scores), dup(other), dup(positive), groups=groups, n_boot=300)
    assert (d2.low, d2.high) == pytest.approx((d1.low, d1.high), abs=1e-12)
    m1 = stats.bootstrap_mean(scores, n_boot=300)
    m2 = stats.bootstrap_mean(dup(scores), n_boot=300, groups=groups)
    assert (m2.low, m2.high) == pytest.approx((m1.low, m1.high), abs=1e-12)
    assert stats.bootstrap_ratio(dup(positive), dup(np.ones(n)), groups=groups, n_boot=300) == pytest.approx(
        stats.bootstrap_ratio(positive, np.ones(n), n_boot=300), abs=1e-12)
    with pytest.raises(ValueError, match="one label per example"):
        stats.resample_counts(5, 10, 0, groups=[1, 2])


# ---------------------------------------------------------------- Student t over seeds

def test_t_quantile_matches_the_tables():
    """Two-sided 95% critical values of Student's t (any table): 12.706 (1), 4.303 (2), 2.262 (9), 2.042 (30);
    99% at 9: 3.250. Odd and even degrees of freedom take different closed forms."""
    for df, level, value in ((1, 0.95, 12.7062), (2, 0.95, 4.3027), (3, 0.95, 3.1824), (9, 0.95, 2.2622),
                             (30, 0.95, 2.0423), (9, 0.99, 3.2498)):
        assert abs(t_quantile(level, df) - value) < 5e-4, (df, level)
    assert abs(t_quantile(0.95, 2000) - NormalDist().inv_cdf(0.975)) < 2e-3  # large df: the normal quantile
    with pytest.raises(ValueError):
        t_quantile(0.95, 0)
    with pytest.raises(ValueError):
        t_quantile(1.0, 5)


def test_t_interval_is_mean_plus_minus_t_times_standard_error_and_covers():
    ci = t_interval([1.0, 2.0, 3.0, 4.0])
    half = 3.1824 * np.std([1, 2, 3, 4], ddof=1) / 2
    assert ci.n == 4 and ci.mean == 2.5 and abs(ci.high - 2.5 - half) < 1e-3 and abs(2.5 - ci.low - half) < 1e-3
    rng = np.random.default_rng(0)  # coverage of a true mean with 3 units: the t-interval keeps ~95%
    covered = sum(t_interval(rng.normal(size=3)).excludes(0.0) is False for _ in range(2000))
    assert 0.93 < covered / 2000 < 0.97
    with pytest.raises(ValueError, match="at least 2"):
        t_interval([1.0])
    with pytest.raises(ValueError, match="finite"):
        t_interval([1.0, float("nan")])


def test_welch_interval_of_two_sets_of_seeds():
    a, b = [1.0, 2.0, 3.0, 4.0], [0.0, 0.5, 1.0, 1.2, 0.3]
    ci = welch_interval(a, b)
    va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 5
    df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 4)  # 3.71: rounded down to 3
    assert int(df) == 3 and abs(ci.mean - 1.9) < 1e-12
    assert abs((ci.high - ci.low) / 2 - t_quantile(0.95, 3) * np.sqrt(va + vb)) < 1e-9
    assert welch_interval([1.0, 1.0], [0.0, 0.0]).low == 1.0  # no spread: the difference itself
    with pytest.raises(ValueError, match="at least 2"):
        welch_interval([1.0], [0.0, 1.0])
