"""Compare mode: a second prompt B beside the dashboard's prompt A, and their difference on shared tokens.

The token patches of B come from the library (:class:`icl_lens.PatchSession`, a session of
its own so that typing in A and in B each reuse their own prefix). Shared tokens are the
positions matched in order between the two token-id sequences (``difflib``'s longest
matching blocks): pairs ``(p_a, p_b)`` with ``ids_a[p_a] = ids_b[p_b]``. On them the
difference is

    D[l, k] = z_A[l, p_a(k)] − z_B[l, p_b(k)]

for ``z`` the patch norm ``‖ΔW‖_F = ‖u‖·‖v‖`` (or the correction norm) of layer ``l``
(docs/design.md §2; Dherin et al. 2025, arXiv 2507.16003). A token patch depends only on
its own prefix, so ``D`` is exactly zero on a shared prefix: the same token read after a
different context is where the two prompts differ.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import ipywidgets as W
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from jaxtyping import Float
from torch import Tensor

from icl_lens.patches._patch_set import TokenPatches
from icl_lens.patches._incremental import PatchSession
from icl_lens.ui._layer_view import LayerView
from icl_lens.ui._panels import MAX_MATRIX_TICKS, label_rows, layer_dtick, token_axis, token_label
from icl_lens.ui._token_strip import TokenStrip

QUANTITIES = ("patch norm", "correction norm")


def shared_tokens(ids_a, ids_b) -> list[tuple[int, int]]:
    """Positions ``(p_a, p_b)`` holding the same token id, matched in order (longest matching blocks)."""
    a, b = [int(i) for i in ids_a], [int(i) for i in ids_b]
    blocks = difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
    return [(i + k, j + k) for i, j, size in blocks for k in range(size)]


def common_prefix(ids_a, ids_b) -> int:
    """Number of leading positions where the two prompts hold the same tokens."""
    n = 0
    for x, y in zip(ids_a, ids_b):
        if int(x) != int(y):
            break
        n += 1
    return n


@dataclass(frozen=True, eq=False)
class PromptComparison:
    """Per-layer norms of prompts A and B and the pairs of positions they share."""

    tokens_a: tuple[str, ...]
    tokens_b: tuple[str, ...]
    values_a: Float[Tensor, "layer pos_a"]
    values_b: Float[Tensor, "layer pos_b"]
    pairs: tuple[tuple[int, int], ...]
    shared_prefix: int
    quantity: str = QUANTITIES[0]

    @property
    def n_layers(self) -> int:
        return int(self.values_a.shape[0])

    def difference(self) -> Float[Tensor, "layer shared"]:
        """``z_A[:, p_a] − z_B[:, p_b]`` for every shared pair (columns in the order of ``pairs``)."""
        a = [p for p, _ in self.pairs]
        b = [q for _, q in self.pairs]
        return self.values_a[:, a] - self.values_b[:, b]

    def to_frame(self) -> pd.DataFrame:
        diff = self.difference().double().cpu().numpy()
        rows = [{"layer": layer, "position_a": pa, "position_b": pb, "token": self.tokens_a[pa],
                 "in_shared_prefix": pa == pb and pa < self.shared_prefix, "quantity": self.quantity,
                 "value_a": float(self.values_a[layer, pa]), "value_b": float(self.values_b[layer, pb]),
                 "difference": float(diff[layer, k])}
                for layer in range(self.n_layers) for k, (pa, pb) in enumerate(self.pairs)]
        return pd.DataFrame(rows)


def compare_patches(a: TokenPatches, b: TokenPatches, quantity: str = QUANTITIES[0]) -> PromptComparison:
    """The comparison of two prompts' token patches (same model) on their shared tokens."""
    if a.n_layers != b.n_layers:
        raise ValueError(f"the prompts were analysed by different models ({a.n_layers} vs {b.n_layers} layers)")
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity must be one of {QUANTITIES}, got {quantity!r}")
    pick = (lambda p: p.norms()) if quantity == QUANTITIES[0] else (lambda p: p.correction_norms())
    return PromptComparison(tokens_a=a.tokens, tokens_b=b.tokens, values_a=pick(a).detach().cpu(),
                            values_b=pick(b).detach().cpu(), pairs=tuple(shared_tokens(a.token_ids, b.token_ids)),
                            shared_prefix=common_prefix(a.token_ids, b.token_ids), quantity=quantity)


def _colour_bar(domain: tuple[float, float], title: str) -> dict:
    y0, y1 = domain
    return dict(title=dict(text=title, side="top"), x=1.01, xanchor="left", xpad=4, thickness=12,
                y=(y0 + y1) / 2, yanchor="middle", len=y1 - y0, lenmode="fraction")


class CompareFigure:
    """ONE plotly figure of compare mode: A | B heatmaps (one shared colour scale), then A − B on shared tokens."""

    TITLES = ("A: ‖ΔW‖ per layer and token", "B: ‖ΔW‖ per layer and token", "A − B on shared tokens")

    def __init__(self, widget: bool = True):
        from plotly.subplots import make_subplots

        grid = make_subplots(rows=2, cols=2, specs=[[{}, {}], [{"colspan": 2}, None]], row_heights=[0.5, 0.5],
                             vertical_spacing=0.2, horizontal_spacing=0.1, subplot_titles=self.TITLES)
        top, bottom = tuple(grid.get_subplot(1, 1).yaxis.domain), tuple(grid.get_subplot(2, 1).yaxis.domain)
        hover = "layer %{y}<br>%{text}<br>%{customdata:.4g}<extra></extra>"
        for col in (1, 2):
            grid.add_trace(go.Heatmap(z=[], x=[], y=[], coloraxis="coloraxis", hovertemplate=hover), 1, col)
        grid.add_trace(go.Heatmap(z=[], x=[], y=[], colorscale="RdBu", reversescale=True, zmid=0,
                                  colorbar=_colour_bar(bottom, "A − B"), hovertemplate=hover), 2, 1)
        grid.update_layout(meta="icl_lens:compare", height=720, showlegend=False, font=dict(size=11),
                           margin=dict(l=60, r=20, t=40, b=40),
                           coloraxis=dict(colorscale="Viridis", colorbar=_colour_bar(top, "‖ΔW‖")))
        grid.update_annotations(font_size=13)
        for row, col in ((1, 1), (1, 2), (2, 1)):
            grid.update_yaxes(title_text="layer", dtick=1, row=row, col=col)
        self.fig = go.FigureWidget(grid) if widget else go.Figure(grid)
        if widget:
            self.fig._config = dict(responsive=True)

    def show(self, cmp: PromptComparison | None, view: LayerView) -> None:
        fig = self.fig
        heat_a, heat_b, diff = fig.data
        with fig.batch_update():
            if cmp is None:
                for trace in fig.data:
                    trace.z, trace.x, trace.y, trace.text, trace.customdata = [], [], [], [], []
                for i, title in enumerate(self.TITLES):
                    fig.layout.annotations[i].text = title
                return
            view = LayerView(min(view.lo, cmp.n_layers - 1), min(view.hi, cmp.n_layers - 1), view.per_layer)
            symbol = "‖ΔW‖" if cmp.quantity == QUANTITIES[0] else "‖corr‖"
            for trace, values, tokens, xaxis in ((heat_a, cmp.values_a, cmp.tokens_a, "xaxis"),
                                                 (heat_b, cmp.values_b, cmp.tokens_b, "xaxis2")):
                shown, raw = view.rows(values.double().numpy())
                trace.z, trace.customdata, trace.y = shown, raw, view.layers
                trace.x = list(range(len(tokens)))
                trace.text = label_rows(tokens, len(view.layers))
                fig.layout[xaxis].update(token_axis(tokens, max_ticks=MAX_MATRIX_TICKS))
            fig.layout.coloraxis.update(cmin=0.0 if view.per_layer else None, cmax=1.0 if view.per_layer else None,
                                        cauto=not view.per_layer)
            fig.layout.coloraxis.colorbar.title.text = view.colour_title(symbol)
            shown, raw = view.rows(cmp.difference().double().numpy())
            top = float(np.abs(shown).max()) if shown.size else 0.0
            diff.z, diff.customdata, diff.y = shown, raw, view.layers
            diff.zmin, diff.zmax = -(top or 1.0), top or 1.0
            diff.x = list(range(len(cmp.pairs)))
            diff.text = [[f"A {pa} · B {pb}: {token_label(cmp.tokens_a[pa])}" for pa, pb in cmp.pairs]] * len(view.layers)
            diff.colorbar.title.text = view.colour_title("A − B")
            fig.layout.xaxis3.update(token_axis([cmp.tokens_a[pa] for pa, _ in cmp.pairs], title="shared token"))
            for axis in ("yaxis", "yaxis2", "yaxis3"):
                fig.layout[axis].update(range=[view.lo - 0.5, view.hi + 0.5], dtick=layer_dtick(len(view.layers)))
            fig.layout.annotations[0].text = f"A: {symbol} per layer and token"
            fig.layout.annotations[1].text = f"B: {symbol} per layer and token"
            prefix = f" (common prefix: {cmp.shared_prefix}, where A − B = 0)" if cmp.shared_prefix else ""
            fig.layout.annotations[2].text = f"A − B on {len(cmp.pairs)} shared tokens{prefix}"


class CompareView:
    """The compare-mode controls and views: the checkbox, prompt B, B's token strip and the compare figure.

    The figure is a second plotly FigureWidget, made the first time compare mode is turned on
    (a page without compare mode loads plotly's front end once).
    """

    def __init__(self):
        self.enabled = W.Checkbox(value=False, description="compare with a second prompt", indent=False,
                                  layout=W.Layout(width="auto"))
        self.text = W.Textarea(value="", placeholder="Second prompt (B) to compare with…", continuous_update=True,
                               layout=W.Layout(width="50%", height="90px", display="none"))
        self.text.add_class("icl-prompt-b")
        self.strip = TokenStrip(empty_text="Type a second prompt (B).")
        self.strip.layout = W.Layout(width="50%", display="none")
        self.strip.add_class("icl-strip-b")
        self.figure: CompareFigure | None = None
        self.box = W.VBox([], layout=W.Layout(width="100%"))
        self._session: PatchSession | None = None
        self._cache: dict = {}

    @property
    def on(self) -> bool:
        return bool(self.enabled.value)

    def layout_for(self, on: bool, text_a: W.Textarea, strip_a) -> None:
        """Side by side when on (A left, B right); A alone at full width when off."""
        half, hidden = ("50%", None) if on else ("100%", "none")
        text_a.layout.width = half
        strip_a.layout.width = half
        self.text.layout.display = hidden
        self.strip.layout.display = hidden
        if on and self.figure is None:
            self.figure = CompareFigure()
            self.box.children = [self.figure.fig]
        self.box.layout.display = None if on else "none"

    def patches(self, model, prompt) -> tuple[TokenPatches, bool]:
        """Token patches of prompt B (an ``EncodedPrompt``), from B's own PatchSession."""
        key = (id(model), prompt.key)
        if key in self._cache:
            return self._cache[key], False
        if self._session is None or self._session.model is not model:
            self._session, self._cache = PatchSession(model, logits=False), {}
        result = self._session.update(prompt.ids)
        self._cache = {key: result, **dict(list(self._cache.items())[:3])}
        return result, True

    def show(self, patches_a: TokenPatches | None, patches_b: TokenPatches | None, quantity: str,
             view: LayerView) -> PromptComparison | None:
        cmp = None if patches_a is None or patches_b is None else compare_patches(patches_a, patches_b, quantity)
        s = self.strip
        with s.hold_sync():
            if patches_b is None:
                s.tokens, s.values, s.flags, s.selected, s.vmax = [], [], [], -1, 0.0
            else:
                values = view.mean_over_layers(patches_b.norms().detach().cpu().double().numpy())
                s.tokens, s.values, s.flags = list(patches_b.tokens), values, [False] * len(values)
                s.selected, s.vmax = -1, float(max(values) if values else 0.0)
        if self.figure is not None:
            self.figure.show(cmp, view)
        return cmp

