"""Spike scores (robust trailing-window z of patch norms), generation with patches, bad input.

Score math is checked on constructed norm series whose median/MAD are known in closed
form; generation is checked as an identity against a fresh one-pass `token_patches` and
a full forward over the generated sequence.
"""
from __future__ import annotations

import math

import pytest
import torch

from icl_lens import (
    PatchSession,
    PromptError,
    SpikeFlags,
    generate_with_patches,
    spike_scores,
    spike_scores_from_norms,
    token_patches,
)
from experiments.factual_prompts import is_correct, load_factual_prompts
from icl_lens.spikes._scores import MAD_TO_SIGMA, MEAN_AD_TO_SIGMA, SCORE_CAP

WINDOW = 16


def alternating(n: int, layers: int = 3) -> torch.Tensor:
    """Norms 1, 3, 1, 3, ...: every full window has median 2 and MAD 1."""
    base = torch.tensor([1.0 if t % 2 == 0 else 3.0 for t in range(n)], dtype=torch.float64)
    return base.repeat(layers, 1)


# ---------------------------------------------------------------- score math


def test_injected_outlier_has_closed_form_score_and_is_the_only_flag():
    norms = alternating(40)
    z_target = 5.0
    norms[:, 30] = 2.0 + z_target * MAD_TO_SIGMA * 1.0  # median 2, MAD 1 in its window
    for statistic in ("mean", "median", "max", "norm"):
        flags = spike_scores_from_norms(norms, window=WINDOW, statistic=statistic)
        assert flags.flagged_positions == [30], statistic
        # all layers equal: every aggregate is that z ("norm": the series is sqrt(3)·x, z is scale-free)
        assert flags.scores[30] == pytest.approx(z_target, abs=1e-9), statistic
    # the positions after the outlier: the window holds one outlier, median/MAD move little
    flags = spike_scores_from_norms(norms, window=WINDOW)
    assert torch.all(flags.scores[31:].abs() < 3.5)


def test_outlier_in_one_layer_mean_versus_max():
    norms = alternating(40)
    norms[1, 30] = 2.0 + 6.0 * MAD_TO_SIGMA  # z = 6 in layer 1 only; other layers z = 0 (value 1 → z = -1)
    norms[0, 30] = norms[2, 30] = 2.0
    mean = spike_scores_from_norms(norms, window=WINDOW, statistic="mean")
    mx = spike_scores_from_norms(norms, window=WINDOW, statistic="max")
    assert mean.scores[30] == pytest.approx(2.0, abs=1e-9)  # (0 + 6 + 0) / 3
    assert mx.scores[30] == pytest.approx(6.0, abs=1e-9)
    assert 30 not in mean.flagged_positions and 30 in mx.flagged_positions
    only_1 = spike_scores_from_norms(norms, window=WINDOW, layers=[1], statistic="mean")
    assert 30 in only_1.flagged_positions
    # one-layer aggregates equal that layer's own scores
    for statistic in ("mean", "max", "norm"):
        one = spike_scores_from_norms(norms, window=WINDOW, layers=[-2], statistic=statistic)
        ok = one.enough_context
        assert torch.allclose(one.scores[ok], one.layer_scores[1, ok], atol=1e-9)


def test_constant_series_flags_nothing_and_scores_zero():
    for value in (0.0, 2.5):
        flags = spike_scores_from_norms(torch.full((4, 50), value), window=WINDOW)
        ok = flags.enough_context
        assert ok.sum() == 50 - WINDOW
        assert torch.all(flags.scores[ok] == 0) and not flags.flags.any()


def test_mad_zero_is_finite_and_defined():
    # more than half the window equal: MAD = 0, fall back to 1.2533 · mean |x - median|
    window = [1.0] * 10 + [2.0] * 6
    mean_ad = 6 / 16
    x = 1.0 + 4.0 * MEAN_AD_TO_SIGMA * mean_ad
    flags = spike_scores_from_norms(torch.tensor([window + [x]], dtype=torch.float64), window=WINDOW)
    assert flags.scores[16] == pytest.approx(4.0, abs=1e-9) and flags.flags[16]
    # a window of exact zeros, then a positive norm: capped, finite, flagged
    flags = spike_scores_from_norms(torch.tensor([[0.0] * 16 + [0.3, 0.0]]), window=WINDOW, min_context=16)
    assert flags.scores[16] == SCORE_CAP and flags.flags[16] and flags.scores[17] <= 0
    assert torch.isfinite(flags.scores[flags.enough_context]).all()


def test_short_series_reports_not_enough_context():
    norms = torch.rand(3, WINDOW, generator=torch.Generator().manual_seed(0)) * 10
    flags = spike_scores_from_norms(norms, window=WINDOW)
    assert not flags.enough_context.any() and not flags.flags.any()
    assert torch.isnan(flags.scores).all()
    frame = flags.to_frame()
    assert list(frame.columns) == ["position", "token", "score", "flagged", "enough_context"]
    assert not frame.enough_context.any() and not frame.flagged.any()
    # min_context lowers the bar: position t has t predecessors
    flags = spike_scores_from_norms(norms, window=WINDOW, min_context=4)
    assert flags.enough_context.tolist() == [t >= 4 for t in range(WINDOW)]
    assert torch.equal(torch.isnan(flags.scores), ~flags.enough_context)


def test_uninformative_positions_are_left_out_of_windows():
    norms = alternating(40)
    informative = torch.ones(40, dtype=torch.bool)
    informative[:2] = False
    norms[:, :2] = 0.0  # zero patches, as for BOS and the token after it
    flags = spike_scores_from_norms(norms, window=WINDOW, informative=informative)
    assert flags.enough_context.tolist() == [t >= 2 + WINDOW for t in range(40)]
    assert not flags.flags.any()


@pytest.mark.parametrize("kwargs, error", [
    ({"window": 0}, ValueError),
    ({"threshold": float("nan")}, ValueError),
    ({"statistic": "mode"}, ValueError),
    ({"layers": [3]}, IndexError),
    ({"layers": []}, ValueError),
    ({"min_context": 17}, ValueError),
])
def test_bad_score_arguments(kwargs, error):
    with pytest.raises(error):
        spike_scores_from_norms(alternating(20), **{"window": WINDOW, **kwargs})


def test_non_finite_norms_raise():
    norms = alternating(20)
    norms[0, 5] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        spike_scores_from_norms(norms)


def test_spike_scores_on_real_patches(load):
    model = load("tiny-gemma3")
    patches = token_patches(model, "abcabcabcabcabcabcabcabc xyz! abcabcabc")
    flags = spike_scores(patches, window=8, statistic="max")
    assert isinstance(flags, SpikeFlags)
    assert flags.tokens == patches.tokens and flags.layer_scores.shape == patches.norms().shape
    # BOS and the token after it have no removed context: never scored
    assert patches.kept_bos and not flags.informative[:2].any() and flags.informative[2:].all()
    assert flags.enough_context.tolist() == [t >= 2 + 8 for t in range(patches.n_positions)]
    assert torch.equal(flags.flags, flags.enough_context & (flags.scores > flags.threshold))
    # Every score, recomputed by hand from the patch norms with Python's statistics module.
    import statistics

    norms = patches.norms().double()
    checked = 0
    for t in range(2 + 8, patches.n_positions):
        per_layer = []
        for layer in range(patches.n_layers):
            window = norms[layer, t - 8: t].tolist()  # the 8 informative predecessors
            med = statistics.median(window)
            mad = statistics.median(abs(x - med) for x in window)
            assert mad > 0  # a real window: the MAD=0 fallback is tested on constructed series
            per_layer.append((float(norms[layer, t]) - med) / (MAD_TO_SIGMA * mad))
        assert flags.layer_scores[:, t].tolist() == pytest.approx(per_layer, rel=1e-9)
        assert float(flags.scores[t]) == pytest.approx(max(per_layer), rel=1e-9)
        checked += 1
    assert checked == patches.n_positions - 10


# ---------------------------------------------------------------- generation


def _check_against_full_pass(model, gen, *, rtol: float):
    """Recorded norms equal a fresh one-pass token_patches; log-probs equal a full forward."""
    full = token_patches(model, gen.token_ids)
    ref = full.norms()[:, gen.prompt_length:].double()
    assert torch.allclose(gen.norms, ref, rtol=rtol, atol=rtol * float(ref.abs().max()))
    with torch.no_grad():
        logits = model(gen.token_ids[None].to(model.cfg.device))[0].double()
    logp = torch.log_softmax(logits, -1)
    for k, pos in enumerate(gen.positions):
        token = int(gen.token_ids[pos])
        assert gen.logprobs[k] == pytest.approx(float(logp[pos - 1, token]), abs=1e-3)
        entropy = float(-(logp[pos - 1].exp() * logp[pos - 1]).sum())
        assert gen.entropies[k] == pytest.approx(entropy, abs=1e-3)
        if gen.greedy:
            assert token == int(logits[pos - 1].argmax())


def test_generation_matches_full_recompute_tiny(load):
    model = load("tiny-gemma3", torch.float64)
    prompt = "the cat sat on the mat and the dog sat on the log, "
    gen = generate_with_patches(model, prompt, max_new_tokens=6, window=8, stop_at_eos=False)
    assert gen.n_new == 6 and gen.stop_reason == "max_new_tokens"
    _check_against_full_pass(model, gen, rtol=1e-9)
    frame = gen.to_frame()
    assert len(frame) == 6 and frame.position.tolist() == gen.positions
    assert (frame.logprob <= 0).all() and (frame.entropy >= 0).all()
    assert (frame.entropy <= math.log(model.cfg.d_vocab) + 1e-9).all()
    # the scores are causal: computed on the prompt alone, the prompt positions agree
    on_prompt = spike_scores(token_patches(model, gen.token_ids[: gen.prompt_length]), window=8)
    ok = on_prompt.enough_context
    assert torch.allclose(on_prompt.scores[ok], gen.spikes.scores[: gen.prompt_length][ok], atol=1e-6)


def test_generation_reuses_the_cache(load):
    model = load("tiny-gemma3")
    session = PatchSession(model)
    gen = generate_with_patches(model, "one two three four five six", max_new_tokens=4, stop_at_eos=False,
                                session=session)
    n = gen.token_ids.numel()
    assert gen.recomputed == (gen.prompt_length, 1, 1, 1, 1)  # one position per generated token
    assert session.last_stats.n_positions == n and session.last_stats.reused == n - 1
    _check_against_full_pass(model, gen, rtol=1e-4)
    # the same prompt again in the same session: only its last position is recomputed
    again = generate_with_patches(model, "one two three four five six", max_new_tokens=2, stop_at_eos=False,
                                  session=session)
    assert again.recomputed == (1, 1, 1)
    assert torch.equal(again.token_ids, gen.token_ids[: again.token_ids.numel()])
    _check_against_full_pass(model, again, rtol=1e-4)


def test_sampling_is_seeded(load):
    model = load("tiny-gemma3")
    a = generate_with_patches(model, "hello there", max_new_tokens=5, greedy=False, seed=3, temperature=1.5,
                              stop_at_eos=False)
    b = generate_with_patches(model, "hello there", max_new_tokens=5, greedy=False, seed=3, temperature=1.5,
                              stop_at_eos=False)
    assert torch.equal(a.token_ids, b.token_ids)
    _check_against_full_pass(model, a, rtol=1e-4)


def test_short_prompt_generation_says_not_enough_context(load):
    model = load("tiny-gemma3")
    gen = generate_with_patches(model, "hi", max_new_tokens=3, window=16, stop_at_eos=False)
    assert not gen.enough_context.any() and not gen.flags.any()
    assert not gen.to_frame().enough_context.any()


def test_generation_gemma_matches_full_recompute(gemma):
    gen = generate_with_patches(gemma, "Q: What is the capital of Japan?\nA:", max_new_tokens=3, window=8)
    assert 1 <= gen.n_new <= 3
    _check_against_full_pass(gemma, gen, rtol=1e-4)


@pytest.mark.parametrize("kwargs, error", [
    ({"max_new_tokens": 0}, ValueError),
    ({"max_new_tokens": -2}, ValueError),
    ({"greedy": False, "temperature": 0.0}, ValueError),
    ({"window": 0}, ValueError),
])
def test_generation_bad_arguments(load, kwargs, error):
    model = load("tiny-gemma3")
    with pytest.raises(error):
        generate_with_patches(model, "hello", **{"max_new_tokens": 2, **kwargs})


def test_generation_bad_prompts(load):
    model = load("tiny-gemma3")
    with pytest.raises(ValueError, match="another model"):
        generate_with_patches(model, "hello", max_new_tokens=1, session=PatchSession(load("tiny-llama")))
    with pytest.raises(PromptError, match="empty"):
        generate_with_patches(model, "   ", max_new_tokens=2)
    n_ctx = model.cfg.n_ctx
    fits = "a" * (n_ctx - 10)  # the byte tokenizer adds BOS: n_ctx - 9 tokens
    with pytest.raises(PromptError, match="context length"):
        generate_with_patches(model, fits, max_new_tokens=20)
    with pytest.raises(PromptError, match="context length"):
        generate_with_patches(model, "a" * (n_ctx + 5), max_new_tokens=1)


# ---------------------------------------------------------------- evaluation pieces


def test_answer_key_and_labelling():
    items = load_factual_prompts()
    assert len(items) >= 200 and {"invented", "capital"} <= {i.kind for i in items}
    assert all(i.answers for i in items if i.kind != "invented")
    assert all(not i.answers for i in items if i.kind == "invented")
    assert is_correct(" Paris\n", ("Paris",)) and is_correct(' "paris", France', ("Paris",))
    assert not is_correct(" He", ("H",)) and is_correct(" H\n", ("H",))
    assert not is_correct(" Rome", ()) and not is_correct("\nParis", ("Paris",))




def test_spike_settings_travel_with_the_flags_and_pick_the_shipped_threshold(load):
    """One settings object for scores, flags and the shipped thresholds: the keyword arguments are the same
    mechanism, the flags carry what they were computed with, and ``threshold=None`` is the calibrated one."""
    from icl_lens import SpikeSettings, spike_threshold

    settings = SpikeSettings(window=8, threshold=2.0, statistic="max")
    norms = alternating(40)
    by_object = spike_scores_from_norms(norms, settings)
    by_keywords = spike_scores_from_norms(norms, window=8, threshold=2.0, statistic="max")
    assert torch.equal(by_object.scores.nan_to_num(), by_keywords.scores.nan_to_num())
    assert by_object.settings == settings.replace(layers=(0, 1, 2))  # the layers as used
    assert SpikeSettings.from_dict(settings.to_dict()) == settings
    assert SpikeSettings.from_dict(SpikeSettings(layers=slice(1, None)).to_dict()).layers == slice(1, None)
    assert spike_threshold("gemma-3-270m", settings) == spike_threshold("gemma-3-270m", window=8, statistic="max")
    with pytest.raises(TypeError, match="unknown spike setting"):
        spike_scores_from_norms(norms, windw=8)
    with pytest.raises(ValueError, match="no model"):
        spike_scores_from_norms(norms, threshold=None)
    model = load("tiny-gemma3")
    patches = token_patches(model, "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 2)
    calibrated = spike_scores(patches, threshold=None)
    assert calibrated.threshold == spike_threshold(model.cfg.model_name).value
