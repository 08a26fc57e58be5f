"""The dashboard's panels: each a small class with its controls and ``show(result)``.

The plots live in ONE plotly ``FigureWidget`` (:class:`FigureGrid`) created once and
updated in place with ``batch_update()`` (never rebuilt per keystroke). Every per-token axis is keyed by
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


class FigureGrid:
    """ONE plotly FigureWidget holding every plot of the dashboard, in a subplot grid.

    One widget, not one per plot: each FigureWidget ships plotly.js (~5 MB) to the
    browser, and anywidget gives each widget 2 s to initialise, which several copies
    parsed at once miss on a busy machine (then that plot never updates).

    Rows: (1) layer × token heatmap; (2) meta-gradient norm | consecutive-step alignment;
    (3) token × token alignment matrix | fitted decay exponent per layer.
    Traces: 0 heatmap, 1 alignment matrix, then per layer the meta-gradient lines, the
    step-alignment lines, and last the exponent bars.
    """

    TITLES = ("token-patch norm per layer and token", "meta-gradient norm vs context length",
              "consecutive-step alignment", "patch alignment (cosine), layer 0", "fitted decay exponent α per layer")

    def __init__(self, n_layers: int):
        from plotly.subplots import make_subplots

        grid = make_subplots(rows=3, cols=2, specs=[[{"colspan": 2}, None], [{}, {}], [{}, {}]],
                             row_heights=[0.28, 0.3, 0.42], vertical_spacing=0.09, horizontal_spacing=0.12,
                             subplot_titles=self.TITLES)
        grid.add_trace(go.Heatmap(z=[], x=[], y=[], colorscale="Viridis",
                                  colorbar=dict(title=dict(text="‖ΔW‖"), len=0.26, y=0.87),
                                  hovertemplate="layer %{y}<br>%{text}<br>%{z:.4g}<extra></extra>"), row=1, col=1)
        grid.add_trace(go.Heatmap(z=[], x=[], y=[], zmin=-1, zmax=1, colorscale="RdBu", reversescale=True,
                                  colorbar=dict(title=dict(text="cos"), len=0.38, y=0.2, x=0.44),
                                  hovertemplate="%{y} · %{x}<br>cos %{z:.3f}<extra></extra>"), row=3, col=1)
        for trace in layer_traces(n_layers):
            grid.add_trace(trace, row=2, col=1)
        for trace in layer_traces(n_layers, legend=False):
            grid.add_trace(trace, row=2, col=2)
        grid.add_trace(exponent_bars(), row=3, col=2)
        grid.update_layout(meta="icl_lens:figures", height=1250, margin=dict(l=60, r=30, t=40, b=40),
                           legend=dict(y=0.62, yanchor="top", font=dict(size=10)))
        grid.update_yaxes(title_text="layer", dtick=1, row=1, col=1)
        grid.update_xaxes(title_text="context length i", type="log", row=2, col=1)  # log–log by default
        grid.update_yaxes(title_text="‖W_{i+1} − W_i‖", type="log", row=2, col=1)
        grid.update_xaxes(title_text="context length i", row=2, col=2)
        grid.update_yaxes(title_text="cos(G_{i−1}, G_i)", range=[-1.05, 1.05], row=2, col=2)
        grid.update_yaxes(autorange="reversed", row=3, col=1)
        grid.update_xaxes(title_text="layer", row=3, col=2)
        grid.update_yaxes(title_text="α (‖G_i‖ ∝ i^−α)", row=3, col=2)
        # Traces and layout go in the constructor: changes made to a FigureWidget before it
        # is displayed never reach the browser (plotly 7 sends them as one-off messages).
        self.fig = go.FigureWidget(grid)

    def title(self, index: int, text: str) -> None:
        self.fig.layout.annotations[index].text = text


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

    def __init__(self, grid: FigureGrid):
        self.fig = grid.fig
        self.kind = W.ToggleButtons(options=self.KINDS, value=self.KINDS[0], style=dict(button_width="auto"))
        self.widget = self.kind

    @property
    def trace(self):
        return self.fig.data[0]

    def values(self, patches: TokenPatches) -> np.ndarray:
        t = patches.norms() if self.kind.value == self.KINDS[0] else patches.correction_norms()
        return t.detach().cpu().double().numpy()

    def show(self, patches: TokenPatches | None) -> None:
        with self.fig.batch_update():
            trace = self.trace
            if patches is None:
                trace.z, trace.x, trace.y, trace.text = [], [], [], []
                self.fig.layout.xaxis.update(token_axis([]))
                return
            trace.z = self.values(patches)
            trace.x = patches.positions
            trace.y = list(range(patches.n_layers))
            trace.text = [_labels(patches.tokens)] * patches.n_layers
            trace.colorbar.title.text = "‖ΔW‖" if self.kind.value == self.KINDS[0] else "‖corr‖"
            self.fig.layout.xaxis.update(token_axis(patches.tokens))
            self.fig.layout.yaxis.range = [-0.5, patches.n_layers - 0.5]


class AlignmentPanel:
    """Token × token cosine of the token patches of one layer."""

    def __init__(self, grid: FigureGrid):
        self.grid, self.fig = grid, grid.fig

    @property
    def trace(self):
        return self.fig.data[1]

    def show(self, patches: TokenPatches | None, matrix, layer: int) -> None:
        with self.fig.batch_update():
            trace = self.trace
            if patches is None:
                trace.z, trace.x, trace.y = [], [], []
                self.fig.layout.xaxis4.update(token_axis([]))
                self.fig.layout.yaxis4.update(tickvals=[], ticktext=[])
                return
            trace.z = matrix.detach().cpu().double().numpy()
            trace.x = patches.positions
            trace.y = patches.positions
            axis = token_axis(patches.tokens)
            self.fig.layout.xaxis4.update(axis)
            self.fig.layout.yaxis4.update(tickmode="array", tickvals=axis["tickvals"], ticktext=axis["ticktext"],
                                          title_text="token (position)")
            self.grid.title(3, f"patch alignment (cosine of token patches), layer {layer}")


class TrajectoryPanel:
    """Meta-gradient norm vs context length per layer, consecutive-step alignment, and the
    fitted decay exponent per layer, for the selected query; ``order`` picks the prefix or the
    paper's absorb order of consuming the context (docs/design.md §3)."""

    def __init__(self, grid: FigureGrid):
        self.grid, self.fig = grid, grid.fig
        self.loglog = W.Checkbox(value=True, description="log–log", indent=False)
        self.order = W.Dropdown(options=[("prefix", "prefix"), ("absorb (paper)", "absorb")], value="prefix",
                                description="order", description_tooltip="prefix: the query sees c₁..cᵢ; absorb: "
                                "c₁..cᵢ are absorbed into the weights, the rest stays in context",
                                layout=W.Layout(width="200px"))
        self.message = W.HTML()
        self.widget = W.HBox([self.loglog, self.order, self.message])  # the grid starts log–log, like the checkbox

    @property
    def n_layers(self) -> int:
        return (len(self.fig.data) - 3) // 2

    @property
    def norms(self) -> tuple:
        return self.fig.data[2: 2 + self.n_layers]

    @property
    def steps(self) -> tuple:
        return self.fig.data[2 + self.n_layers: 2 + 2 * self.n_layers]

    @property
    def exponents(self):
        return self.fig.data[-1]

    def _ensure_traces(self, n_layers: int) -> None:
        if self.n_layers == n_layers:
            return
        # only when the model changes: replace the per-layer traces
        self.fig.data = self.fig.data[:2]
        self.fig.add_traces(layer_traces(n_layers), rows=[2] * n_layers, cols=[1] * n_layers)
        self.fig.add_traces(layer_traces(n_layers, legend=False), rows=[2] * n_layers, cols=[2] * n_layers)
        self.fig.add_traces([exponent_bars()], rows=[3], cols=[2])

    def apply_scale(self) -> None:
        kind = "log" if self.loglog.value else "linear"
        with self.fig.batch_update():
            self.fig.layout.xaxis2.type = kind
            self.fig.layout.yaxis2.type = kind

    def show(self, trajectory, query: int | None, tokens, n_layers: int, message: str = "") -> None:
        self._ensure_traces(n_layers)
        self.message.value = html.escape(message)
        with self.fig.batch_update():
            if trajectory is None:
                for trace in (*self.norms, *self.steps, self.exponents):
                    trace.x, trace.y = [], []
                self.grid.title(1, FigureGrid.TITLES[1])
                self.grid.title(2, FigureGrid.TITLES[2])
                return
            norms = _np(trajectory.meta_gradient_norms())  # column k: step i = k + 1
            align = _np(trajectory.consecutive_alignment())  # column k: cos(G_{k+1}, G_{k+2}), i = k + 2
            fit = trajectory.decay_fit()
            rows = {layer: row for row, layer in enumerate(trajectory.layers)}
            for layer, (line, step) in enumerate(zip(self.norms, self.steps)):
                row = rows.get(layer)
                if row is None:
                    line.x, line.y, step.x, step.y = [], [], [], []
                    continue
                line.x, line.y = np.arange(1, norms.shape[1] + 1), norms[row]
                line.name = f"L{layer} (α={float(fit.exponent[row]):.2f}, R²={float(fit.r_squared[row]):.2f})"
                step.x, step.y = np.arange(2, align.shape[1] + 2), align[row]
            bars = self.exponents
            bars.x, bars.y = list(trajectory.layers), _np(fit.exponent)
            bars.customdata = _np(fit.r_squared)
            label = token_label(tokens[query]) if query is not None and 0 <= query < len(tokens) else "?"
            self.grid.title(1, f"meta-gradient norm vs context length — query {query} ({label!r})")
            self.grid.title(2, f"consecutive-step alignment — query {query}")


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


def layer_traces(n_layers: int, legend: bool = True) -> list[go.Scatter]:
    """One line per layer (coloured along Viridis), empty until a trajectory is shown."""
    return [go.Scatter(x=[], y=[], mode="lines+markers", marker=dict(size=4), name=f"L{layer}",
                       legendgroup=f"L{layer}", showlegend=legend,
                       line=dict(color=_layer_colour(layer, n_layers))) for layer in range(n_layers)]


def exponent_bars() -> go.Bar:
    return go.Bar(x=[], y=[], name="α", showlegend=False, marker_color="#555",
                  hovertemplate="layer %{x}<br>α = %{y:.3f}<br>R² = %{customdata:.2f}<extra></extra>")


def _layer_colour(layer: int, n_layers: int) -> str:
    import plotly.colors as pc

    return pc.sample_colorscale("Viridis", [layer / max(1, n_layers - 1)])[0]
