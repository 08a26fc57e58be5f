"""The dashboard's panels: each a small class with a widget and ``show(result)``.

Figures are plotly ``FigureWidget``s created once and updated in place with
``batch_update()`` (never rebuilt per keystroke). Every per-token axis is keyed by
POSITION (tokens repeat) and labelled with the token text.
"""
from __future__ import annotations

import html
import math

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from icl_lens.core.patch_set import TokenPatches
from icl_lens.ui.token_strip import TokenStrip

MAX_TICKS = 48


def token_label(token: str) -> str:
    """Readable label of one token (newlines and tabs made visible)."""
    return (token.replace("\n", "⏎").replace("\t", "⇥")) or "∅"


def token_axis(tokens: tuple[str, ...] | list[str], title: str = "token (position)") -> dict:
    """Axis keyed by position with token labels (at most ``MAX_TICKS`` ticks shown)."""
    n = len(tokens)
    step = max(1, math.ceil(n / MAX_TICKS))
    ticks = list(range(0, n, step))
    if n and ticks[-1] != n - 1:
        ticks.append(n - 1)  # the newest token always has its label
    return dict(tickmode="array", tickvals=ticks, ticktext=[token_label(tokens[p]) for p in ticks], title=title,
                range=[-0.5, n - 0.5] if n else None)


def _labels(tokens) -> list[str]:
    return [f"{p}: {token_label(t)}" for p, t in enumerate(tokens)]


def _figure(meta: str, title: str, height: int = 320, data=(), **layout) -> go.FigureWidget:
    # Traces go in the constructor: traces added to a FigureWidget before it is displayed
    # never reach the browser (plotly 7 sends them as a one-off message).
    fig = go.FigureWidget(data=list(data), layout=dict(meta=meta, title=dict(text=title, font=dict(size=13)), height=height,
                                      margin=dict(l=50, r=20, t=40, b=60), **layout))
    return fig


class StripPanel:
    """Tokens coloured by their mean patch norm over layers; spike flags marked; click = query."""

    def __init__(self):
        self.widget = TokenStrip()

    def show(self, patches: TokenPatches | None, flags, query: int | None) -> None:
        w = self.widget
        if patches is None:
            with w.hold_sync():
                w.tokens, w.values, w.flags, w.selected, w.vmax = [], [], [], -1, 0.0
            return
        values = patches.norms().mean(0).detach().cpu().tolist()
        flagged = [False] * len(values) if flags is None else [bool(f) for f in flags.flags.tolist()]
        with w.hold_sync():
            w.tokens, w.values, w.flags = list(patches.tokens), values, flagged
            w.selected = -1 if query is None else int(query)
            w.vmax = float(max(values) if values else 0.0)


class HeatmapPanel:
    """Layer × token heatmap of patch norms, or of skip-correction norms (toggle)."""

    KINDS = ("patch norm ‖ΔW‖", "correction norm ‖attn_C − attn_0‖")

    def __init__(self):
        self.kind = W.ToggleButtons(options=self.KINDS, value=self.KINDS[0], style=dict(button_width="auto"))
        trace = go.Heatmap(z=[], x=[], y=[], colorscale="Viridis", colorbar=dict(title=""),
                           hovertemplate="layer %{y}<br>%{text}<br>%{z:.4g}<extra></extra>")
        self.fig = _figure("icl_lens:heatmap", "token-patch norm per layer and token", height=360, data=[trace],
                           yaxis=dict(title="layer"))
        self.widget = W.VBox([self.kind, self.fig])

    def values(self, patches: TokenPatches) -> np.ndarray:
        t = patches.norms() if self.kind.value == self.KINDS[0] else patches.correction_norms()
        return t.detach().cpu().double().numpy()

    def show(self, patches: TokenPatches | None) -> None:
        with self.fig.batch_update():
            trace = self.fig.data[0]
            if patches is None:
                trace.z, trace.x, trace.y, trace.text = [], [], [], []
                self.fig.layout.xaxis = token_axis([])
                return
            z = self.values(patches)
            trace.z = z
            trace.x = patches.positions
            trace.y = list(range(patches.n_layers))
            trace.text = [_labels(patches.tokens)] * patches.n_layers
            trace.colorbar.title.text = "‖ΔW‖" if self.kind.value == self.KINDS[0] else "‖corr‖"
            self.fig.layout.xaxis = token_axis(patches.tokens)
            self.fig.layout.yaxis.range = [-0.5, patches.n_layers - 0.5]


class AlignmentPanel:
    """Token × token cosine of the token patches of one layer."""

    def __init__(self):
        trace = go.Heatmap(z=[], x=[], y=[], zmin=-1, zmax=1, colorscale="RdBu", reversescale=True,
                           hovertemplate="%{y} · %{x}<br>cos %{z:.3f}<extra></extra>")
        self.fig = _figure("icl_lens:alignment", "patch alignment (cosine), layer 0", height=420, data=[trace],
                           yaxis=dict(autorange="reversed"))
        self.widget = self.fig

    def show(self, patches: TokenPatches | None, matrix, layer: int) -> None:
        with self.fig.batch_update():
            trace = self.fig.data[0]
            if patches is None:
                trace.z, trace.x, trace.y = [], [], []
                self.fig.layout.xaxis = token_axis([])
                self.fig.layout.yaxis.update(tickvals=[], ticktext=[])
                return
            trace.z = matrix.detach().cpu().double().numpy()
            trace.x = patches.positions
            trace.y = patches.positions
            axis = token_axis(patches.tokens)
            self.fig.layout.xaxis = axis
            self.fig.layout.yaxis.update(tickmode="array", tickvals=axis["tickvals"], ticktext=axis["ticktext"],
                                         title="token (position)")
            self.fig.layout.title.text = f"patch alignment (cosine of token patches), layer {layer}"


class TrajectoryPanel:
    """Meta-gradient norm vs context length per layer, with the fitted decay exponent,
    and the cosine between consecutive meta-gradient steps."""

    def __init__(self, n_layers: int):
        self.loglog = W.Checkbox(value=True, description="log–log", indent=False)
        self.norms = _figure("icl_lens:meta_gradient", "meta-gradient norm vs context length", height=340,
                             data=_layer_traces(n_layers),
                             xaxis=dict(title="context length i"), yaxis=dict(title="‖W_{i+1} − W_i‖"))
        self.steps = _figure("icl_lens:step_alignment", "consecutive-step alignment", height=340,
                             data=_layer_traces(n_layers),
                             xaxis=dict(title="context length i"), yaxis=dict(title="cos(step i, step i+1)",
                                                                             range=[-1.05, 1.05]))
        self.message = W.HTML()
        self.widget = W.VBox([W.HBox([self.loglog, self.message]), W.HBox([self.norms, self.steps])])

    def _ensure_traces(self, n_layers: int) -> None:
        for fig in (self.norms, self.steps):
            if len(fig.data) != n_layers:  # at construction and when the model changes
                fig.data = []
                fig.add_traces(_layer_traces(n_layers))

    def apply_scale(self) -> None:
        kind = "log" if self.loglog.value else "linear"
        with self.norms.batch_update():
            self.norms.layout.xaxis.type = kind
            self.norms.layout.yaxis.type = kind

    def show(self, trajectory, query: int | None, tokens, n_layers: int, message: str = "") -> None:
        self._ensure_traces(n_layers)
        self.message.value = html.escape(message)
        with self.norms.batch_update(), self.steps.batch_update():
            if trajectory is None:
                for fig in (self.norms, self.steps):
                    for trace in fig.data:
                        trace.x, trace.y = [], []
                return
            norms = _np(trajectory.meta_gradient_norms())  # column k: step i = k + 1
            align = _np(trajectory.consecutive_alignment())  # column k: cos(G_{k+1}, G_{k+2}), i = k + 2
            fit = trajectory.decay_fit()
            rows = {layer: row for row, layer in enumerate(trajectory.layers)}
            for layer, trace in enumerate(self.norms.data):
                row = rows.get(layer)
                if row is None:
                    trace.x, trace.y, trace.name = [], [], f"L{layer}"
                    continue
                trace.x, trace.y = np.arange(1, norms.shape[1] + 1), norms[row]
                trace.name = f"L{layer} (α={float(fit.exponent[row]):.2f}, R²={float(fit.r_squared[row]):.2f})"
            for layer, trace in enumerate(self.steps.data):
                row = rows.get(layer)
                trace.x, trace.y = ([], []) if row is None else (np.arange(2, align.shape[1] + 2), align[row])
            label = token_label(tokens[query]) if query is not None and 0 <= query < len(tokens) else "?"
            self.norms.layout.title.text = f"meta-gradient norm vs context length — query {query} ({label!r})"
            self.steps.layout.title.text = f"consecutive-step alignment — query {query}"
        self.apply_scale()


class AttentionPanel:
    """Attention pattern of one layer and head, drawn by circuitsvis (offline bundle)."""

    def __init__(self):
        self.html = W.HTML(layout=W.Layout(width="100%"))
        self.widget = self.html

    def show(self, tokens, pattern, layer: int, head: int) -> None:
        if pattern is None:
            self.html.value = "<i>No prompt.</i>"
            return
        import circuitsvis as cv

        rendered = cv.attention.attention_pattern(tokens=[token_label(t) for t in tokens],
                                                  attention=pattern[head].numpy())
        page = f"<html><body style='margin:0;font-family:sans-serif'>{rendered.local_src}</body></html>"
        self.html.value = (f"<div class='icl-attention' data-layer='{layer}' data-head='{head}'>"
                           f"<b>attention pattern, layer {layer}, head {head}</b>"
                           f"<iframe style='width:100%;height:460px;border:0' srcdoc=\"{html.escape(page, quote=True)}\">"
                           f"</iframe></div>")


def _np(t) -> np.ndarray:
    return t.detach().cpu().double().numpy() if hasattr(t, "detach") else np.asarray(t, dtype=float)


def _layer_traces(n_layers: int) -> list[go.Scatter]:
    return [go.Scatter(x=[], y=[], mode="lines+markers", marker=dict(size=4), name=f"L{layer}",
                       line=dict(color=_layer_colour(layer, n_layers))) for layer in range(n_layers)]


def _layer_colour(layer: int, n_layers: int) -> str:
    import plotly.colors as pc

    return pc.sample_colorscale("Viridis", [layer / max(1, n_layers - 1)])[0]
