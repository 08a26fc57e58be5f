"""The dashboard within bounds (issues 26, 28), at the logic level (no browser): the analysis cache stays
under its byte cap through 200 edits at 1,024 tokens; a stale trajectory is abandoned at the next block so a
new keystroke never waits behind it; app mode offers only the embedded models unless the operator allows
more, shows no server path and exports into a private folder per dashboard."""
from __future__ import annotations

import os
import random
import stat
import threading

import pytest
import torch
import transformers

import icl_lens
from dashboard_helpers import type_prompt
from icl_lens.model._byte_tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, save_byte_tokenizer
from icl_lens.model._loading import known_model_names
from icl_lens.ui._analysis import ByteCappedCache, PromptAnalyzer, Superseded, held_bytes
from icl_lens.ui._app_mode import APP_MODELS_ENV, in_app_mode, model_policy, redact_paths




def _long_context_llama(folder):
    """tiny-llama's shape with a 1,100-token context (the tiny models' is 256), seeded, with the byte tokenizer."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, hidden_size=64,
        intermediate_size=160, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1100, tie_word_embeddings=False)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        hf = transformers.LlamaForCausalLM(config).eval()
    finally:
        torch.random.set_rng_state(state)
    return icl_lens.load_model(hf, save_byte_tokenizer(folder))


def test_cache_bytes_stay_under_the_cap_over_200_edits_at_1024_tokens(tmp_path, one_thread):
    model = _long_context_llama(tmp_path / "tokenizer")
    cap = 32 * 2**20  # about one attention pattern (4 × 1024² floats) and a few patch sets
    analyzer = PromptAnalyzer(model, max_tokens=1024, cache_bytes=cap)
    rng = random.Random(0)
    text = "".join(rng.choice("abcdefgh =;") for _ in range(1100))  # byte tokens: cut to 1,024
    computed = 0
    for k in range(200):
        if k % 4 == 3:  # an edit in the middle: PatchSession recomputes from there
            at = rng.randrange(100, 1000)
            text = text[:at] + rng.choice("xyz") + text[at + 1:]
        else:  # typing and deleting at the end of the 1,024 tokens analysed
            text = text[:1023] + rng.choice("abc")
        prompt = analyzer.encode(text)
        assert prompt.ids.numel() == 1024
        patches, fresh_patches = analyzer.patches(prompt)
        # the query follows the last token now and then; else one the visitor pinned early in the prompt
        query = patches.n_positions - 1 if k % 20 == 0 else rng.randrange(20, 200)
        _, fresh_trajectory = analyzer.trajectory(prompt, query)
        _, fresh_attention = analyzer.attention(prompt, k % 3)
        computed += fresh_patches + fresh_trajectory + fresh_attention
        cache = analyzer.cache
        assert cache.total_bytes <= cap, f"edit {k}: {cache.total_bytes} bytes held, cap {cap}"
        assert cache.total_bytes == sum(held_bytes(v) for v in cache.values()), "byte bookkeeping drifted"
    assert computed > 200 and len(analyzer.cache) < 20  # hundreds of results, a few kept: evicted by bytes


def test_byte_capped_cache_is_lru_and_keeps_nothing_larger_than_the_cap():
    cache = ByteCappedCache(1000)
    t = lambda n: torch.zeros(n, dtype=torch.uint8)  # noqa: E731
    cache.get_or("a", lambda: t(400))
    cache.get_or("b", lambda: (t(300), {"x": t(100)}))
    assert cache.total_bytes == 800
    cache.get_or("a", lambda: pytest.fail("a is cached"))  # a is now the most recent
    cache.get_or("c", lambda: t(500))  # evicts b (least recent), not a
    assert list(cache) == ["a", "c"] and cache.total_bytes == 900
    value, fresh = cache.get_or("huge", lambda: t(5000))
    assert fresh and value.numel() == 5000 and "huge" not in cache and cache.total_bytes == 900
    shared = t(200)
    assert held_bytes((shared, shared[:10])) == 200  # one storage counted once
    with pytest.raises(ValueError, match="cache_bytes"):
        ByteCappedCache(-1)


def test_stale_trajectory_is_abandoned_at_the_next_block(load, one_thread):
    model = load("tiny-llama")
    analyzer = PromptAnalyzer(model)
    prompt = analyzer.encode("ab=1;cd=2;ef=3;ab=1;cd=")
    patches, _ = analyzer.patches(prompt)
    q = patches.n_positions - 1
    checks = []

    def stale():  # a keystroke arrives while the first block runs
        checks.append(1)
        return len(checks) > 1

    with pytest.raises(Superseded):
        analyzer.trajectory(prompt, q, stale=stale)
    assert len(checks) == 2, "the forward went on after the request became stale"
    assert sum(len(hp.fwd_hooks) for hp in model.hook_dict.values()) == 0, "a hook leaked"
    assert not any(key[0] == "trajectory" for key in analyzer.cache), "an abandoned result was cached"
    traj, fresh = analyzer.trajectory(prompt, q)
    ref = icl_lens.trajectory(model, prompt.ids, query=q)
    assert fresh and torch.allclose(traj.meta_gradient_norms(), ref.meta_gradient_norms(), rtol=1e-4, atol=1e-5)


def test_new_keystroke_does_not_wait_for_the_stale_trajectory(load, dash_factory):
    model = load("tiny-gemma3")
    d = dash_factory(model)
    first, second = "The quick brown fox jumps", "The quick brown fox jumps over"
    compute = d.analyzer.trajectory
    generations, abandoned = [], []

    def keystroke_meanwhile(prompt, *args, **kwargs):
        if not generations:  # the first trajectory: a keystroke arrives from the browser while it runs
            generations.append(d.runner.generation)
            typist = threading.Thread(target=d.set_prompt, args=(second,))
            typist.start()
            typist.join()
        try:
            return compute(prompt, *args, **kwargs)
        except Superseded:
            abandoned.append(prompt.ids.numel())
            raise

    d.analyzer.trajectory = keystroke_meanwhile
    d.set_prompt(first)
    assert d.wait(120) and d.last_error == ""
    stale = generations[0]
    assert len(abandoned) == 1, "the stale trajectory's forward ran to its end"
    assert "phase1" in d.timeline[stale] and "phase2" not in d.timeline[stale], "the stale trajectory was drawn"
    assert d.shown.text == second and d.shown.trajectory is not None
    assert d.shown.trajectory.query == d.shown.patches.n_positions - 1


def test_redact_paths_keeps_names_and_urls():
    text = "OSError: /srv/models/secret/config.json missing; see ~/.cache/x or https://huggingface.co/google/gemma"
    out = redact_paths(text)
    assert "/srv" not in out and "~/" not in out and "secret" not in out
    assert "https://huggingface.co/google/gemma" in out and out.count("<path>") == 2
    assert redact_paths("google/gemma-3-270m is not a model id") == "google/gemma-3-270m is not a model id"


def test_model_policy_from_argument_environment_and_voila(monkeypatch):
    embedded = set(known_model_names())
    monkeypatch.delenv(APP_MODELS_ENV, raising=False)
    for name in ("VOILA_BASE_URL", "VOILA_REQUEST_URL", "VOILA_KERNEL_ID"):
        monkeypatch.delenv(name, raising=False)
    assert not in_app_mode() and in_app_mode(True)
    assert model_policy(None, app=False).allows("/any/folder")  # one's own notebook: anything
    app = model_policy(None, app=True)
    assert not app.allows("/any/folder") and not app.allows("org/model") and set(app.names) == embedded
    listed = model_policy(["org/model"], app=True)
    assert listed.allows("org/model") and not listed.allows("org/other")
    assert model_policy(True, app=True).allows("org/other") and not model_policy(False, app=False).allows("org/x")
    monkeypatch.setenv(APP_MODELS_ENV, "org/a, org/b")
    env = model_policy(None, app=True)
    assert env.allows("org/b") and not env.allows("org/c")
    monkeypatch.setenv(APP_MODELS_ENV, "*")
    assert model_policy(None, app=True).allows("org/c")
    monkeypatch.setenv("VOILA_BASE_URL", "/")
    assert in_app_mode()


def test_app_mode_model_box_offers_embedded_names_only(load, dash_factory, tmp_path, monkeypatch):
    monkeypatch.delenv(APP_MODELS_ENV, raising=False)
    model = load("tiny-gpt2")
    d = dash_factory(model, app=True)
    type_prompt(d, "hello")
    folder = tmp_path / "visitor-typed-folder"
    folder.mkdir()
    d.model_box.value = str(folder)
    assert d.wait(60)
    assert "not offered" in d.status.value and "Keeping tiny-gpt2" in d.status.value
    assert str(tmp_path) not in d.status.value and d.model is model and d.model_box.value == "tiny-gpt2"
    d.model_box.value = "tiny-llama"  # an embedded (built-in) name loads
    assert d.wait(120) and d.analyzer.name == "tiny-llama"


def test_app_mode_errors_name_no_server_path(load, dash_factory, monkeypatch):
    monkeypatch.setenv(APP_MODELS_ENV, "*")  # the operator allows any name: loading is tried, and fails
    secret = "/srv/secret-models/not-here"
    d = dash_factory(load("tiny-gpt2"), app=True)
    type_prompt(d, "hello")
    d.model_box.value = secret
    assert d.wait(60)
    assert "Could not load model" in d.status.value and "secret-models" not in d.status.value
    own = dash_factory(load("tiny-gpt2"), app=False)  # one's own notebook shows the path it typed
    type_prompt(own, "hello")
    own.model_box.value = secret
    assert own.wait(60) and "secret-models" in own.status.value


def test_app_mode_exports_go_to_a_private_folder_per_dashboard(load, dash_factory, monkeypatch):
    monkeypatch.chdir(os.path.dirname(__file__))  # the shared default folder would land here: it must not
    model = load("tiny-llama")
    a, b = dash_factory(model, app=True), dash_factory(model, app=True)
    assert a.export_dir != b.export_dir and a.export_dir.is_dir() and b.export_dir.is_dir()
    for d in (a, b):
        assert stat.S_IMODE(d.export_dir.stat().st_mode) == 0o700  # only the kernel's user reads it
        assert d.export_dir.name != "icl_lens_exports"
    type_prompt(a, "abc abc")
    a._export(a.export_csv)  # what the button does
    assert "Saved norms.csv" in a.status.value and str(a.export_dir) not in a.status.value
    assert (a.export_dir / "norms.csv").exists() and not list(b.export_dir.iterdir())
    assert not os.path.exists(os.path.join(os.path.dirname(__file__), "icl_lens_exports"))
