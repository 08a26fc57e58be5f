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

from icl_lens.patches._patch_set import TokenPatches
from icl_lens.ui._layer_view import LayerView
from icl_lens.ui._token_strip import TokenStrip

MAX_TICKS = 48  # token ticks along a plot's width (plotly turns crowded labels upright)
MAX_MATRIX_TICKS = 20  # token ticks on each side of the alignment matrix (half a row wide, at 800 px)
LABEL_CHARS = 12  # longest tick label; hover shows the whole token
MAX_LAYER_TICKS = 16  # layer labels along a heatmap's height (about 250 px): 30 in that height would overlap
LOG_DTICK = "D2"  # a log axis labelled at 1, 2 and 5 of each decade
MIN_FIT_STEPS = 3  # nonzero meta-gradient norms a decay exponent is drawn from: any line fits 2 points (R² = 1)


def token_label(token: str) -> str:
    """Readable label of one token (newlines and tabs made visible)."""
    return (token.replace("\n", "⏎").replace("\t", "⇥")) or "∅"


def short_label(token: str) -> str:
    """:func:`token_label` cut to ``LABEL_CHARS`` characters (tick labels and titles must fit 800 px)."""
    label = token_label(token)
    return label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…"


def layer_dtick(n_layers: int) -> int:
    """Layer-axis tick step of a heatmap: one label per layer up to :data:`MAX_LAYER_TICKS` rows, then every 2nd,
    3rd…"""
    return max(1, -(-n_layers // MAX_LAYER_TICKS))


def token_axis(tokens: tuple[str, ...] | list[str], title: str = "token (position)",
               max_ticks: int = MAX_TICKS) -> dict:
    """Axis keyed by position with token labels (at most ``max_ticks`` ticks shown)."""
    n = len(tokens)
    step = max(1, math.ceil(n / max_ticks))
    ticks = list(range(0, n, step))
    if n and ticks[-1] != n - 1:
        ticks.append(n - 1)  # the newest token always has its label
    return dict(tickmode="array", tickvals=ticks, ticktext=[short_label(tokens[p]) for p in ticks], title=title,
                range=[-0.5, n - 0.5] if n else None)


def label_rows(tokens, rows: int) -> np.ndarray:
    """Hover labels of a layer × token heatmap, ``rows`` × tokens, as one numpy array: plotly takes an array
    whole, where a nested list is checked and compared label by label on every keystroke."""
    return np.tile(np.array([f"{p}: {token_label(t)}" for p, t in enumerate(tokens)], dtype=object), (rows, 1))


class FigureGrid:
    """ONE plotly FigureWidget holding every plot of the dashboard, in a subplot grid.

    One widget, not one per plot: each FigureWidget ships plotly.js (~5 MB) to the
    browser, and anywidget gives each widget 2 s to initialise, which several copies
    parsed at once miss on a busy machine (then that plot never updates).

    Rows: (1) layer × token heatmap; (2) meta-gradient norm | consecutive-step alignment;
    (3) fitted decay exponent per layer | token × token alignment matrix.
    The figure has no fixed width: it follows its container (JupyterLab's output area, a
    Voila page), and its titles are short enough for 800 px. There is no legend: the
    per-layer lines and bars are coloured along Viridis, read off one "layer" colour bar.
    Each colour bar sits in the right margin beside its own row.
    Traces: 0 heatmap, 1 alignment matrix, then the layer group: the layer colour bar (no
    data), per layer the meta-gradient lines, per layer the step-alignment lines, and last
    the exponent bars.
    """

    PANELS = ("heatmap", "norms", "steps", "exponents", "alignment")  # subplot order = title order
    CELLS = ((1, 1), (2, 1), (2, 2), (3, 1), (3, 2))
    TITLES = ("token-patch norm ‖ΔW‖ per layer and token", "meta-gradient norm vs context length",
              "consecutive-step alignment", "fitted decay exponent α per layer", "patch alignment (cosine), layer 0")

    def __init__(self, n_layers: int):
        from plotly.subplots import make_subplots

        grid = make_subplots(rows=3, cols=2, specs=[[{"colspan": 2}, None], [{}, {}], [{}, {}]],
                             row_heights=[0.28, 0.3, 0.42], vertical_spacing=0.11, horizontal_spacing=0.13,
                             subplot_titles=self.TITLES)
        self.cell = dict(zip(self.PANELS, self.CELLS))
        subplots = {name: grid.get_subplot(*cell) for name, cell in self.cell.items()}
        self.axis_names = {name: (s.xaxis.plotly_name, s.yaxis.plotly_name) for name, s in subplots.items()}
        self.row_domains = {row: tuple(grid.get_subplot(row, 1).yaxis.domain) for row in (1, 2, 3)}
        grid.add_trace(go.Heatmap(z=[], x=[], y=[], colorscale="Viridis", colorbar=self.colour_bar(1, "‖ΔW‖"),
                                  hovertemplate="layer %{y}<br>%{text}<br>%{customdata:.4g}<extra></extra>"),
                       *self.cell["heatmap"])
        grid.add_trace(go.Heatmap(z=[], x=[], y=[], zmin=-1, zmax=1, colorscale="RdBu", reversescale=True,
                                  colorbar=self.colour_bar(3, "cos"),
                                  hovertemplate="%{y} · %{x}<br>cos %{z:.3f}<extra></extra>"), *self.cell["alignment"])
        grid.add_traces(*self.layer_group(n_layers))
        grid.update_annotations(font_size=13)
        grid.update_layout(meta="icl_lens:figures", height=1300, showlegend=False, font=dict(size=11),
                           margin=dict(l=60, r=20, t=40, b=40))
        axis = lambda name, xy: self.axis(name, xy, grid.layout)  # noqa: E731
        axis("heatmap", "y").update(title_text="layer", dtick=1)
        # log–log by default, labelled at 1, 2, 5 of each decade ("D2"): plotly's own choice on a range of a decade
        # or two labels every digit, and they overlap
        axis("norms", "x").update(title_text="context length i", type="log", dtick=LOG_DTICK)
        axis("norms", "y").update(title_text="‖W_{i+1} − W_i‖", type="log", dtick=LOG_DTICK)
        axis("steps", "x").update(title_text="context length i")
        axis("steps", "y").update(title_text="cos(G_{i−1}, G_i)", range=[-1.05, 1.05])
        axis("exponents", "x").update(title_text="layer")
        axis("exponents", "y").update(title_text="α (‖G_i‖ ∝ i^−α)")
        axis("alignment", "y").update(autorange="reversed")
        # Traces and layout go in the constructor: changes made to a FigureWidget before it
        # is displayed never reach the browser (plotly 7 sends them as one-off messages).
        self.fig = go.FigureWidget(grid)
        # No width in the layout: the figure re-fits its container on every window "resize",
        # which the token strip also sends when the dashboard's width changes (token_strip.js).
        self.fig._config = dict(responsive=True)

    def axis(self, name: str, xy: str, layout=None):
        """The x or y axis (layout object) of panel ``name`` (in the figure's layout, or in ``layout``)."""
        return (self.fig.layout if layout is None else layout)[self.axis_names[name]["xy".index(xy)]]

    def title(self, name: str, text: str) -> None:
        self.fig.layout.annotations[self.PANELS.index(name)].text = text

    def colour_bar(self, row: int, title: str) -> dict:
        """A slim vertical colour bar in the right margin, as tall as grid row ``row``."""
        y0, y1 = self.row_domains[row]
        return dict(title=dict(text=title, side="top"), x=1.01, xanchor="left", xpad=4, thickness=12,
                    y=(y0 + y1) / 2, yanchor="middle", len=y1 - y0, lenmode="fraction")

    def layer_group(self, n_layers: int) -> tuple[list, list[int], list[int]]:
        """The per-layer traces (layer colour bar, lines, step lines, exponent bars) with their rows and columns."""
        top = max(1, n_layers - 1)
        scale = go.Scatter(x=[None], y=[None], mode="markers", showlegend=False, hoverinfo="skip",
                           marker=dict(color=[0], colorscale="Viridis", cmin=0, cmax=top, showscale=True,
                                       colorbar=dict(self.colour_bar(2, "layer"), dtick=max(1, round(n_layers / 6)))))
        bars = go.Bar(x=[], y=[], name="α", marker=dict(color=[], colorscale="Viridis", cmin=0, cmax=top),
                      hovertemplate="layer %{x}<br>α = %{y:.3f}<br>R² = %{customdata:.2f}<extra></extra>")
        traces = [scale, *layer_traces(n_layers), *layer_traces(n_layers), bars]
        cells = [self.cell["norms"]] * (1 + n_layers) + [self.cell["steps"]] * n_layers + [self.cell["exponents"]]
        return traces, [r for r, _ in cells], [c for _, c in cells]


class StripPanel:
    """Tokens coloured by their mean patch norm over layers; spike flags marked; click = query."""

    def __init__(self):
        self.widget = TokenStrip()

    def show(self, patches: TokenPatches | None, flags, query: int | None, view: LayerView | None = None) -> None:
        w = self.widget
        if patches is None:
            with w.hold_sync():
                w.tokens, w.values, w.flags, w.selected, w.vmax = [], [], [], -1, 0.0
            return
        norms = patches.norms().detach().cpu()
        values = norms.mean(0).tolist() if view is None else view.mean_over_layers(norms.double().numpy())
        flagged = [False] * len(values) if flags is None else [bool(f) for f in flags.flags.tolist()]
        with w.hold_sync():
            w.tokens, w.values, w.flags = list(patches.tokens), values, flagged
            w.selected = -1 if query is None else int(query)
            w.vmax = float(max(values) if values else 0.0)


class HeatmapPanel:
    """Layer × token heatmap of patch norms, or of skip-correction norms (toggle)."""

    KINDS = ("patch norm ‖ΔW‖", "correction norm ‖attn_C − attn_0‖")

    def __init__(self, grid: FigureGrid):
        self.grid, self.fig = grid, grid.fig
        self.kind = W.ToggleButtons(options=self.KINDS, value=self.KINDS[0], style=dict(button_width="auto"))
        self.widget = self.kind

    @property
    def trace(self):
        return self.fig.data[0]

    def values(self, patches: TokenPatches) -> np.ndarray:
        t = patches.norms() if self.kind.value == self.KINDS[0] else patches.correction_norms()
        return t.detach().cpu().double().numpy()

    def show(self, patches: TokenPatches | None, view: LayerView | None = None) -> None:
        """Rows of ``view``'s layer range (default: every layer, one global colour scale)."""
        with self.fig.batch_update():
            trace = self.trace
            if patches is None:
                trace.z, trace.x, trace.y, trace.text, trace.customdata = [], [], [], [], []
                self.grid.axis("heatmap", "x").update(token_axis([]))
                return
            view = view or LayerView(0, patches.n_layers - 1)
            shown, raw = view.rows(self.values(patches))
            trace.z, trace.customdata = shown, raw
            trace.zmin, trace.zmax = (0.0, 1.0) if view.per_layer else (None, None)
            trace.zauto = not view.per_layer
            trace.x = patches.positions
            trace.y = view.layers
            trace.text = label_rows(patches.tokens, len(view.layers))
            title = "‖ΔW‖" if self.kind.value == self.KINDS[0] else "‖corr‖"
            trace.colorbar.title.text = view.colour_title(title)
            self.grid.axis("heatmap", "x").update(token_axis(patches.tokens))
            self.grid.axis("heatmap", "y").update(range=[view.lo - 0.5, view.hi + 0.5],
                                                  dtick=layer_dtick(len(view.layers)))


class AlignmentPanel:
    """Token × token cosine of the token patches of one layer."""

    def __init__(self, grid: FigureGrid):
        self.grid, self.fig = grid, grid.fig

    @property
    def trace(self):
        return self.fig.data[1]

    def show(self, patches: TokenPatches | None, matrix, layer: int) -> None:
        x_axis, y_axis = self.grid.axis("alignment", "x"), self.grid.axis("alignment", "y")
        with self.fig.batch_update():
            trace = self.trace
            if patches is None:
                trace.z, trace.x, trace.y = [], [], []
                x_axis.update(token_axis([]))
                y_axis.update(tickvals=[], ticktext=[])
                return
            trace.z = matrix.detach().cpu().double().numpy()
            trace.x = patches.positions
            trace.y = patches.positions
            axis = token_axis(patches.tokens, max_ticks=MAX_MATRIX_TICKS)
            x_axis.update(axis)
            y_axis.update(tickmode="array", tickvals=axis["tickvals"], ticktext=axis["ticktext"])
            self.grid.title("alignment", f"patch alignment (cosine), layer {layer}")


class TrajectoryPanel:
    """Meta-gradient norm vs context length per layer, consecutive-step alignment, and the
    fitted decay exponent per layer, for the selected query; ``order`` picks the prefix or the
    paper's absorb order of consuming the context (docs/design.md §3)."""

    def __init__(self, grid: FigureGrid):
        self.grid, self.fig = grid, grid.fig
        self.loglog = W.Checkbox(value=True, description="log–log", indent=False)
        self.order = W.Dropdown(options=[("prefix", "prefix"), ("absorb (paper)", "absorb")], value="prefix",
                                description="order", tooltip="prefix: the query sees c₁..cᵢ; absorb: "
                                "c₁..cᵢ are absorbed into the weights, the rest stays in context",
                                layout=W.Layout(width="200px"))
        self.message = W.HTML()
        self.widget = W.HBox([self.loglog, self.order, self.message])  # the grid starts log–log, like the checkbox

    @property
    def n_layers(self) -> int:
        return (len(self.fig.data) - 4) // 2  # heatmap, matrix, layer colour bar, bars; 2 lines per layer

    @property
    def norms(self) -> tuple:
        return self.fig.data[3: 3 + self.n_layers]

    @property
    def steps(self) -> tuple:
        return self.fig.data[3 + self.n_layers: 3 + 2 * self.n_layers]

    @property
    def exponents(self):
        return self.fig.data[-1]

    def _ensure_traces(self, n_layers: int) -> None:
        if self.n_layers == n_layers:
            return
        # only when the model changes: replace the per-layer traces
        self.fig.data = self.fig.data[:2]
        traces, rows, cols = self.grid.layer_group(n_layers)
        self.fig.add_traces(traces, rows=rows, cols=cols)

    def apply_scale(self) -> None:
        kind = "log" if self.loglog.value else "linear"
        with self.fig.batch_update():
            for xy in "xy":
                self.grid.axis("norms", xy).update(type=kind, dtick=LOG_DTICK if kind == "log" else None)

    def show(self, trajectory, query: int | None, tokens, n_layers: int, message: str = "") -> None:
        self._ensure_traces(n_layers)
        self.message.value = html.escape(message)
        with self.fig.batch_update():
            if trajectory is None:
                for trace in (*self.norms, *self.steps, self.exponents):
                    trace.x, trace.y = [], []
                for name in ("norms", "steps", "exponents"):
                    self.grid.title(name, FigureGrid.TITLES[FigureGrid.PANELS.index(name)])
                return
            metrics = trajectory.step_metrics()  # one pass over the factors
            norms = _np(metrics.meta_gradient_norms)  # column k: step i = norm_steps[k] (k + 1 unless coarse)
            align = _np(metrics.consecutive_alignment)  # column k: cos(G_{i−1}, G_i), i = alignment_steps[k]
            fit = metrics.fit
            fitted = _np(fit.n_points) >= MIN_FIT_STEPS  # per layer: enough steps for the exponent to mean anything
            rows = {layer: row for row, layer in enumerate(trajectory.layers)}
            for layer, (line, step) in enumerate(zip(self.norms, self.steps)):
                row = rows.get(layer)
                if row is None:
                    line.x, line.y, step.x, step.y = [], [], [], []
                    continue
                line.x, line.y = np.array(metrics.norm_steps), norms[row]
                line.name = (f"L{layer} (α={float(fit.exponent[row]):.2f}, R²={float(fit.r_squared[row]):.2f})"
                             if fitted[row] else f"L{layer} (no fit: {int(fit.n_points[row])} steps)")
                step.x, step.y = np.array(metrics.alignment_steps), align[row]
            bars = self.exponents
            bars.x, bars.y = list(trajectory.layers), np.where(fitted, _np(fit.exponent), np.nan)  # NaN: no bar
            bars.marker.color = list(trajectory.layers)
            bars.customdata = _np(fit.r_squared)
            label = short_label(tokens[query]) if query is not None and 0 <= query < len(tokens) else "?"
            self.grid.title("norms", f"meta-gradient norm — query {query} ({label!r})")
            self.grid.title("steps", f"consecutive-step alignment — query {query}")
            self.grid.title("exponents", f"fitted decay exponent α per layer — query {query}" if fitted.all() else
                            f"α per layer — query {query}: no fit under {MIN_FIT_STEPS} nonzero steps")


ATTENTION_FRAME, ATTENTION_SIDE = 460, 400  # frame height, widest attention square (px)


class AttentionPanel:
    """Attention pattern of one layer and head, drawn by circuitsvis (offline bundle)."""

    def __init__(self):
        self.html = W.HTML()  # stretches to the dashboard (a 100% width plus its margin would stick out)
        self.widget = self.html

    def show(self, tokens, pattern, layer: int, head: int) -> None:
        if pattern is None:
            self.html.value = "<i>No prompt.</i>"
            return
        self.html.value = attention_frame(attention_page(tokens, pattern, head), layer, head)


def attention_page(tokens, pattern, head: int) -> str:
    """circuitsvis' attention pattern of ``head`` as a whole HTML page (its offline bundle inlined)."""
    import circuitsvis as cv

    rendered = cv.attention.attention_pattern(tokens=[token_label(t) for t in tokens],
                                              attention=pattern[head].numpy())
    # circuitsvis draws a square as wide as its container: capped so that the whole square, with its axis
    # labels, fits the frame's height at any width (a full-width square is cut off in a 900 px output area).
    return (f"<html><head><meta charset='utf-8'></head><body style='margin:0;font-family:sans-serif'>"
            f"<div style='max-width:{ATTENTION_SIDE}px'>{rendered.local_src}</div></body></html>")


def attention_frame(page: str, layer: int, head: int) -> str:
    """The attention page in a frame of fixed height, with its title (live view and saved page)."""
    return (f"<div class='icl-attention' data-layer='{layer}' data-head='{head}'>"
            f"<b>attention pattern, layer {layer}, head {head}</b>"
            f"<iframe style='width:100%;height:{ATTENTION_FRAME}px;border:0' "
            f"srcdoc=\"{html.escape(page, quote=True)}\"></iframe></div>")


def _np(t) -> np.ndarray:
    return t.detach().cpu().double().numpy() if hasattr(t, "detach") else np.asarray(t, dtype=float)


def layer_traces(n_layers: int) -> list[go.Scatter]:
    """One line per layer (coloured along Viridis), empty until a trajectory is shown."""
    return [go.Scatter(x=[], y=[], mode="lines+markers", marker=dict(size=4), name=f"L{layer}",
                       line=dict(color=_layer_colour(layer, n_layers))) for layer in range(n_layers)]


def _layer_colour(layer: int, n_layers: int) -> str:
    import plotly.colors as pc

    return pc.sample_colorscale("Viridis", [layer / max(1, n_layers - 1)])[0]


def layer_lines(frame, x: str, y: str, *, layer: str = "layer", hover: str | None = None, log_x: bool = False,
                log_y: bool = False, x_title: str | None = None, y_title: str | None = None, title: str = "",
                height: int = 380) -> go.Figure:
    """One line per layer of a tidy ``frame``, coloured along Viridis with a layer colour bar instead of a legend.

    With 18–30 layers a legend of one entry per layer does not fit a ~900 px notebook output
    area; the colour bar does (hover a line for its layer). Used by the workshop notebooks.
    """
    layers = sorted(frame[layer].unique())
    top = max(1, len(layers) - 1)
    fig = go.Figure()
    for i, value in enumerate(layers):
        part = frame[frame[layer] == value]
        text = part[hover].astype(str) if hover else None
        fig.add_trace(go.Scatter(x=part[x], y=part[y], mode="lines", text=text, name=f"layer {value}",
                                 line=dict(color=_layer_colour(i, len(layers)), width=1.5), showlegend=False,
                                 hovertemplate=f"layer {value}<br>{x} %{{x}}<br>{y} %{{y:.3g}}"
                                               + ("<br>%{text}" if hover else "") + "<extra></extra>"))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", showlegend=False, hoverinfo="skip",
                             marker=dict(color=[0], colorscale="Viridis", cmin=layers[0], cmax=layers[0] + top,
                                         showscale=True, colorbar=dict(title="layer", thickness=12,
                                                                        dtick=max(1, round(len(layers) / 6))))))
    fig.update_layout(title=title, height=height, margin=dict(l=60, r=20, t=50 if title else 20, b=50),
                      xaxis_title=x_title or x, yaxis_title=y_title or y)
    fig.update_xaxes(type="log" if log_x else "linear")
    fig.update_yaxes(type="log" if log_y else "linear")
    return fig


def vertical_marker(fig: go.Figure, x: float, text: str, *, log_x: bool | None = None) -> go.Figure:
    """A dashed vertical line at data coordinate ``x`` with a label, correct on log x axes.

    ``fig.add_vline(annotation_text=...)`` on a log axis places its label at ``x`` read as a
    log10 coordinate and stretches the range to ~10^x (a known plotly issue), squeezing the
    data into a sliver. Here the line is a shape in data coordinates (plotly takes real x
    for shapes) and the label an annotation at ``log10(x)`` when the axis is logarithmic
    (annotations take log10 coordinates there).
    """
    if log_x is None:
        log_x = fig.layout.xaxis.type == "log"
    if log_x and x <= 0:
        raise ValueError(f"a marker on a log x axis needs x > 0, got {x}")
    fig.add_shape(type="line", x0=x, x1=x, xref="x", y0=0, y1=1, yref="paper", line=dict(dash="dash", width=1))
    fig.add_annotation(x=math.log10(x) if log_x else x, xref="x", y=1, yref="paper", text=text, showarrow=False,
                       xanchor="left", yanchor="bottom")
    return fig
