"""Statistics for evaluations on small samples (numpy and torch only, no TransformerLens).

* ``_auroc.py``: AUROC with ties, ``AUROC = P(s⁺ > s⁻) + ½ P(s⁺ = s⁻)`` over (positive,
  negative) pairs (Mann–Whitney U / ``n⁺ n⁻``); ``strata=`` counts only pairs within one
  group (within-kind AUROC, ``Σ S_ij K_ij / Σ S_ij``); bootstrap intervals of one AUROC and of
  the paired difference of two scores on the same resamples; the mean over strata of the
  within-stratum AUROC (clusters resampled within each stratum), alone and paired.
* ``_bootstrap.py``: percentile bootstrap over examples. A resample is a count vector ``w``
  (``Σ w = n``), so a weighted-sum statistic costs one matrix product over all resamples; the
  interval is the ``(1−level)/2`` and ``(1+level)/2`` quantiles of the resampled statistic
  (Efron); ``groups=`` resamples clusters (subjects) instead of examples, every example
  taking its cluster's count (cluster bootstrap). :func:`bootstrap_mean` (a :class:`MeanCI`) and
  :func:`bootstrap_ratio` (paired ``Σx / Σy``). Means over a few training seeds use the Student-t
  interval of ``_intervals.py`` instead (3 seeds have 10 distinct resamples).
* ``_intervals.py``: Wilson score interval of a proportion ``k/n``,
  ``(p̂ + z²/2n ± z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)`` (Wilson 1927); Student-t interval of a
  mean over few independent units (training seeds), ``x̄ ± t_{n−1} s/√n`` (:func:`t_interval`), and of the
  difference of two such means (Welch, :func:`welch_interval`).
* ``_logistic.py``: L2-regularised logistic regression on standardised features,
  ``L(w, b) = (1/n) Σ_i [log(1 + exp(s_i)) − y_i s_i] + (λ/2)‖w‖²``, ``s_i = w·x̃_i + b``,
  minimised by Newton (few features) or L-BFGS (many) until ``‖∇L‖_∞ < tol``; ``λ`` by an
  inner grouped K-fold (:func:`fit_with_inner_cv`); :func:`grouped_folds` keeps each group
  in one fold.
"""
from icl_lens.stats._auroc import (
    AurocDifference,
    AurocResult,
    MeanAuroc,
    auroc,
    bootstrap_auroc,
    bootstrap_auroc_difference,
    resampled_auroc,
    stratum_mean_auroc,
    stratum_mean_auroc_difference,
)
from icl_lens.stats._bootstrap import (
    MeanCI, bootstrap_mean, bootstrap_ratio, percentile_interval, resample_counts, row_nanmean,
)
from icl_lens.stats._intervals import t_interval, t_quantile, welch_interval, wilson_interval
from icl_lens.stats._logistic import (
    LAMBDAS,
    LambdaPath,
    NEWTON_MAX_FEATURES,
    LogisticModel,
    choose_lambda,
    fit_logistic,
    fit_with_inner_cv,
    grouped_folds,
    lambda_path,
    logistic_loss,
)

__all__ = [
    "AurocDifference", "AurocResult", "MeanAuroc", "auroc", "bootstrap_auroc", "bootstrap_auroc_difference",
    "resampled_auroc", "stratum_mean_auroc", "stratum_mean_auroc_difference",
    "MeanCI", "bootstrap_mean", "bootstrap_ratio", "percentile_interval", "resample_counts", "row_nanmean",
    "t_interval", "t_quantile", "welch_interval", "wilson_interval",
    "LAMBDAS", "LambdaPath", "NEWTON_MAX_FEATURES", "LogisticModel", "choose_lambda", "fit_logistic",
    "fit_with_inner_cv", "grouped_folds", "lambda_path", "logistic_loss",
]
