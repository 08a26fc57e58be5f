"""PatchSession reuses the cached prefix and gives the same patches as a full recompute."""
import pytest
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


def test_session_without_logits_matches_through_edits(load):
    model = load("tiny-gemma3", torch.float64)
    session = PatchSession(model, logits=False)
    for cut, reused in [(12, 0), (30, 13), (31, 31), (20, 20), (50, 21)]:
        patches = session.update(TEXT[:cut])
        _assert_same(patches, token_patches(model, TEXT[:cut]), 1e-12)
        assert session.last_stats.reused == reused and session.last_logits is None


def test_trajectory_reuses_the_sessions_prefix_and_equals_the_plain_one(load):
    import pytest

    from icl_lens import trajectory

    for name in ("tiny-gemma3", "tiny-llama", "tiny-gpt2"):  # sliding + global layers, gated, GPT-2
        model = load(name, torch.float64)
        session = PatchSession(model, logits=False)
        ids = model.to_tokens(TEXT)[0]
        session.update(ids[:40])
        for query in (39, 25, 3):  # the last token, a token in the middle (a cache cropped), an early one
            assert session.prefix_cache(ids, query) is not None
            reused = trajectory(model, ids[: query + 1], query=query, session=session)
            plain = trajectory(model, ids[: query + 1], query=query)
            for field in ("u_in", "v", "correction"):
                torch.testing.assert_close(getattr(reused, field), getattr(plain, field), rtol=1e-10, atol=1e-12)
        # the session's own cache is untouched: the next edit still gives exact patches
        _assert_same(session.update(ids[:45]), token_patches(model, ids[:45]), 1e-12)
        assert session.last_stats.reused == 40
    # a session holding another prompt is not used (its keys would be wrong)
    session.update(model.to_tokens("Something else entirely, of another length.")[0])
    assert session.prefix_cache(ids, 30) is None
    with pytest.raises(ValueError, match="another model"):
        trajectory(load("tiny-llama", torch.float64), TEXT, session=session)


def test_attention_rows_from_the_sessions_cache_equal_the_full_pattern(load):
    from icl_lens.model._attention import attention_pattern

    model = load("tiny-gemma3", torch.float64)
    session = PatchSession(model, logits=False)
    ids = model.to_tokens(TEXT)[0]
    session.update(ids)
    for layer in range(model.cfg.n_layers):  # sliding-window and global layers
        full = attention_pattern(model, ids, layer)
        cache, _ = session.prefix_cache(ids, 30)
        rows = attention_pattern(model, ids, layer, past=cache)
        assert rows.shape == (full.shape[0], ids.numel() - 30, ids.numel())
        torch.testing.assert_close(rows, full[:, 30:], rtol=1e-10, atol=1e-12)


def test_logits_at_a_query_from_the_sessions_cache_equal_a_full_forward(load):
    """``logits_at``: the next-token logits at a query from one token's forward over the session's cached prefix
    (the dashboard's predictions) equal a forward over the whole prefix; a session holding another prompt falls
    back to that forward."""
    from icl_lens.model._greedy import last_logits

    for name in ("tiny-gemma3", "tiny-llama", "tiny-gpt2"):
        model = load(name, torch.float64)
        session = PatchSession(model, logits=False)
        ids = model.to_tokens(TEXT)[0]
        session.update(ids)
        for query in (ids.numel() - 1, 25, 0):
            full = last_logits(model, [ids[: query + 1].tolist()])[0]
            torch.testing.assert_close(session.logits_at(ids, query), full, rtol=1e-10, atol=1e-10)
        other = model.to_tokens("Something else entirely, of another length.")[0]
        torch.testing.assert_close(session.logits_at(other, 5), last_logits(model, [other[:6].tolist()])[0],
                                   rtol=1e-10, atol=1e-10)
        assert session.prefix_cache(ids, 10) is not None  # the session's own cache is left as it was


def test_lazy_logits_are_the_passes_last_row_and_equal_a_fresh_forward(load):
    """Issue 41: ``logits="lazy"`` stops at the unembedding's input and puts the last row through it when read:
    equal to a fresh forward's logits after appends and edits (tiny-gemma2 soft-caps its final logits), never the
    previous prompt's; ``logits_at`` of the last position reuses it, of another prompt does not."""
    for name in ("tiny-gemma2", "tiny-llama"):
        model = load(name, torch.float64)
        session = PatchSession(model, logits="lazy")
        for cut in (20, 21, 22, 15, 30):  # appends, a deletion, a longer paste
            ids = model.to_tokens(TEXT[:cut])[0]
            session.update(ids)
            fresh = model(ids[None])[0, -1]
            assert torch.allclose(session.last_logits, fresh, atol=1e-10), (name, cut)
            assert session.logits_at(ids, ids.numel() - 1) is session.last_logits
        other = ids.clone()
        other[3] = (other[3] + 1) % model.cfg.d_vocab  # same length, another prompt: not the session's row
        assert torch.allclose(session.logits_at(other, other.numel() - 1), model(other[None])[0, -1], atol=1e-10)
    with pytest.raises(ValueError, match="logits"):
        PatchSession(model, logits="sometimes")


def test_logits_with_more_rows_share_the_unembedding(load, monkeypatch):
    """Issue 41: ``logits_with`` gives ``logits_at``'s logits and those of more unembedding inputs; where the query
    is the last update's unread lazy row, all go through the unembedding in one call (one read of its weights),
    and that row's logits are kept as ``last_logits``; elsewhere the same values from two calls."""
    import icl_lens.patches._incremental as inc

    model = load("tiny-gemma2", torch.float64)
    session = PatchSession(model, logits="lazy")
    ids = model.to_tokens(TEXT[:22])[0]
    session.update(ids)
    hidden = torch.randn(2, model.cfg.d_model, dtype=torch.float64)
    calls, unembedded = [], inc.unembedded
    monkeypatch.setattr(inc, "unembedded", lambda m, h: calls.append(h.shape[0]) or unembedded(m, h))
    q = ids.numel() - 1
    contextual, more = session.logits_with(ids, q, hidden)
    assert calls == [3] and session.logits_at(ids, q) is contextual  # one call of three rows; kept
    assert torch.allclose(contextual, model(ids[None])[0, -1], atol=1e-10)
    assert torch.allclose(more, unembedded(model, hidden), atol=1e-12)
    again, more2 = session.logits_with(ids, q - 1, hidden)  # not the session's last row
    assert torch.allclose(again, model(ids[None, :q])[0, -1], atol=1e-10) and torch.allclose(more2, more, atol=1e-12)


def test_session_norms_are_the_patches_norms_without_the_qr(load):
    """Issue 41: the session computes the output norms of its new positions only, from ``W δ`` while ``R`` (the QR
    that cost the first keystroke on Gemma ~8 s) is not computed; they equal the full recompute's norms."""
    from icl_lens.patches._capture import dense_weights

    model = load("tiny-gemma3", torch.float64)
    weights = dense_weights(model)
    weights._r.clear()
    session = PatchSession(model, logits=False)
    for cut in (20, 21, 40, 33):
        patches = session.update(TEXT[:cut])
        norms = patches.norms()
        assert not weights._r, "the session's norms computed the QR"
        ref = token_patches(model, TEXT[:cut])
        assert torch.allclose(norms, ref.norms(), rtol=1e-10, atol=1e-12), cut
        weights._r.clear()  # the reference may have computed it


def test_few_rows_are_unembedded_weight_first_with_the_models_readout(load, gemma):
    """Issue 41: up to ``FEW_ROWS`` rows, ``unembedded`` multiplies ``W_U @ hiddenᵀ`` itself (one stream of the
    weight for all rows); the logits equal the model's own unembedding and logit transform (tiny-gemma2 soft-caps
    them) with its bias, in float64 and on Gemma 3 in float32; ``as_forward`` runs the module itself (its bits); with
    a hook on the unembedding, the hook runs."""
    from icl_lens.model import activations_captured
    from icl_lens.model._greedy import FEW_ROWS, unembedded

    @torch.no_grad()
    def readout(model, hidden):
        return model.adapter.apply_output_logits_transform(model.unembed(hidden[None]))[0]

    for model, tol in ((load("tiny-gemma2", torch.float64), 1e-12), (load("tiny-llama", torch.float64), 1e-12),
                       (gemma, 1e-5)):
        head = model.unembed.original_component
        hidden = 3 * torch.randn(FEW_ROWS, model.cfg.d_model, dtype=head.weight.dtype)
        saved = head.bias.clone()
        try:
            head.bias.copy_(torch.randn_like(head.bias))  # a bias that matters
            for rows in (1, 2, FEW_ROWS, FEW_ROWS + 3):
                h = hidden[:rows] if rows <= FEW_ROWS else torch.cat([hidden, hidden[:3]])
                calls, forward = [], head.forward
                head.forward = lambda x: calls.append(1) or forward(x)  # seen without a hook
                try:
                    got = unembedded(model, h)
                    assert (calls == []) == (rows <= FEW_ROWS)  # more rows: torch's linear, as the module runs it
                    as_forward = unembedded(model, h, as_forward=True)  # the module, rounded as the forward rounds
                    assert calls and torch.equal(as_forward, readout(model, h))
                finally:
                    del head.forward
                want = readout(model, h)
                assert torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max())), (model.cfg.model_name, rows)
        finally:
            head.bias.copy_(saved)
        seen = []
        with activations_captured(model, [("unembed.hook_out", lambda x, hook: seen.append(x.shape[1]))]):
            unembedded(model, hidden[:2])
        assert seen == [2]
