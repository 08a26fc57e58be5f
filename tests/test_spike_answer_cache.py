"""The spike evaluation's answer cache: safetensors + JSON, never unpickled (issue 26).

A cache folder may be writable by others (a shared machine): whatever file sits where the
cache is expected must be read as data or refused, never executed.
"""
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.factual_prompts import FEW_SHOT, FactualPrompt
from experiments.spikes.answers import AnswerCacheError, Answered, AnswerSet, answer_all, load_answers, save_answers


def _answers(rng, n=3, layers=2, d_model=4):
    out = []
    for i in range(n):
        length = 5 + i
        out.append(Answered(
            item=FactualPrompt(f"Where is place {i}?", ("here", "there"), "kind", f"s{i}"), completion=" here\n",
            correct=bool(i % 2), prompt_length=length - 2, n_answer=1 + i % 2,
            norms=rng.random((layers, length)), correction_norms=rng.random((layers, length)),
            informative=np.arange(length) > 0, logprobs=-rng.random(2), entropies=rng.random(2),
            hidden=rng.normal(size=(3, d_model)).astype(np.float32), seconds=0.25 * i,
            generated_ids=rng.integers(0, 100, 2), samples=(" here\n", " there"), cpu_seconds=0.1 * i))
    return AnswerSet("tiny-llama", layers, 1, tuple(out), 1.5, 0.5, FEW_SHOT, 8, 2, 1.0)


def test_answer_cache_round_trip(tmp_path):
    saved = _answers(np.random.default_rng(0))
    loaded = load_answers(save_answers(saved, tmp_path / "m.safetensors"))
    for field in ("model_name", "n_layers", "probe_layer", "seconds", "cpu_seconds", "preamble", "max_new_tokens",
                  "n_samples", "temperature"):
        assert getattr(loaded, field) == getattr(saved, field), field
    assert len(loaded.answers) == len(saved.answers)
    for a, b in zip(loaded.answers, saved.answers):
        assert a.item == b.item and a.completion == b.completion and a.correct == b.correct
        assert (a.prompt_length, a.n_answer, a.seconds, a.cpu_seconds) == (b.prompt_length, b.n_answer, b.seconds,
                                                                           b.cpu_seconds)
        assert a.samples == b.samples
        for name in ("norms", "correction_norms", "informative", "logprobs", "entropies", "hidden", "generated_ids"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert not list(tmp_path.glob("*.partial"))


class _Payload:
    """Unpickling this creates ``marker``: proof that a load executed code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_a_pickle_payload_in_the_cache_is_refused_not_executed(tmp_path, load, writer):
    marker = tmp_path / "executed"
    cache = tmp_path / "cache" / "tiny-llama" / "part-0.safetensors"  # where answer_all reads tiny-llama's answers
    cache.parent.mkdir(parents=True)
    if writer == "pickle":
        cache.write_bytes(pickle.dumps(_Payload(marker)))
    else:
        torch.save(_Payload(marker), cache)
    with pytest.raises(AnswerCacheError, match="not a readable answer cache"):
        load_answers(cache)
    with pytest.raises(AnswerCacheError):
        answer_all(load("tiny-llama"), [], max_new_tokens=2, cache=tmp_path / "cache")
    assert not marker.exists()


def test_a_safetensors_file_of_another_kind_is_refused(tmp_path):
    from safetensors.numpy import save_file

    other = tmp_path / "weights.safetensors"
    save_file({"w": np.zeros(3)}, str(other))
    with pytest.raises(AnswerCacheError, match="not an answer cache"):
        load_answers(other)
