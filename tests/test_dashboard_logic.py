"""Dashboard logic without a browser: what the figures hold after typing is exactly what
the library returns for that text; a burst of keystrokes ends on the last text with
nothing older drawn after it; bad input (empty text, unknown model, long paste) is shown,
not raised."""
from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import icl_lens
from dashboard_helpers import type_prompt
from icl_lens.core._factored import gram_cosine
from icl_lens.model._attention import attention_pattern
from icl_lens.ui._panels import short_label, token_label

TOL = dict(rtol=1e-5, atol=1e-6)


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=float)




def _check_matches_library(d, model, text: str, layer: int, threshold: float = 3.5) -> None:
    patches = icl_lens.token_patches(model, text)
    n = patches.n_positions
    # token strip: one entry per position, coloured by the mean patch norm over layers
    strip = d.strip.widget
    assert strip.tokens == list(patches.tokens)
    np.testing.assert_allclose(strip.values, patches.norms().mean(0).double().numpy(), **TOL)
    flags = icl_lens.spike_scores(patches, threshold=threshold)
    assert strip.flags == flags.flags.tolist()
    assert strip.selected == n - 1  # the query follows the last token
    # heatmap: layer × position, keyed by position, labelled with the token text
    heat = d.heatmap.fig.data[0]
    np.testing.assert_allclose(_arr(heat.z), patches.norms().double().numpy(), **TOL)
    assert list(heat.x) == list(range(n))
    labels = [f"{p}: {token_label(t)}" for p, t in enumerate(patches.tokens)]  # the hover text, every layer's row
    assert np.array(heat.text, dtype=object).tolist() == [labels] * patches.n_layers
    axis = d.heatmap.fig.layout.xaxis
    assert axis.tickvals[-1] == n - 1 and axis.ticktext[-1] == short_label(patches.tokens[-1])
    # alignment matrix of the chosen layer
    cos = gram_cosine(patches.stacked_u()[layer], patches.v[layer])
    np.testing.assert_allclose(_arr(d.alignment.trace.z), cos.double().numpy(), **TOL)
    # trajectory of the last token: meta-gradient norms and consecutive alignment per layer
    traj = icl_lens.trajectory(model, text, query=n - 1)
    norms = traj.meta_gradient_norms().double().numpy()
    align = traj.consecutive_alignment().double().numpy()
    fit = traj.decay_fit()
    # The dashboard computes the trajectory another way (prefix keys and values from its PatchSession, R δ
    # instead of W δ: equal in float64, tests/test_incremental.py and test_trajectory.py); in float32 the
    # meta-gradients are differences of nearly equal patches, and the library's own float32 values are
    # 1e-5..5e-5 off the float64 ones, so the panel is checked to that accuracy.
    TRAJ = dict(rtol=1e-4, atol=1e-4)
    for row, l in enumerate(traj.layers):
        trace = d.trajectory_panel.norms[l]
        np.testing.assert_allclose(_arr(trace.y), norms[row], **TRAJ)
        assert list(trace.x) == list(range(1, norms.shape[1] + 1))
        assert f"α={float(fit.exponent[row]):.2f}" in trace.name
        np.testing.assert_allclose(_arr(d.trajectory_panel.steps[l].y), align[row], **TRAJ)
    np.testing.assert_allclose(_arr(d.trajectory_panel.exponents.y), fit.exponent.double().numpy(), **TRAJ)
    # attention pattern of the chosen layer (all heads; the panel draws the chosen one)
    torch.testing.assert_close(d.shown.attention, attention_pattern(model, text, layer))
    assert f"data-layer='{layer}'" in d.attention.html.value
    assert d.shown.text == text and "Recomputed" in d.status.value
    assert sum(len(hp.fwd_hooks) for hp in model.hook_dict.values()) == 0, "a hook leaked"


def test_figures_hold_library_values(load, dash_factory):
    model = load("tiny-llama")
    d = dash_factory(model)
    type_prompt(d, "abc abc abd")
    _check_matches_library(d, model, "abc abc abd", layer=0)
    d.layer.value = 2
    assert d.wait(60)
    _check_matches_library(d, model, "abc abc abd", layer=2)
    # appending reuses the prefix (PatchSession) and still matches a fresh computation
    type_prompt(d, "abc abc abd ab")
    n_old, n_new = (icl_lens.token_patches(model, t).n_positions for t in ("abc abc abd", "abc abc abd ab"))
    assert f"{n_new - n_old} of {n_new} positions (PatchSession)" in d.status.value
    _check_matches_library(d, model, "abc abc abd ab", layer=2)
    # correction-norm toggle swaps the heatmap to ‖attn_C − attn_0‖
    d.heatmap.kind.value = d.heatmap.KINDS[1]
    patches = icl_lens.token_patches(model, "abc abc abd ab")
    np.testing.assert_allclose(_arr(d.heatmap.fig.data[0].z), patches.correction_norms().double().numpy(), **TOL)


def test_click_selects_query_and_threshold_reflags(load, dash_factory):
    model = load("tiny-gpt2")
    d = dash_factory(model)
    text = "one two one two one two one two one two one two one two XYZ!"
    type_prompt(d, text)
    d.strip.widget.selected = 5  # what a click in the browser does
    assert d.wait(60)
    assert d.shown.query == 5 and d.shown.trajectory.query == 5 and not d.follow_last.value
    ref = icl_lens.trajectory(model, text, query=5).meta_gradient_norms().double().numpy()
    np.testing.assert_allclose(_arr(d.trajectory_panel.norms[0].y), ref[0], **TOL)
    d.threshold.value = 1.5
    assert d.wait(60)
    expected = icl_lens.spike_scores(icl_lens.token_patches(model, text), threshold=1.5).flags.tolist()
    assert d.strip.widget.flags == expected
    d.follow_last.value = True
    assert d.wait(60)
    assert d.shown.query == d.shown.patches.n_positions - 1


def test_trajectory_order_control_draws_the_absorb_trajectory(load, dash_factory):
    model = load("tiny-llama")
    d = dash_factory(model)
    text = "ab=1;cd=2;ef=3;ab=1;cd="
    type_prompt(d, text)
    assert d.shown.trajectory.order == "prefix"
    d.trajectory_panel.order.value = "absorb"
    assert d.wait(60)
    assert d.shown.trajectory.order == "absorb" and "absorb order" in d.status.value
    ref = icl_lens.trajectory(model, text, query=d.shown.query, order="absorb").meta_gradient_norms().double().numpy()
    other = icl_lens.trajectory(model, text, query=d.shown.query).meta_gradient_norms().double().numpy()
    assert np.abs(ref - other).max() > 1e-3  # the two orders draw different curves
    np.testing.assert_allclose(_arr(d.trajectory_panel.norms[1].y), ref[1], **TOL)


def test_burst_of_keystrokes_ends_on_last_text(load, dash_factory):
    model = load("tiny-gemma3")
    d = dash_factory(model, debounce_s=0.03)
    final = "The quick brown fox jumps over the lazy dog, twice"
    rng = random.Random(0)
    for k in range(1, len(final) + 1):  # typing, with the irregular gaps of a person
        d.set_prompt(final[:k])
        time.sleep(rng.choice([0.0, 0.0, 0.01, 0.05]))
    last_generation = d.runner.generation
    assert d.wait(180)
    drawn = d.runner.drawn
    assert drawn == sorted(set(drawn)), "a stale result was drawn after a newer one"
    assert drawn[-1] == last_generation
    texts = [t for _, t in d.shown.texts_drawn]
    first_final = texts.index(final)
    assert all(t == final for t in texts[first_final:]), "an older text was drawn after the last one"
    assert len(set(texts)) < len(final), "debouncing should skip intermediate texts"
    n = icl_lens.token_patches(model, final).n_positions
    assert len(d.strip.widget.tokens) == n and len(d.heatmap.fig.data[0].x) == n
    assert d.heatmap.fig.layout.xaxis.ticktext[-1] == short_label(final[-1])


def test_empty_text_shows_empty_state(load, dash_factory):
    d = dash_factory(load("tiny-gpt2"))
    type_prompt(d, "hello")
    for empty in ("", "   \n"):
        type_prompt(d, empty)
        assert d.strip.widget.tokens == [] and len(d.heatmap.fig.data[0].z) == 0
        assert all(len(t.y) == 0 for t in d.trajectory_panel.norms)
        assert "empty" in d.status.value and "Traceback" not in d.status.value
        assert d.shown.patches is None


def test_unknown_model_keeps_previous_one(load, dash_factory):
    model = load("tiny-gpt2")
    d = dash_factory(model)
    type_prompt(d, "hello")
    d.model_box.value = "no-such-org/no-such-model-123"
    assert d.wait(60)
    assert "Could not load model" in d.status.value and "Keeping tiny-gpt2" in d.status.value
    assert d.model is model and d.model_box.value == "tiny-gpt2"
    assert d.strip.widget.tokens == list(icl_lens.token_patches(model, "hello").tokens)
    # a known model switches, and the controls follow its shape
    d.model_box.value = "tiny-gemma3"
    assert d.wait(120)
    assert d.analyzer.name == "tiny-gemma3" and d.layer.max == d.model.cfg.n_layers - 1
    assert len(d.heatmap.fig.data[0].y) == d.model.cfg.n_layers == len(d.trajectory_panel.norms)


def test_threshold_starts_at_the_models_calibrated_value(load, dash_factory, tmp_path, monkeypatch):
    from icl_lens.spikes import _thresholds as spike_thresholds

    d = dash_factory(load("tiny-gpt2"))
    assert d.threshold.value == icl_lens.DEFAULT_SPIKE_THRESHOLD  # no calibration for tiny models
    assert "default; no calibration for tiny-gpt2" in d.threshold_note.value  # and it says so
    rows = lambda t: {"thresholds": [{"statistic": "mean", "window": 16, "layers": "all", "threshold": t}]}  # noqa: E731
    path = tmp_path / "thresholds.json"
    path.write_text(json.dumps({"models": {"tiny-gpt2": rows(0.75), "tiny-gemma3": rows(1.25)}}))
    monkeypatch.setattr(spike_thresholds, "THRESHOLDS_FILE", path)
    model = load("tiny-gpt2")
    d = dash_factory(model)
    text = "one two one two one two one two one two one two one two XYZ!"
    type_prompt(d, text)
    assert d.threshold.value == 0.75 and "calibrated for tiny-gpt2" in d.threshold_note.value
    assert d.strip.widget.flags == icl_lens.spike_scores(icl_lens.token_patches(model, text), threshold=0.75).flags.tolist()
    d.model_box.value = "tiny-gemma3"  # still at the old model's default: the slider follows the new model's
    assert d.wait(120)
    assert d.threshold.value == 1.25 and d.shown.spikes.threshold == 1.25
    assert "calibrated for tiny-gemma3" in d.threshold_note.value
    d.threshold.value = 2.0  # moved by hand: a model switch keeps it
    assert d.wait(60)
    d.model_box.value = "tiny-gpt2"
    assert d.wait(120)
    assert d.threshold.value == 2.0 and d.shown.spikes.threshold == 2.0


def test_long_paste_is_cut_to_context_with_notice(load, dash_factory):
    model = load("tiny-gpt2")
    d = dash_factory(model)
    n_ctx = model.cfg.n_ctx
    text = "abcdefghij" * 60  # 600 bytes > 256 context
    type_prompt(d, text)
    assert len(d.strip.widget.tokens) == n_ctx and len(d.heatmap.fig.data[0].x) == n_ctx
    assert f"first {n_ctx}" in d.notice.value and "cut" in d.notice.value
    type_prompt(d, "short")
    assert d.notice.value == ""


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_exports_write_html_png_svg_csv_at_their_sizes(load, dash_factory, tmp_path):
    from icl_lens.ui._export import EXPORT_WIDTH

    d = dash_factory(load("tiny-llama"), export_dir=tmp_path)
    type_prompt(d, "abc abc")
    (html,) = d.export_html()
    assert "plotly-graph-div" in html.read_text() and "icl_lens:figures" in html.read_text()
    norms, traj, fit, preds = d.export_csv()
    import pandas as pd

    frame = pd.read_csv(norms)
    assert len(frame) == d.model.cfg.n_layers * d.shown.patches.n_positions and "flagged" in frame
    assert set(pd.read_csv(traj)["metric"]) >= {"meta_gradient_norm", "consecutive_alignment"}
    assert len(pd.read_csv(fit)) == d.model.cfg.n_layers
    assert set(pd.read_csv(preds)["context"]) == {"with context", "without context"}
    # images at the layout's height and the export width, not plotly's 700 × 500 default
    (png,) = d.export_png()  # kaleido drives /usr/bin/chromium
    assert _png_size(png) == (EXPORT_WIDTH, d.grid.fig.layout.height)
    (svg,) = d.export_svg()
    head = svg.read_text()[:400]
    assert f'width="{EXPORT_WIDTH}" height="{d.grid.fig.layout.height}"' in head
    (attention,) = d.export_attention()
    assert attention.name == "attention_L0_H0.html" and "circuits-vis" in attention.read_text()
    # every export button offers the files as a browser download (a data: URL, no server route)
    d.export_buttons[4].click()
    assert d.downloads.value.count("download='") == 4 and "href='data:text/csv;base64," in d.downloads.value


def test_save_html_is_one_self_contained_file(load, dash_factory, tmp_path):
    model = load("tiny-llama")
    d = dash_factory(model, export_dir=tmp_path)
    type_prompt(d, "abc abc abd")
    path = d.save_html(tmp_path / "view.html")
    page = path.read_text()
    assert page.count("icl_lens:figures") == 1 and "class='icl-token" in page
    assert not re.findall(r"<(?:script|link|img)[^>]*(?:src|href)=", page)  # nothing loaded from elsewhere
    assert page.count("<script") >= 2 and len(page) > 3_000_000  # plotly.js inlined
    assert "circuits-vis" in page and "icl-predictions" in page
    tokens = icl_lens.token_patches(model, "abc abc abd").tokens
    from icl_lens.ui._panels import token_label
    import html as html_lib

    for t in set(tokens):
        assert f">{html_lib.escape(token_label(t))}</span>" in page
    d.export_buttons[0].click()  # the button writes export_dir/dashboard_view.html and offers it
    assert (tmp_path / "dashboard_view.html").exists() and "download='dashboard_view.html'" in d.downloads.value


def test_predictions_with_and_without_context(load, dash_factory):
    model = load("tiny-llama")
    d = dash_factory(model)
    text = "ab=1;cd=2;ef=3;ab=1;cd="
    type_prompt(d, text)
    ids = model.to_tokens(text)[0]
    for query in (ids.numel() - 1, 6):
        if query != ids.numel() - 1:
            d.strip.widget.selected = query  # a click
            assert d.wait(60)
        pred = d.shown.predictions
        assert pred.query == query == d.shown.query
        k = d.predictions.k.value
        with torch.no_grad():  # independent forwards: the prompt up to the query; BOS + query alone
            full = model(ids[None, : query + 1])[0, -1]
            kept = torch.tensor([0, query])
            alone = model(ids[kept][None], position_ids=kept[None])[0, -1]
        assert pred.kept_positions == (0, query)
        for side, logits in (("with context", full), ("without context", alone)):
            top = torch.topk(torch.softmax(logits.double(), -1), k)
            assert pred.token_ids[side].tolist() == top.indices.tolist(), side
            np.testing.assert_allclose(pred.probabilities[side].numpy(), top.values.numpy(), **TOL)
        assert pred.token_ids["with context"].tolist() != pred.token_ids["without context"].tolist()
        assert pred.patched_error < 1e-4  # kept-only + every patch = the contextual forward
        shown = d.predictions.html.value
        assert f"data-query='{query}'" in shown and shown.count("<tr>") == 2 * k
    d.predictions.k.value = 3
    assert d.wait(60)
    assert len(d.shown.predictions.tokens["with context"]) == 3


def test_predictions_are_drawn_before_their_identity_check(load, dash_factory):
    """Issue 41: first paint needs the predictions, not the check under them (a forward with every patch, more
    than the predictions cost): they are drawn "checking…" first, and the check is drawn last, after the refined
    trajectory, equal to :func:`identity_error`; a cached prompt keeps its check."""
    from icl_lens.ui._predictions import identity_error

    model = load("tiny-llama")
    d = dash_factory(model)
    drawn, show = [], d.predictions.show

    def record(pred, *args, **kwargs):
        drawn.append((pred, d.trajectory_panel.message.value, kwargs))
        return show(pred, *args, **kwargs)

    d.predictions.show = record
    text = "ab=1;cd=2;ef=3;ab=1;cd="
    type_prompt(d, text)
    first, checked = [p for p, _, _ in drawn[-2:]]
    assert first.patched_error is None and checked.patched_error is not None
    assert first.token_ids["without context"].tolist() == checked.token_ids["without context"].tolist()
    t = d.timeline[d.runner.generation]
    assert t["predictions"] < t["first_paint"] <= t["phase2"] < t["checked"]
    assert "max |Δlogit|" in d.predictions.html.value and "checking" not in d.predictions.html.value
    assert "identity check" in d.status.value and "next…" not in d.status.value
    ids = model.to_tokens(text)[0]
    with torch.no_grad():
        contextual = model(ids[None])[0, -1]
    assert checked.patched_error == pytest.approx(identity_error(model, ids, d.shown.patches, ids.numel() - 1,
                                                                 contextual), abs=1e-5)
    assert checked.patched_error < 1e-4
    from icl_lens.ui._predictions import predictions_html

    assert "checking…" in predictions_html(first)
    n = len(drawn)
    type_prompt(d, text + "1")
    type_prompt(d, text)  # back: the checked predictions come from the cache, no second check
    assert drawn[-1][0] is checked and len(drawn) == n + 3 and "identity check" not in d.status.value


def test_predictions_take_their_kept_only_logits_from_the_trajectory(load, dash_factory, monkeypatch):
    """Issue 41: the predictions' "without context" logits come from the trajectory's step-0 copy (``readout``: the
    unpatched kept-only forward) and go through the unembedding with the contextual row; the only kept-only forward
    left is the identity check's (every patch on), also after the top-k changes (the cached trajectory keeps the
    row). In the absorb order (whose step 0 is the full context) they run their own. The values are compared with
    independent forwards in ``test_predictions_with_and_without_context``."""
    import icl_lens.patches._kept_only as ko
    import icl_lens.ui._predictions as pr

    model = load("tiny-llama")
    d = dash_factory(model)
    forwards, run = [], pr.kept_only_logits_many
    monkeypatch.setattr(pr, "kept_only_logits_many",
                        lambda m, rows, **kw: forwards.append([ko._patched(r[1]) for r in rows]) or run(m, rows, **kw))
    text = "ab=1;cd=2;ef=3;ab=1;cd=2;ef=3;ab="
    type_prompt(d, text)
    assert forwards == [[True]] and d.shown.trajectory.kept_only_hidden is not None
    d.predictions.k.value = 3
    assert d.wait(60) and forwards == [[True]] * 2 and len(d.shown.predictions.tokens["without context"]) == 3
    d.trajectory_panel.order.value = "absorb"
    type_prompt(d, text + "1")
    assert forwards[2:] == [[False], [True]]


def test_a_zero_patch_runs_the_kept_only_forward_without_edits(load, monkeypatch):
    """Rows whose patches are all zero (the predictions' "without context") need no hooks: their forward gets no
    edits, and gives the logits the zero edits gave; a batch with a real patch still gets its edits."""
    import icl_lens.patches._kept_only as ko

    model = load("tiny-llama", torch.float64)
    ids = model.to_tokens("ab=1;cd=2;ef=3;ab=")[0]
    patches = icl_lens.token_patches(model, ids)
    bare = patches.keep_parts(w_in=False, correction=False)
    q = ids.numel() - 1
    seen, applied = [], ko.edits_applied

    def record(model, edits, **kwargs):
        seen.append(edits)
        return applied(model, edits, **kwargs)

    monkeypatch.setattr(ko, "edits_applied", record)
    alone = ko.kept_only_logits_many(model, [(ids, bare, q)])
    both = ko.kept_only_logits_many(model, [(ids, bare, q), (ids, patches, q)])
    assert seen[0] == {} and len(seen[1]) == model.cfg.n_layers
    torch.testing.assert_close(alone[0], both[0], rtol=1e-12, atol=1e-12)  # the zero edits change nothing
    with torch.no_grad():
        contextual = model(ids[None])[0, -1]
    torch.testing.assert_close(both[1], contextual, rtol=1e-9, atol=1e-9)


def test_layer_range_and_per_layer_colour_scale(load, dash_factory):
    from icl_lens.ui._layer_view import SCALES

    model = load("tiny-llama")
    d = dash_factory(model)
    text = "abc abc abd"
    type_prompt(d, text)
    norms = icl_lens.token_patches(model, text).norms().double().numpy()
    d.layer_controls.range.value = (1, 2)
    heat = d.heatmap.fig.data[0]
    np.testing.assert_allclose(_arr(heat.z), norms[1:3], **TOL)
    assert list(heat.y) == [1, 2]
    np.testing.assert_allclose(d.strip.widget.values, norms[1:3].mean(0), **TOL)
    assert [t.visible for t in d.trajectory_panel.norms] == [False, True, True]
    d.layer_controls.scale.value = SCALES[1]
    np.testing.assert_allclose(_arr(heat.z), norms[1:3] / norms[1:3].max(1, keepdims=True), **TOL)
    np.testing.assert_allclose(_arr(heat.customdata), norms[1:3], **TOL)  # the hover keeps the raw norm
    assert (heat.zmin, heat.zmax) == (0.0, 1.0) and "/max" in heat.colorbar.title.text
    d.layer_controls.scale.value = SCALES[0]
    d.layer_controls.range.value = (0, 2)
    np.testing.assert_allclose(_arr(heat.z), norms, **TOL)
    assert all(t.visible for t in d.trajectory_panel.norms)


def test_a_draw_that_read_the_old_layer_range_cannot_paint_over_the_new_one(load, dash_factory):
    """The worker reads the layer range inside a draw. When the range moves meanwhile, the main thread's redraw waits
    for that draw and paints last, so the panels show the new range (the test above failed once this way, with the
    worker's trajectory drawn from the range it had read before the test moved it)."""
    import threading

    from icl_lens.ui._layer_view import show_layer_range

    model = load("tiny-llama")
    d = dash_factory(model)
    type_prompt(d, "abc abc abd")
    d.layer_controls.range.value = (1, 2)
    assert d.wait(60)
    d.runner.debounce_s = 600.0  # the range change below queues a request: it stays queued
    read = threading.Event()

    def stale_draw():
        view = d.layer_controls.view(d.analyzer.n_layers)  # layers 1-2, read before the range moves
        read.set()
        time.sleep(1.0)  # the main thread moves the range meanwhile
        show_layer_range(d.trajectory_panel, view)

    worker = threading.Thread(target=d.runner.draw, args=(d.runner.generation, stale_draw))
    worker.start()
    assert read.wait(30)
    d.layer_controls.range.value = (0, 2)
    worker.join()
    assert [t.visible for t in d.trajectory_panel.norms] == [True, True, True]


def test_compare_mode_shows_b_and_the_difference_on_shared_tokens(load, dash_factory):
    from icl_lens.ui._compare import shared_tokens

    model = load("tiny-llama")
    d = dash_factory(model)
    a_text, b_text = "ab=1;cd=2;ef=3;ab=", "ab=1;XY=7;ef=3;ab="
    type_prompt(d, a_text)
    assert d.compare.figure is None and d.compare.text.layout.display == "none"
    d.compare.enabled.value = True
    d.compare.text.value = b_text
    assert d.wait(120) and d.last_error == "", d.last_error
    assert d.compare.text.layout.display is None and d.text.layout.width == "50%"  # side by side
    pa, pb = icl_lens.token_patches(model, a_text), icl_lens.token_patches(model, b_text)
    assert d.compare.strip.tokens == list(pb.tokens) and d.strip.widget.tokens == list(pa.tokens)
    np.testing.assert_allclose(d.compare.strip.values, pb.norms().mean(0).double().numpy(), **TOL)
    heat_a, heat_b, diff = d.compare.figure.fig.data
    np.testing.assert_allclose(_arr(heat_a.z), pa.norms().double().numpy(), **TOL)
    np.testing.assert_allclose(_arr(heat_b.z), pb.norms().double().numpy(), **TOL)
    pairs = d.shown.comparison.pairs
    assert pairs == tuple(shared_tokens(pa.token_ids, pb.token_ids))
    assert all(int(pa.token_ids[i]) == int(pb.token_ids[j]) for i, j in pairs)
    assert len(pairs) < min(pa.n_positions, pb.n_positions)  # the changed tokens are left out
    expected = np.stack([pa.norms()[:, i].double().numpy() - pb.norms()[:, j].double().numpy() for i, j in pairs], 1)
    np.testing.assert_allclose(_arr(diff.z), expected, **TOL)
    prefix = d.shown.comparison.shared_prefix
    assert prefix == 6 and np.abs(_arr(diff.z)[:, :prefix]).max() < 1e-5  # a patch sees only its own prefix
    assert np.abs(_arr(diff.z)[:, prefix:]).max() > 1e-3  # the same tokens after a different context differ
    assert "compare_figures" in d.figures()
    # the correction-norm toggle switches the compare figure too
    d.heatmap.kind.value = d.heatmap.KINDS[1]
    np.testing.assert_allclose(_arr(heat_b.z), pb.correction_norms().double().numpy(), **TOL)
    d.compare.enabled.value = False
    assert d.wait(60)
    assert d.compare.text.layout.display == "none" and d.compare.box.layout.display == "none"
    assert "compare_figures" not in d.figures() and d.shown.comparison is None


def test_gemma_dashboard_matches_library(gemma, dash_factory):
    d = dash_factory(gemma)
    text = "The capital of France is Paris. The capital of Italy is"
    type_prompt(d, text)
    patches = icl_lens.token_patches(gemma, text)
    assert d.strip.widget.tokens == list(patches.tokens)
    np.testing.assert_allclose(_arr(d.heatmap.fig.data[0].z), patches.norms().double().numpy(), rtol=1e-4, atol=1e-5)
    assert len(d.trajectory_panel.norms) == 18
    traj = icl_lens.trajectory(gemma, text, query=patches.n_positions - 1)
    np.testing.assert_allclose(_arr(d.trajectory_panel.norms[17].y),
                               traj.meta_gradient_norms()[17].double().numpy(), rtol=1e-4, atol=1e-5)


def test_a_keystroke_tokenises_and_checks_its_prompt_once(load, monkeypatch):
    """One tokenisation and one check of the ids per keystroke: the patches, the trajectory of a query (a prefix
    of the ids), the attention pattern and who wrote the query's patch take the ids as encoded."""
    from icl_lens.model import _prompts
    from icl_lens.ui._analysis import PromptAnalyzer

    model = load("tiny-llama")
    analyzer = PromptAnalyzer(model)
    counts = {"tokenised": 0, "checked": 0}
    to_tokens, remember = model.to_tokens, _prompts._remember

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(model, "to_tokens", counted("tokenised", to_tokens))
    monkeypatch.setattr(_prompts, "_remember", counted("checked", remember))
    prompt = analyzer.encode("one two three four five six")
    analyzer.patches(prompt)
    analyzer.trajectory(prompt, 4)
    analyzer.attention(prompt, 0)
    analyzer.attribution(prompt, 4)
    assert counts == {"tokenised": 1, "checked": 1}
    with pytest.raises(icl_lens.PromptError, match="empty"):  # the one empty-prompt message
        analyzer.encode("   ")


def _record_trajectories(d) -> list:
    """The trajectories the panel is asked to draw, in order."""
    drawn, show = [], d.trajectory_panel.show

    def record(trajectory, *args, **kwargs):
        drawn.append(trajectory)
        return show(trajectory, *args, **kwargs)

    d.trajectory_panel.show = record
    return drawn


def test_trajectory_is_drawn_coarse_then_refined(load, dash_factory):
    """Issue 41: after a keystroke the trajectory is drawn first at a few log-spaced prefix lengths, exactly the
    full trajectory's W_i there (float64), then refined to the full trajectory, equal to a fresh one; a prompt
    whose full trajectory is cached is drawn refined at once."""
    from icl_lens.dynamics._prefix_variants import log_spaced_steps
    from icl_lens.ui._analysis import COARSE_POINTS

    model = load("tiny-llama", torch.float64)
    d = dash_factory(model)
    drawn = _record_trajectories(d)
    text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
    for typed in (text, text + " six"):  # the first prompt, then an append
        start = len(drawn)
        type_prompt(d, typed)
        coarse, refined = drawn[start:]
        full = icl_lens.trajectory(model, typed)  # fresh: every prefix length, no session, W δ itself
        assert coarse.coarse and coarse.steps == log_spaced_steps(full.n_context, COARSE_POINTS)
        assert 0 in coarse.steps and full.n_context in coarse.steps and len(coarse.steps) < full.n_context / 2
        cols = list(coarse.steps)
        for field in ("v", "correction"):
            x, y = getattr(coarse, field), getattr(full, field)[:, cols]
            assert (x - y).abs().max() <= 1e-10 * y.abs().max(), field
        assert coarse.compact and refined.compact  # R δ, not W δ: compared through what the panel draws
        assert not refined.coarse and refined is d.shown.trajectory
        got, want = refined.step_metrics(), full.step_metrics()
        sparse = coarse.step_metrics()
        torch.testing.assert_close(sparse.meta_gradient_norms,
                                   want.meta_gradient_norms[:, [i - 1 for i in sparse.norm_steps]], rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(sparse.consecutive_alignment,
                                   want.consecutive_alignment[:, [i - 2 for i in sparse.alignment_steps]],
                                   rtol=1e-6, atol=1e-6)
        # R δ (the refined, compact) against W δ: cosines of tiny meta-gradients amplify the rounding
        torch.testing.assert_close(got.meta_gradient_norms, want.meta_gradient_norms, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(got.consecutive_alignment, want.consecutive_alignment, rtol=1e-6, atol=1e-6)
        # the panel holds the refined curves, at every context length
        for row, layer in enumerate(refined.layers):
            assert list(d.trajectory_panel.norms[layer].x) == list(range(1, full.n_context + 1))
            np.testing.assert_allclose(_arr(d.trajectory_panel.norms[layer].y), want.meta_gradient_norms[row].numpy(),
                                       rtol=1e-8, atol=1e-10)
        assert "coarse trajectory" in d.status.value and d.trajectory_panel.message.value == ""
    start = len(drawn)
    type_prompt(d, text)  # back: its full trajectory is cached, no coarse drawing
    assert len(drawn) == start + 1 and not drawn[-1].coarse


def test_coarse_trajectory_panel_draws_its_exact_points(load, dash_factory):
    """While coarse, the panel's curves sit at the context lengths whose meta-gradient the coarse steps hold."""
    model = load("tiny-llama")
    d = dash_factory(model)
    text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
    type_prompt(d, text)
    prompt = d.analyzer.encode(text)
    query = d.shown.query
    coarse, _ = d.analyzer.trajectory(prompt, query, steps=d.analyzer.coarse_steps(prompt, query))
    d.trajectory_panel.show(coarse, query, d.shown.patches.tokens, d.analyzer.n_layers, "coarse")
    metrics = coarse.step_metrics()
    full = icl_lens.trajectory(model, text).meta_gradient_norms()
    for layer in coarse.layers:
        assert list(d.trajectory_panel.norms[layer].x) == list(metrics.norm_steps)
        np.testing.assert_allclose(_arr(d.trajectory_panel.norms[layer].y),
                                   full[layer, [i - 1 for i in metrics.norm_steps]].double().numpy(), rtol=1e-4,
                                   atol=1e-6)


def test_refined_trajectory_computes_only_the_steps_the_coarse_one_lacks(load, monkeypatch):
    """Issue 41: refining the coarse trajectory runs the query copies of the missing prefix lengths only (the
    coarse ones are not computed twice); without a coarse one cached, the full trajectory runs every step."""
    import icl_lens.ui._analysis as analysis

    model = load("tiny-llama")
    asked = []
    real = analysis.trajectory
    monkeypatch.setattr(analysis, "trajectory", lambda *a, **k: asked.append(k["steps"]) or real(*a, **k))
    a = analysis.PromptAnalyzer(model)
    prompt = a.encode("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen")
    query = prompt.ids.numel() - 1
    steps = a.coarse_steps(prompt, query)
    a.patches(prompt)
    coarse, _ = a.trajectory(prompt, query, steps=steps)
    full, fresh = a.trajectory(prompt, query)
    assert fresh and not full.coarse and full.n_context + 1 > len(steps)
    assert asked == [steps, tuple(i for i in range(full.n_context + 1) if i not in steps)]
    other = a.encode("one two three four five six seven eight nine ten eleven twelve thirteen fourteen")
    a.trajectory(other, other.ids.numel() - 1)
    assert asked[-1] is None


def test_predictions_take_the_contextual_logits_from_phase_one(load, dash_factory):
    """Issue 41: the contextual logits are phase 1's pass's last row through the unembedding (no second forward):
    after appends and an edit in the middle they equal a fresh forward's (tiny-gemma2: soft-capped logits), and
    the top-k drawn are a fresh forward's."""
    model = load("tiny-gemma2")
    d = dash_factory(model)
    for text in ("ab=1;cd=2;ef", "ab=1;cd=2;ef=", "ab=1;cd=2;ef=3", "ab=1;cd=7;ef=3"):
        type_prompt(d, text)
        ids = model.to_tokens(text)[0]
        session = d.analyzer.session
        assert session.logits_at(ids, ids.numel() - 1) is session.last_logits  # the pass's own row
        with torch.no_grad():
            fresh = model(ids[None])[0, -1]
        torch.testing.assert_close(session.last_logits, fresh, rtol=1e-5, atol=1e-5)
        pred = d.shown.predictions
        top = torch.topk(torch.softmax(fresh.double(), -1), d.predictions.k.value)
        assert pred.query == ids.numel() - 1 and pred.token_ids["with context"].tolist() == top.indices.tolist(), text
        np.testing.assert_allclose(pred.probabilities["with context"].numpy(), top.values.numpy(), **TOL)


def test_phase_one_needs_no_qr_of_the_dense_weights(load, dash_factory):
    """Issue 41: the first keystroke on Gemma spent ~8 s in the QR of every layer's dense weights (the spike flags
    read the patch norms). The norms of a keystroke's new positions come from ``W δ``; only the alignment
    matrix's layer needs ``R``."""
    from icl_lens.patches._capture import dense_weights

    model = load("tiny-gemma3")
    d = dash_factory(model)
    weights = dense_weights(model)
    weights._r.clear()
    a = d.analyzer
    prompt = a.encode("The quick brown fox jumps over the lazy dog")
    patches, _ = a.patches(prompt)
    flags = icl_lens.spike_scores(patches)
    assert flags.scores.shape == (patches.n_positions,) and not weights._r


def test_layer_axes_thin_their_labels_alike_in_every_heatmap():
    """30 layers in a heatmap row's height overlap: the main heatmap and the three compare heatmaps label every
    2nd layer there (one rule, ``layer_dtick``), and every layer of a short range."""
    from icl_lens.ui._compare import CompareFigure, PromptComparison
    from icl_lens.ui._layer_view import LayerView
    from icl_lens.ui._panels import MAX_LAYER_TICKS, layer_dtick

    counts = (1, MAX_LAYER_TICKS, MAX_LAYER_TICKS + 1, 30, 3 * MAX_LAYER_TICKS + 1)
    assert [layer_dtick(n) for n in counts] == [1, 1, 2, 2, 4]
    gen = torch.Generator().manual_seed(0)
    cmp = PromptComparison(tokens_a=("a", "b", "c"), tokens_b=("a", "x", "c"), values_a=torch.rand(30, 3, generator=gen),
                           values_b=torch.rand(30, 3, generator=gen), pairs=((0, 0), (2, 2)), shared_prefix=1)
    figure = CompareFigure(widget=False)
    for view, step in ((LayerView(0, 29), 2), (LayerView(10, 17), 1)):
        figure.show(cmp, view)
        assert [figure.fig.layout[axis].dtick for axis in ("yaxis", "yaxis2", "yaxis3")] == [step] * 3


def test_decay_exponents_need_enough_steps_and_log_axes_label_1_2_5(load, dash_factory):
    """Through two meta-gradient norms any line fits (R² = 1): a query with fewer than ``MIN_FIT_STEPS`` context
    steps gets no exponent bar and a title that says why; a longer context gets the library's exponents."""
    from icl_lens.ui._panels import MIN_FIT_STEPS, FigureGrid

    model = load("tiny-llama")
    d = dash_factory(model)
    short = next(t for t in ("ab=", "ab=1", "ab=1;", "ab=1;c") if len(model.to_tokens(t)[0]) == MIN_FIT_STEPS + 1)
    type_prompt(d, short)
    traj = d.shown.trajectory
    assert traj.n_context == MIN_FIT_STEPS - 1 and traj.decay_fit().n_points.max() < MIN_FIT_STEPS
    assert np.isnan(_arr(d.trajectory_panel.exponents.y)).all()
    title = d.trajectory_panel.grid.fig.layout.annotations[FigureGrid.PANELS.index("exponents")]
    assert f"no fit under {MIN_FIT_STEPS}" in title.text
    assert all("no fit" in t.name for t in d.trajectory_panel.norms)
    type_prompt(d, "ab=1;cd=2;ef=3;ab=")
    fit = d.shown.trajectory.decay_fit()
    assert (fit.n_points >= MIN_FIT_STEPS).all()
    np.testing.assert_allclose(_arr(d.trajectory_panel.exponents.y), fit.exponent.double().numpy())
    assert "no fit" not in title.text
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert f"none from fewer than {MIN_FIT_STEPS} nonzero steps" in readme  # the README states the panel's rule
    # the log–log axes are labelled at 1, 2 and 5 of each decade; linear axes keep plotly's own ticks
    axes = [d.trajectory_panel.grid.axis("norms", xy) for xy in "xy"]
    assert [(a.type, a.dtick) for a in axes] == [("log", "D2")] * 2
    d.trajectory_panel.loglog.value = False
    assert [(a.type, a.dtick) for a in axes] == [("linear", None)] * 2
    d.trajectory_panel.loglog.value = True
    assert [(a.type, a.dtick) for a in axes] == [("log", "D2")] * 2
