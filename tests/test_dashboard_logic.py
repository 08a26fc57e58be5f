"""Dashboard logic without a browser: what the figures hold after typing is exactly what
the library returns for that text; a burst of keystrokes ends on the last text with
nothing older drawn after it; bad input (empty text, unknown model, long paste) is shown,
not raised."""
from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest
import torch

import icl_lens
from icl_lens.core.factored import gram_cosine
from icl_lens.model.attention import attention_pattern
from icl_lens.ui.panels import short_label

TOL = dict(rtol=1e-5, atol=1e-6)


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=float)


@pytest.fixture
def dash_factory():
    made = []

    def make(model, **kwargs):
        kwargs.setdefault("debounce_s", 0.0)
        d = icl_lens.dashboard(model, **kwargs)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def _type(d, text: str) -> None:
    d.set_prompt(text)
    assert d.wait(180), "dashboard did not finish updating"
    assert d.last_error == "", d.last_error


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
    _type(d, "abc abc abd")
    _check_matches_library(d, model, "abc abc abd", layer=0)
    d.layer.value = 2
    assert d.wait(60)
    _check_matches_library(d, model, "abc abc abd", layer=2)
    # appending reuses the prefix (PatchSession) and still matches a fresh computation
    _type(d, "abc abc abd ab")
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
    _type(d, text)
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
    _type(d, text)
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
    _type(d, "hello")
    for empty in ("", "   \n"):
        _type(d, empty)
        assert d.strip.widget.tokens == [] and len(d.heatmap.fig.data[0].z) == 0
        assert all(len(t.y) == 0 for t in d.trajectory_panel.norms)
        assert "empty" in d.status.value and "Traceback" not in d.status.value
        assert d.shown.patches is None


def test_unknown_model_keeps_previous_one(load, dash_factory):
    model = load("tiny-gpt2")
    d = dash_factory(model)
    _type(d, "hello")
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
    from icl_lens.model import spike_thresholds

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
    _type(d, text)
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
    _type(d, text)
    assert len(d.strip.widget.tokens) == n_ctx and len(d.heatmap.fig.data[0].x) == n_ctx
    assert f"first {n_ctx}" in d.notice.value and "cut" in d.notice.value
    _type(d, "short")
    assert d.notice.value == ""


def test_exports_write_html_png_csv(load, dash_factory, tmp_path):
    d = dash_factory(load("tiny-llama"), export_dir=tmp_path)
    _type(d, "abc abc")
    (html,) = d.export_html()
    assert "plotly-graph-div" in html.read_text() and "icl_lens:figures" in html.read_text()
    norms, traj, fit = d.export_csv()
    import pandas as pd

    frame = pd.read_csv(norms)
    assert len(frame) == d.model.cfg.n_layers * d.shown.patches.n_positions and "flagged" in frame
    assert set(pd.read_csv(traj)["metric"]) >= {"meta_gradient_norm", "consecutive_alignment"}
    assert len(pd.read_csv(fit)) == d.model.cfg.n_layers
    pngs = d.export_png()  # kaleido drives /usr/bin/chromium
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_gemma_dashboard_matches_library(gemma, dash_factory):
    d = dash_factory(gemma)
    text = "The capital of France is Paris. The capital of Italy is"
    _type(d, text)
    patches = icl_lens.token_patches(gemma, text)
    assert d.strip.widget.tokens == list(patches.tokens)
    np.testing.assert_allclose(_arr(d.heatmap.fig.data[0].z), patches.norms().double().numpy(), rtol=1e-4, atol=1e-5)
    assert len(d.trajectory_panel.norms) == 18
    traj = icl_lens.trajectory(gemma, text, query=patches.n_positions - 1)
    np.testing.assert_allclose(_arr(d.trajectory_panel.norms[17].y),
                               traj.meta_gradient_norms()[17].double().numpy(), rtol=1e-4, atol=1e-5)
