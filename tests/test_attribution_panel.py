"""The dashboard's "who wrote the patch" panel at the logic level (no browser): what it draws is exactly what
``icl_lens.patch_attribution`` returns for the selected query and layer; a click, the layer slider, the
patch/correction toggle and typing update it; a parallel block shows the correction; turning it off stops the
computing; the figure has no fixed width and a bounded height for JupyterLab's output area."""
from __future__ import annotations

import numpy as np

import icl_lens
from dashboard_helpers import type_prompt

TEXT = "ab=1;cd=2;ef=3;ab=1;cd="


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=float)


def _check(d, model, text: str, query: int, layer: int, part: str = "patch") -> None:
    at = icl_lens.patch_attribution(model, text, query)
    shown = d.shown.attribution
    assert shown.position == query and shown.sources == at.sources and d.shown.layer == layer
    heads, summary = d.attribution_view.figure.fig.data
    np.testing.assert_allclose(_arr(heads.z), at.head_map(layer, part).double().numpy(), rtol=1e-4, atol=1e-5)
    assert list(heads.x) == list(at.sources) and list(heads.y) == list(range(model.cfg.n_heads))
    np.testing.assert_allclose(_arr(summary.z), at.layer_heads(part).double().numpy().T, rtol=1e-4, atol=1e-5)
    assert f"layer {layer}" in d.attribution_view.figure.fig.layout.annotations[0].text
    writes = at.writes(model, layers=layer, k=d.predictions.k.value)
    p = ("patch", "correction").index(part)
    assert d.shown.writes.promoted_tokens[p][0][0] == writes.promoted_tokens[p][0][0]
    assert f"what it writes at layer {layer}" in d.attribution_view.writes.value
    assert "first-order, this-layer view" in d.attribution_view.writes.value


def test_panel_shows_the_selected_querys_attribution(load, dash_factory):
    model = load("tiny-llama")
    d = dash_factory(model)
    type_prompt(d, TEXT)
    assert d.attribution_view.figure is None and d.shown.attribution is None  # off: nothing made or computed
    d.attribution_view.enabled.value = True
    assert d.wait(120) and d.last_error == "", d.last_error
    n = len(icl_lens.token_patches(model, TEXT).tokens)
    _check(d, model, TEXT, n - 1, 0)
    fig = d.attribution_view.figure.fig
    assert fig.layout.width is None and fig.layout.height <= 600  # follows the ~900 px output area
    assert "attribution_figures" in d.figures()
    d.strip.widget.selected = 9  # a click in the token strip
    assert d.wait(60) and d.last_error == "", d.last_error
    _check(d, model, TEXT, 9, 0)
    d.layer.value = 2
    assert d.wait(60) and d.last_error == "", d.last_error
    _check(d, model, TEXT, 9, 2)
    d.attribution_view.part.value = "correction"
    _check(d, model, TEXT, 9, 2, part="correction")
    assert "sum to 1" in d.attribution_view.message.value
    d.follow_last.value = True
    type_prompt(d, TEXT + "3;gh")  # typing: the panel follows the new last token
    _check(d, model, TEXT + "3;gh", n + 3, 2, part="correction")
    assert any(key[0] == "attribution" for key in d.analyzer.cache)
    d.attribution_view.enabled.value = False
    assert d.wait(60)
    assert d.attribution_view.box.layout.display == "none" and d.shown.attribution is None
    assert "attribution_figures" not in d.figures()


def test_a_parallel_block_shows_the_correction_and_the_first_token_says_why_it_is_empty(load, dash_factory):
    model = load("tiny-gpt-neox")
    d = dash_factory(model)
    d.attribution_view.enabled.value = True
    type_prompt(d, TEXT)
    assert d.attribution_view.shown_part(d.shown.attribution) == "correction"
    assert "parallel block" in d.attribution_view.message.value
    _check(d, model, TEXT, d.shown.query, 0, part="correction")
    d.strip.widget.selected = 0
    assert d.wait(60) and d.last_error == "", d.last_error
    assert "no removed context" in d.attribution_view.message.value and d.attribution_view.writes.value == ""
    assert len(d.attribution_view.figure.fig.data[0].z) == 0
