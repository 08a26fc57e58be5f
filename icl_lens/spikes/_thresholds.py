"""Per-model spike-flag thresholds, calibrated on labelled answers (``icl_lens/spikes/data/spike_thresholds.json``).

A token is flagged when its spike score (:mod:`icl_lens.spikes._scores`) is above a
threshold. A fixed threshold means different things for different models, so
``python -m experiments.spikes`` calibrates one per model, statistic and window: the
score above which at most 5% of the answer tokens of *correct* answers are flagged (a
one-sided 95% bound, from a calibration half of the labelled questions; how the flag then
does on the other half is in EVAL.md). :func:`generate_with_patches` and the dashboard use it by default.

For a model, statistic, window or layer selection that was not calibrated the threshold
is :data:`DEFAULT_SPIKE_THRESHOLD` (3.5: a robust z of 3.5, Iglewicz & Hoaglin's outlier
cut-off), which is also :func:`icl_lens.spike_scores`' default.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from icl_lens.spikes._settings import DEFAULT_SPIKE_THRESHOLD, SpikeSettings

THRESHOLDS_FILE = Path(__file__).resolve().parent / "data" / "spike_thresholds.json"


@dataclass(frozen=True)
class SpikeThreshold:
    """A threshold and where it comes from (``calibrated``: read from the thresholds file)."""

    value: float
    calibrated: bool
    model_name: str
    statistic: str
    window: int

    def describe(self) -> str:
        if self.calibrated:
            return (f"{self.value:.3g}, calibrated for {self.model_name} (statistic {self.statistic}, "
                    f"window {self.window}: ≤5% of correct answer tokens flagged)")
        return f"{self.value:.3g} (default; no calibration for {self.model_name}, {self.statistic}, window {self.window})"


@lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def cached_json(path: Path | str) -> dict:
    """A shipped JSON file's content, read once per modification time (empty if there is none)."""
    p = Path(path)
    return _load(str(p), p.stat().st_mtime_ns) if p.exists() else {}


def calibrated_thresholds(path: Path | str | None = None) -> dict:
    """The thresholds file's content (default :data:`THRESHOLDS_FILE`; empty if there is none)."""
    return cached_json(THRESHOLDS_FILE if path is None else path)


def spike_threshold(model_name: str, settings: SpikeSettings | None = None, *, path: Path | str | None = None,
                    **changes) -> SpikeThreshold:
    """The calibrated threshold of ``model_name`` for the settings' statistic and window over all layers, else the
    default.

    ``settings``: :class:`~icl_lens.spikes.SpikeSettings` (default ``SpikeSettings()``), ``changes``: its fields
    as keyword arguments (``statistic``, ``window``, ``layers``); ``layers=None`` means all layers, the only
    selection calibrated; ``path``: another thresholds file (default :data:`THRESHOLDS_FILE`).
    """
    settings = SpikeSettings.of(settings, **changes)
    statistic, window = settings.statistic, settings.window
    if settings.layers is None:
        entry = calibrated_thresholds(path).get("models", {}).get(model_name, {})
        for row in entry.get("thresholds", []):
            if row["statistic"] == statistic and int(row["window"]) == int(window) and row.get("layers") == "all":
                return SpikeThreshold(float(row["threshold"]), True, model_name, statistic, int(window))
    return SpikeThreshold(DEFAULT_SPIKE_THRESHOLD, False, model_name, statistic, int(window))
