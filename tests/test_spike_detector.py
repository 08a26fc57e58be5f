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


def _write(path, model, *, beats: bool, weights, threshold=0.5):
    entry = {"detector": {"name": "patch, answer tokens", "readout": "answer", "weights": list(weights),
                          "mean": [0.0] * len(weights), "scale": [1.0] * len(weights), "bias": 0.25,
                          "platt": [0.5, -0.1], "threshold": threshold, "auroc_within_kind": 0.71,
                          "baseline": "answer length in tokens", "baseline_auroc_within_kind": 0.74,
                          "beats_baseline": beats}}
    path.write_text(json.dumps({"question_format": "Q: {question}\nA:", "max_new_tokens": 4,
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
    _write(shipped, "tiny-gpt2", beats=False, weights=weights, threshold=0.0)
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
    assert icl_lens.generate_with_patches(model, "Q: abc?\nA:", max_new_tokens=2, detector=False).answer_flag is None


def test_spikes_command_prints_the_detector_and_its_numbers(load, shipped, capsys):
    model = load("tiny-gpt2")
    _write(shipped, "tiny-gpt2", beats=False, weights=np.ones(4 * int(model.cfg.n_layers)) * 0.1, threshold=0.99)
    assert cli.main(["spikes", "abc?", "--model", "tiny-gpt2", "--json", "--max-new-tokens", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"answer", "p_wrong", "flagged", "detector"}
    assert out["detector"]["name"] == "patch, answer tokens" and out["detector"]["auroc_within_kind"] == 0.71
    assert out["detector"]["baseline_auroc_within_kind"] == 0.74 and out["detector"]["beats_baseline"] is False
    assert 0 <= out["p_wrong"] <= 1 and out["flagged"] == (out["p_wrong"] > 0.99)
    assert cli.main(["spikes", "abc?", "--model", "tiny-gpt2", "--max-new-tokens", "2"]) == 0
    text = capsys.readouterr().out
    assert "does not beat the best baseline (answer length in tokens, 0.740)" in text and "exploration" in text


def test_dashboard_note_says_when_the_detector_does_not_beat_its_baselines(shipped):
    _write(shipped, "tiny-gpt2", beats=False, weights=[0.0])
    note = threshold_note("tiny-gpt2")
    assert note.startswith("Patch norms and spike marks are exploration, not an error flag")
    assert "0.710" in note and "0.740" in note
    _write(shipped, "tiny-gpt2", beats=True, weights=[0.0])
    assert "exploration" not in threshold_note("tiny-gpt2") and "beats the best baseline" in threshold_note("tiny-gpt2")
    assert "exploration" not in threshold_note("tiny-llama")  # no detector: only the threshold


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
