"""The settings of a spike score and its flag, one frozen object (see :mod:`icl_lens.spikes` and docs/design.md §2).

``window``: trailing informative positions each token is compared with; ``threshold``: robust z above which a
token is flagged (``None``: the model's shipped calibrated threshold for this statistic and window,
:func:`~icl_lens.spikes.spike_threshold`, or :data:`DEFAULT_SPIKE_THRESHOLD` where there is none); ``layers``:
the layers entering the aggregate (``None``: all; the only selection calibrated); ``statistic``: ``"mean"``,
``"median"``, ``"max"`` or ``"norm"``; ``min_context``: informative predecessors needed before a position can be
flagged (``None``: ``window``). No torch here: the command line reads it before anything heavy is imported.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from icl_lens._settings import Settings

DEFAULT_SPIKE_THRESHOLD = 3.5  # a robust z of 3.5: Iglewicz & Hoaglin's outlier cut-off
STATISTICS = ("mean", "median", "max", "norm")


@dataclass(frozen=True)
class SpikeSettings(Settings):
    """How spike scores are computed and flagged (module docstring). ``SpikeSettings()`` is the default of
    :func:`~icl_lens.spikes.spike_scores`; :func:`~icl_lens.spikes.generate_with_patches` and the dashboard
    flag with the model's calibrated threshold (``threshold=None``). :class:`~icl_lens.spikes.SpikeFlags` carry
    the settings they were computed with (``flags.settings``), and the shipped thresholds are looked up by them."""

    window: int = 16
    threshold: float | None = DEFAULT_SPIKE_THRESHOLD
    layers: Sequence[int] | slice | None = None  # stored as a tuple (or the slice)
    statistic: str = "mean"
    min_context: int | None = None
    _what = "spike setting"

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        t = self.threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)):
            raise ValueError(f"threshold must be a finite number (or None: the calibrated one), got {t!r}")
        if self.statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, got {self.statistic!r}")
        m = self.min_context
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= self.window):
            raise ValueError(f"min_context must be an integer in 1..window ({self.window}), got {m!r}")
        if isinstance(self.layers, int):
            raise TypeError("layers must be a sequence of layer indices (e.g. [3] or range(9, 18)), not an int")
        if self.layers is not None and not isinstance(self.layers, slice):
            object.__setattr__(self, "layers", tuple(int(layer) for layer in self.layers))
        if t is not None:
            object.__setattr__(self, "threshold", float(t))

    @property
    def context(self) -> int:
        """Informative predecessors needed before a flag: ``min_context``, else ``window``."""
        return self.window if self.min_context is None else self.min_context

    def to_dict(self) -> dict:
        """Plain JSON types (``layers`` a list, or ``{"slice": [start, stop, step]}``)."""
        d = asdict(self)
        if isinstance(self.layers, slice):
            d["layers"] = {"slice": [self.layers.start, self.layers.stop, self.layers.step]}
        elif self.layers is not None:
            d["layers"] = list(self.layers)
        return d

    @classmethod
    def _from_json(cls, d: dict) -> dict:
        layers = d.get("layers")
        return {**d, "layers": slice(*layers["slice"])} if isinstance(layers, dict) else d
