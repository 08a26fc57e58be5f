"""How the dashboard's layer × token heatmaps are coloured: a layer range and a per-layer colour scale.

Display only (no new numbers): the rows of the chosen layer range ``lo..hi`` are shown and,
with the per-layer scale, each row ``z_l`` is divided by its own largest magnitude,
``z_l / max_t |z_l,t|``, so that the token pattern of a layer with small patches is as
visible as that of a layer with large ones (the hover still gives the raw value). The
global scale keeps one colour scale for every shown layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as W
import numpy as np

SCALES = ("global scale", "per-layer scale")


@dataclass(frozen=True)
class LayerView:
    """A snapshot of the controls: the shown layer range (inclusive) and the colour scale."""

    lo: int
    hi: int
    per_layer: bool = False

    @property
    def layers(self) -> list[int]:
        return list(range(self.lo, self.hi + 1))

    def rows(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shown, raw)``: the rows ``lo..hi`` of a ``layer × token`` array, scaled per layer if asked."""
        raw = np.asarray(values, dtype=float)[self.lo: self.hi + 1]
        if not self.per_layer or raw.size == 0:
            return raw, raw
        top = np.abs(raw).max(axis=1, keepdims=True)
        return raw / np.where(top > 0, top, 1.0), raw

    def colour_title(self, title: str) -> str:
        return f"{title}/max" if self.per_layer else title

    def mean_over_layers(self, values: np.ndarray) -> list[float]:
        """Per token, the mean of the raw values over the layer range (the token strip's colour)."""
        raw = np.asarray(values, dtype=float)[self.lo: self.hi + 1]
        return raw.mean(0).tolist() if raw.size else []


class LayerControls:
    """The layer range slider and the global / per-layer colour scale toggle."""

    def __init__(self, n_layers: int):
        self.range = W.IntRangeSlider(value=(0, n_layers - 1), min=0, max=n_layers - 1, description="layers",
                                      continuous_update=False, layout=W.Layout(width="300px"))
        self.scale = W.ToggleButtons(options=SCALES, value=SCALES[0],
                                     tooltips=["one colour scale for every layer", "each layer ÷ its own max"],
                                     style=dict(button_width="auto"))
        self.widget = W.HBox([self.range, self.scale], layout=W.Layout(flex_flow="row wrap", align_items="center"))

    def resize(self, n_layers: int) -> None:
        """A model switch: the range covers every layer of the new model."""
        with self.range.hold_trait_notifications():
            self.range.max = max(self.range.min, n_layers - 1)
            self.range.value = (0, n_layers - 1)

    def view(self, n_layers: int | None = None) -> LayerView:
        lo, hi = (int(x) for x in self.range.value)
        if n_layers is not None:
            hi = min(hi, n_layers - 1)
            lo = min(lo, hi)
        return LayerView(lo, hi, self.scale.value == SCALES[1])

    def observe(self, fn) -> None:
        for control in (self.range, self.scale):
            control.observe(lambda _c: fn(), names="value")


def show_layer_range(trajectory_panel, view: LayerView) -> None:
    """Hide the trajectory panel's lines of layers outside the range and narrow its exponent bars' axis."""
    shown = set(view.layers)
    fig = trajectory_panel.fig
    with fig.batch_update():
        for layer, (line, step) in enumerate(zip(trajectory_panel.norms, trajectory_panel.steps)):
            line.visible = step.visible = layer in shown
        trajectory_panel.grid.axis("exponents", "x").range = [view.lo - 0.5, view.hi + 0.5]
