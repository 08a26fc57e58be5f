"""PatchSession reuses the cached prefix and gives the same patches as a full recompute."""
import torch

from icl_lens import PatchSession, token_patches

TEXT = "Typing a prompt one keystroke at a time, with edits in between."


def _assert_same(a, b, rtol):
    for name in ("u_in", "v", "correction"):
        x, y = getattr(a, name), getattr(b, name)
        scale = y.abs().max().clamp_min(1e-30)
        assert (x - y).abs().max() <= rtol * scale, name
    assert a.tokens == b.tokens


def test_session_matches_full_recompute_through_edits(load):
    model = load("tiny-gemma3", torch.float64)
    session = PatchSession(model)
    for cut, reused in [(12, 0), (30, 13), (31, 31), (20, 20), (50, 21)]:
        patches = session.update(TEXT[:cut])
        _assert_same(patches, token_patches(model, TEXT[:cut]), 1e-12)
        assert session.last_stats.reused == reused
        assert session.last_stats.recomputed == patches.n_positions - reused
        full_logits = model(model.to_tokens(TEXT[:cut]))[0, -1]
        assert torch.allclose(session.last_logits, full_logits, atol=1e-10)


def test_session_on_gemma_appends_one_token(gemma):
    session = PatchSession(gemma)
    base = "The capital of France is Paris. The capital of Germany is"
    session.update(base)
    patches = session.update(base + " Berlin")
    assert session.last_stats.recomputed == 1
    _assert_same(patches, token_patches(gemma, base + " Berlin"), 1e-3)
