"""The spike evaluation's two-pass answering (generate, then one patch pass) equals the
step-by-step ``generate_with_patches`` it replaced (issue 24): patches are causal, so the
patch of position t read after the whole answer exists is the one read at step t."""
import numpy as np
import pytest
import torch

from experiments.factual_prompts import FactualPrompt
from experiments.spikes.answers import PROMPT_TAIL, answer_one, probe_layer
from icl_lens.spikes._generation import generate_with_patches
from icl_lens.patches._incremental import PatchSession
from icl_lens.model._residual_stream import recording_residual

ITEMS = [FactualPrompt("What is the capital of France?", ("Paris",), "capital", "France"),
         FactualPrompt("What is the capital of Peru?", ("Lima",), "capital", "Peru"),
         FactualPrompt("Who wrote \"Emma\"?", ("Jane Austen",), "author", "Emma")]


def _step_by_step(model, item, layer, max_new_tokens):
    with recording_residual(model, layer) as rec:
        gen = generate_with_patches(model, item.text, max_new_tokens=max_new_tokens, stop=("\n",))
    return gen, rec.rows()[-(gen.n_new + 1):].numpy()


@pytest.mark.parametrize("name", ["smollm2-135m"])  # the tiny models' context (256) is shorter than the preamble
def test_two_pass_answers_equal_the_step_by_step_ones(load, name):
    model = load(name)
    layer = probe_layer(int(model.cfg.n_layers))
    session, previous = PatchSession(model, logits=False), None
    for item in ITEMS:  # one shared session: the second and third questions reuse the preamble
        fast, previous = answer_one(model, item, session, max_new_tokens=4, layer=layer, previous=previous)
        gen, hidden = _step_by_step(model, item, layer, 4)
        assert fast.completion == gen.text and fast.prompt_length == gen.prompt_length
        assert np.array_equal(fast.generated_ids, gen.generated_ids.numpy())
        assert torch.equal(previous, gen.token_ids)
        np.testing.assert_allclose(fast.norms, gen.patches.norms().double().numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(fast.correction_norms, gen.patches.correction_norms().double().numpy(),
                                   rtol=1e-4, atol=1e-6)
        assert np.array_equal(fast.informative, gen.spikes.informative.numpy())
        np.testing.assert_allclose(fast.logprobs, gen.logprobs.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(fast.entropies, gen.entropies.numpy(), rtol=1e-4, atol=1e-5)
        # hidden rows: P - PROMPT_TAIL … end; the step-by-step run kept P - 1 … end
        assert fast.hidden.shape[0] == PROMPT_TAIL + gen.n_new
        np.testing.assert_allclose(fast.hidden[PROMPT_TAIL - 1:], hidden, rtol=1e-4, atol=1e-4)  # float32 rounding, rows of size ~10
        np.testing.assert_allclose(fast.hidden_at(fast.prompt_length - 1), hidden[0], rtol=1e-4, atol=1e-4)
    assert sum(len(hp.fwd_hooks) for hp in model.hook_dict.values()) == 0


def test_the_library_detector_reads_what_the_evaluation_read(load, tmp_path, monkeypatch):
    """Every feature block the shipped detector can read, computed from a generation by the library, equals the
    one the evaluation computed from its cached answer: patches, log-probs, the probe layer's residual, and the
    samples behind sampling agreement (same seed, same draws)."""
    import json

    from experiments.spikes.features import reading
    from icl_lens.spikes import _detector as sd

    model = load("smollm2-135m")
    layer = probe_layer(int(model.cfg.n_layers))
    blocks = ("patch:answer+last", "patch:prompt", "logprob", "hidden", "neglogp_min", "entropy_first", "length",
              "spike", "sampling_disagreement")
    path = tmp_path / "d.json"
    monkeypatch.setattr(sd, "DETECTORS_FILE", path)
    item = ITEMS[0]
    answer, _ = answer_one(model, item, PatchSession(model, logits=False), max_new_tokens=4, layer=layer, n_samples=3)
    x = sd.feature_vector(reading(answer), blocks)
    weights = np.random.default_rng(0).normal(size=x.size) / x.size
    entry = {"detector": {"name": "all", "features": list(blocks), "weights": weights.tolist(),
                          "mean": [0.0] * x.size, "scale": [1.0] * x.size, "bias": 0.0, "platt": [1.0, 0.0],
                          "threshold": 0.5, "line": "all blocks"}}
    path.write_text(json.dumps({"max_new_tokens": 4, "samples": 3, "models": {"smollm2-135m": entry}}))
    gen = generate_with_patches(model, item.text, max_new_tokens=4, stop=("\n",))
    flag = gen.answer_flag
    assert flag.baselines["sampling_disagreement"] == sd.sampling_disagreement(answer.completion, answer.samples)
    expected = 1 / (1 + np.exp(-(x @ weights)))
    assert flag.p_wrong == pytest.approx(expected, rel=1e-4)
