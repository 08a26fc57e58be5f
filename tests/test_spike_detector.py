"""The shipped wrong-answer detector (issue 24): read from its file, applied by generate_with_patches,
printed by `icl-lens spikes`, and described by the dashboard."""
import json
import subprocess
import sys

import numpy as np
import pytest

import icl_lens
from icl_lens import cli
from icl_lens.spikes import _detector as sd
from icl_lens.ui._analysis import threshold_note


LINE = "flag from patch, answer tokens; token patches add +0.010 [-0.020, +0.040] to −log p"


def _write(path, model, *, features=("patch:answer",), weights, threshold=0.5, name="patch, answer tokens",
           line=LINE, samples=5):
    entry = {"detector": {"name": name, "features": list(features), "weights": list(weights),
                          "mean": [0.0] * len(weights), "scale": [1.0] * len(weights), "bias": 0.25,
                          "platt": [0.5, -0.1], "threshold": threshold, "auroc_unseen_kinds": 0.71,
                          "baseline": "−mean log p, answer", "baselines_auroc_unseen_kinds": {"−mean log p, answer": 0.74},
                          "ranks_as_well_as_neglogp": False, "line": line,
                          "patch_adds": {"beyond −log p": {"all answers": {"difference": 0.01, "low": -0.02,
                                                                           "high": 0.04}}}}}
    path.write_text(json.dumps({"question_format": "Q: {question}\nA:", "max_new_tokens": 4, "samples": samples,
                                "generated_by": "test", "models": {model: entry}}))


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    path = tmp_path / "spike_detectors.json"
    monkeypatch.setattr(sd, "DETECTORS_FILE", path)
    return path


def test_generation_reads_the_answer_with_the_shipped_detector(load, shipped):
    model = load("tiny-gpt2")
    n_layers = int(model.cfg.n_layers)
    weights = np.random.default_rng(0).normal(size=4 * n_layers)
    _write(shipped, "tiny-gpt2", weights=weights, threshold=0.0)
    gen = icl_lens.generate_with_patches(model, "Q: abc?\nA:", max_new_tokens=3)
    flag = gen.answer_flag
    k = sd.answer_length(gen.generated_tokens)
    x = sd.patch_readout(gen.patches.norms().numpy(), gen.patches.correction_norms().numpy(), gen.prompt_length, k,
                         "answer")
    assert x.shape == (4 * n_layers,)
    # by hand: first answer token and the answer's mean, log patch norms then log correction norms, per layer
    p = gen.prompt_length
    first = np.log(gen.patches.norms().numpy()[:, p])
    assert np.allclose(x[:n_layers], first)
    assert np.allclose(x[3 * n_layers:], np.log(gen.patches.correction_norms().numpy()[:, p:p + k]).mean(1))
    s = x @ weights + 0.25
    assert flag.p_wrong == pytest.approx(1 / (1 + np.exp(-(0.5 * s - 0.1))))
    assert flag.flagged == (flag.p_wrong > 0.0) and flag.answer == "".join(gen.generated_tokens[:k]).strip()
    lp = gen.logprobs.numpy()[:k]
    assert flag.baselines["neglogp"] == pytest.approx(-lp.mean())
    assert flag.baselines["neglogp_min"] == pytest.approx(-lp.min()) and flag.baselines["length"] == k
    assert "sampling_disagreement" not in flag.baselines  # no samples drawn for a patch detector by default
    assert icl_lens.generate_with_patches(model, "Q: abc?\nA:", max_new_tokens=2, detector=False).answer_flag is None


def test_a_baseline_detector_reads_what_every_generation_has(load, shipped):
    model = load("tiny-gpt2")
    _write(shipped, "tiny-gpt2", features=("neglogp",), weights=[1.0], name="−mean log p, answer",
           line="flag from −mean log p, answer; token patches add ...")
    gen = icl_lens.generate_with_patches(model, "Q: abc?\nA:", max_new_tokens=3)
    k = sd.answer_length(gen.generated_tokens)
    s = -gen.logprobs.numpy()[:k].mean() + 0.25
    assert gen.answer_flag.p_wrong == pytest.approx(1 / (1 + np.exp(-(0.5 * s - 0.1))))
    assert not sd.spike_detector("tiny-gpt2").reads_patches


def test_hidden_and_sampling_detectors_record_the_residual_and_draw_samples(load, shipped):
    model = load("tiny-gpt2")
    d = int(model.cfg.d_model)
    rng = np.random.default_rng(1)
    _write(shipped, "tiny-gpt2", features=("hidden", "sampling_disagreement"), weights=rng.normal(size=3 * d + 1),
           name="hidden + sampling", samples=3)
    detector = sd.spike_detector("tiny-gpt2")
    assert detector.needs_hidden and detector.needs_samples
    gen = icl_lens.generate_with_patches(model, "Q: abc?\nA:", max_new_tokens=3)
    p, k = gen.prompt_length, sd.answer_length(gen.generated_tokens)
    import torch

    with torch.no_grad():
        _, cache = model.run_with_cache(gen.token_ids[None])
    resid = cache[f"blocks.{sd.probe_layer(int(model.cfg.n_layers))}.hook_resid_pre"][0].double().numpy()
    hidden = np.concatenate([resid[p], resid[p:p + k].mean(0), resid[p - 1]])
    flag = gen.answer_flag
    assert "sampling_disagreement" in flag.baselines and 0 <= flag.baselines["sampling_disagreement"] <= 1
    x = np.concatenate([hidden, [flag.baselines["sampling_disagreement"]]])
    s = x @ np.asarray(detector.weights) + 0.25
    assert flag.p_wrong == pytest.approx(1 / (1 + np.exp(-(0.5 * s - 0.1))), rel=1e-4, abs=1e-6)
    again = icl_lens.generate_with_patches(model, "Q: abc?\nA:", max_new_tokens=3)
    assert again.answer_flag.baselines == flag.baselines  # the samples are seeded from the prompt


def test_answer_matching_rule():
    assert icl_lens.spikes.matches_alias(" The euro\n", ("euro",)) and not icl_lens.spikes.matches_alias(" He", ("H",))
    assert icl_lens.spikes.same_answer(" Paris\n", " paris, France") and not icl_lens.spikes.same_answer(" Lima", " Lim")
    assert sd.sampling_disagreement(" Paris\n", (" Paris", " Lyon", " paris\n", " Rome")) == 0.5
    assert np.isnan(sd.sampling_disagreement(" Paris", ()))


def test_spikes_command_prints_the_detector_line_and_the_baselines(load, shipped, capsys):
    model = load("tiny-gpt2")
    _write(shipped, "tiny-gpt2", weights=np.ones(4 * int(model.cfg.n_layers)) * 0.1, threshold=0.99)
    assert cli.main(["spikes", "abc?", "--model", "tiny-gpt2", "--json", "--max-new-tokens", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"answer", "p_wrong", "flagged", "detector", "baselines"}
    assert out["detector"]["name"] == "patch, answer tokens" and out["detector"]["auroc_unseen_kinds"] == 0.71
    assert out["detector"]["baseline_auroc_unseen_kinds"] == 0.74 and out["detector"]["line"] == LINE
    assert set(out["baselines"]) == {"neglogp", "neglogp_min", "neglogp_first", "entropy_first", "length",
                                     "sampling_disagreement"}
    assert 0 <= out["p_wrong"] <= 1 and out["flagged"] == (out["p_wrong"] > 0.99)
    assert cli.main(["spikes", "abc?", "--model", "tiny-gpt2", "--max-new-tokens", "2", "--samples", "0"]) == 0
    text = capsys.readouterr().out
    assert LINE in text and "neglogp" in text and "sampling_disagreement" not in text


def test_dashboard_note_gives_the_detector_line_and_says_when_patches_are_exploration(shipped):
    _write(shipped, "tiny-gpt2", features=("neglogp",), weights=[1.0], line="flag from −log p; patches add x")
    note = threshold_note("tiny-gpt2")
    assert "flag from −log p; patches add x" in note and "Patch norms and spike marks are exploration" in note
    _write(shipped, "tiny-gpt2", weights=[0.0])
    assert LINE in threshold_note("tiny-gpt2") and "exploration" not in threshold_note("tiny-gpt2")
    assert "exploration" not in threshold_note("tiny-llama")  # no detector: only the threshold
    for model in ("tiny-gpt2", "tiny-llama"):  # what a spike means, with or without a detector
        assert "A spike mark means this token's patch norm jumps above" in threshold_note(model)
        assert "does not say the answer is wrong" in threshold_note(model)


def test_spikes_command_refuses_bad_input_before_importing_torch(tmp_path):
    code = ("import sys; from icl_lens import cli; rc = cli.main(sys.argv[1:]); "
            "print('torch' in sys.modules, file=sys.stderr); sys.exit(rc)")
    for argv, message in ((["spikes", "  ", "--model", "gemma-3-270m"], "the prompt is empty"),
                          (["spikes", "What?", "--model", "tiny-gpt2"], "no wrong-answer detector was measured"),
                          (["spikes", "What?", "--device", "gpu"], "device")):
        run = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and lines[-1] == "False", run.stderr
        assert len(lines) == 2 and lines[0].startswith("icl-lens: error:") and message in lines[0], run.stderr
