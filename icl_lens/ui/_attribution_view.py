"""The dashboard's "who wrote the patch" panel: the exact split of the selected query's token patch over
attention heads and removed context tokens, and what the patch writes (docs/design.md §7).

For the query chosen in the token strip and the layer of the layer slider it shows

- the heads × context-tokens map of shares ``⟨ΔW_hj, ΔW⟩/‖ΔW‖²`` (:func:`icl_lens.patch_attribution`;
  they sum to 1; a negative share points against the patch), keyed by source position;
- a layer × head summary: each head's share (summed over the tokens) at every layer;
- what the patch (or the correction) writes at that layer, read through the unembedding: the tokens
  whose logits it raises and lowers most, labelled as the first-order, this-layer view it is.

A toggle switches between the patch ``ΔW`` and the skip correction (for a parallel block the patch is
zero and the correction carries everything, so the correction is shown). The figure is a plotly
FigureWidget of its own, made the first time the panel is turned on (a page without it loads plotly's
front end once), sized for JupyterLab's ~900 px output area.
"""
from __future__ import annotations

import html

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from icl_lens.patches._attribution import PatchAttribution, PatchWrites
from icl_lens.ui._panels import short_label, token_axis, token_label

PART_LABELS = {"patch": "patch ΔW", "correction": "correction attn_C − attn_0"}
SHARE_SCALE = dict(colorscale="RdBu", reversescale=True, zmid=0.0)


def _colour_bar(domain: tuple[float, float], title: str) -> dict:
    y0, y1 = domain
    return dict(title=dict(text=title, side="top"), x=1.01, xanchor="left", xpad=4, thickness=12,
                y=(y0 + y1) / 2, yanchor="middle", len=y1 - y0, lenmode="fraction")


class AttributionFigure:
    """ONE figure: the heads × sources map of one layer (top), the heads × layers summary (bottom).

    Heads are the rows of both, so a head reads across. No fixed width (it follows the output area);
    titles short enough for 800 px; each colour bar in the right margin beside its own row.
    """

    TITLES = ("shares of the patch by head and context token", "each head's share per layer")

    def __init__(self, widget: bool = True):
        from plotly.subplots import make_subplots

        grid = make_subplots(rows=2, cols=1, row_heights=[0.55, 0.45], vertical_spacing=0.2,
                             subplot_titles=self.TITLES)
        for row in (1, 2):
            domain = tuple(grid.get_subplot(row, 1).yaxis.domain)
            grid.add_trace(go.Heatmap(z=[], x=[], y=[], **SHARE_SCALE, colorbar=_colour_bar(domain, "share"),
                                      hovertemplate=("head %{y}<br>%{text}<br>share %{z:.3f}<extra></extra>")), row, 1)
        grid.update_layout(meta="icl_lens:attribution", height=560, showlegend=False, font=dict(size=11),
                           margin=dict(l=60, r=20, t=40, b=40))
        grid.update_annotations(font_size=13)
        grid.update_yaxes(title_text="head", dtick=1, autorange="reversed")
        grid.update_xaxes(title_text="layer", dtick=1, row=2, col=1)
        self.fig = go.FigureWidget(grid) if widget else go.Figure(grid)
        if widget:
            self.fig._config = dict(responsive=True)

    def show(self, at: PatchAttribution | None, layer: int, part: str) -> None:
        fig = self.fig
        heads, summary = fig.data
        with fig.batch_update():
            if at is None or not at.sources:
                for trace in fig.data:
                    trace.z, trace.x, trace.y, trace.text = [], [], [], []
                for i, title in enumerate(self.TITLES):
                    fig.layout.annotations[i].text = title
                fig.layout.xaxis.update(token_axis([], title="context token (position)"))
                return
            shares = at.head_map(layer, part).detach().cpu().double().numpy()  # head source
            top = float(np.abs(shares).max()) or 1.0
            heads.z, heads.zmin, heads.zmax = shares, -top, top
            heads.x, heads.y = list(at.sources), list(range(at.n_heads))
            labels = [f"{p} ({at.position - p} back): {token_label(at.tokens[p])}" for p in at.sources]
            heads.text = [labels] * at.n_heads
            axis = token_axis(at.tokens, title="context token (position)")
            shown = [(v, t) for v, t in zip(axis["tickvals"], axis["ticktext"]) if v in set(at.sources)]
            fig.layout.xaxis.update(tickmode="array", tickvals=[v for v, _ in shown], ticktext=[t for _, t in shown],
                                    title=axis["title"], range=[min(at.sources) - 0.5, max(at.sources) + 0.5])
            layer_heads = at.layer_heads(part).detach().cpu().double().numpy().T  # head layer
            top = float(np.abs(layer_heads).max()) or 1.0
            summary.z, summary.zmin, summary.zmax = layer_heads, -top, top
            summary.x, summary.y = list(at.layers), list(range(at.n_heads))
            summary.text = [[f"layer {lay}" for lay in at.layers]] * at.n_heads
            what = "patch" if part == "patch" else "correction"
            query = f"query {at.position} ({short_label(at.tokens[at.position])!r})"
            fig.layout.annotations[0].text = f"shares of the {what}, layer {layer}, {query}"
            fig.layout.annotations[1].text = f"each head's share of the {what} per layer"


def writes_html(writes: PatchWrites | None, part: str, k: int = 8) -> str:
    """The tokens the part raises and lowers most at the shown layer, as two small tables (static HTML)."""
    if writes is None:
        return ""
    p = ("patch", "correction").index(part)
    tables = []
    for direction, ids, logits, tokens in (("raises", writes.promoted_ids, writes.promoted_logits,
                                            writes.promoted_tokens),
                                           ("lowers", writes.suppressed_ids, writes.suppressed_logits,
                                            writes.suppressed_tokens)):
        rows = "".join(f"<tr><td style='padding:0 6px 0 0;font-family:monospace;white-space:pre'>"
                       f"{html.escape(token_label(t))}</td><td>{float(v):+.3g}</td></tr>"
                       for t, v in list(zip(tokens[p][0], logits[p, 0]))[:k])
        tables.append(f"<div class='icl-writes-side' data-direction='{direction}' style='flex:1 1 200px;min-width:0'>"
                      f"<b>{direction}</b><table style='border-collapse:collapse;font-size:12px'>{rows}</table></div>")
    norm = float(writes.output_norms[p, 0])
    what = "the patch adds MLP(A) − MLP(a)" if part == "patch" else "the correction adds attn_C − attn_0"
    return (f"<div class='icl-writes' data-layer='{writes.layers[0]}' data-part='{part}'>"
            f"<b>what it writes at layer {writes.layers[0]}</b> <small>({what}, norm {norm:.3g}; logit changes "
            f"through the unembedding: {html.escape(writes.view)})</small>"
            f"<div style='display:flex;flex-wrap:wrap;gap:12px'>{''.join(tables)}</div></div>")


class AttributionView:
    """The panel's controls and views; the figure is made when the panel is first turned on."""

    def __init__(self):
        self.enabled = W.Checkbox(value=False, description="who wrote the patch (heads × tokens)", indent=False,
                                  layout=W.Layout(width="auto"))
        self.part = W.ToggleButtons(options=[(label, key) for key, label in PART_LABELS.items()], value="patch",
                                    style=dict(button_width="auto"))
        self.message = W.HTML()
        self.writes = W.HTML()
        self.figure: AttributionFigure | None = None
        self.box = W.VBox([], layout=W.Layout(width="100%", display="none"))
        self.box.add_class("icl-attribution")

    @property
    def on(self) -> bool:
        return bool(self.enabled.value)

    def layout_for(self, on: bool) -> None:
        if on and self.figure is None:
            self.figure = AttributionFigure()
            self.box.children = [self.part, self.message, self.figure.fig, self.writes]
        self.box.layout.display = None if on else "none"

    def shown_part(self, at: PatchAttribution | None) -> str:
        """The part drawn: the toggle's, except the correction for a parallel block (its patch is zero)."""
        return "correction" if at is not None and at.parallel else self.part.value

    def show(self, at: PatchAttribution | None, writes: PatchWrites | None, layer: int, message: str = "") -> None:
        if self.figure is None:
            return
        part = self.shown_part(at)
        note = message or ("" if at is None else at.note())
        if at is not None and at.sources:
            row = at.layers.index(layer)
            residual = float((at.patch_residual if part == "patch" else at.correction_residual)[row])
            note += (f" · layer {layer}: ‖ΔW‖ {float(at.patch_norm[row]):.3g}, correction norm "
                     f"{float(at.correction_norm[row]):.3g}; shares sum to 1 {residual:+.1e}")
        self.message.value = f"<small>{html.escape(note)}</small>"
        self.figure.show(at, layer, part)
        self.writes.value = writes_html(writes, part) if at is not None and at.sources else ""
