"""Who wrote a patch (docs/design.md §7): the heads × removed-tokens parts of every token patch and skip
correction sum to them, on every block family, every layer and every query position (float64 ≤ 1e-9, float32 ≤
1e-5 relative); planted faults break that; a single-head norm-free toy matches its closed form; a PatchSession's
cache gives the same shares; what the patch writes is the readout's derivative along the MLP output change."""
from __future__ import annotations

import pytest
import torch

from icl_lens import PatchSession, token_patches
from icl_lens.core import _attribution as core
from icl_lens.core._kept_attention import kept_set_output
from icl_lens.patches import _attribution as attribution_module
from icl_lens.patches._attribution import PARTS, patch_attribution
from icl_lens.model._block_family import block_family
from icl_lens.model._names import TINY_NAMES

PROMPT = "ab=1;cd=2;ef=3;ab=1;cd="  # past every tiny model's sliding window of 6
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5}


def completeness_errors(model, prompt: str = PROMPT, **kwargs) -> dict[str, float]:
    """Worst relative error, over every layer and query position, of the parts' sums against the token patches:
    ``‖R (Σ δ_hj − δ)‖/‖R δ‖`` (the patch, ‖W ·‖ = ‖R ·‖) and ``‖Σ c_hj − c‖/‖c‖`` (the correction), from
    ``token_patches`` (an independent computation); and the shares against the parts' inner products."""
    patches = token_patches(model, prompt, **kwargs)
    n = len(patches.tokens)
    found = patch_attribution(model, prompt, list(range(n)), parts=True, **kwargs)
    worst = {"patch": 0.0, "correction": 0.0, "share": 0.0, "sum": 0.0}
    for t, at in enumerate(found):
        assert at.position == t and at.layers == patches.layers
        for row, layer in enumerate(at.layers):
            R = patches.weights.r(layer)
            delta, corr = patches.delta[row, t], patches.correction[row, t]
            got_delta = at.delta_parts[row].sum((0, 1))
            got_corr = at.correction_parts[row].sum((0, 1))
            rounding = 1e3 * torch.finfo(delta.dtype).eps
            for key, got, err, whole, size in (
                    ("patch", got_delta, R @ (got_delta - delta), R @ delta, R @ at.mlp_input[row]),
                    ("correction", got_corr, got_corr - corr, corr, at.mlp_input[row])):
                if not bool(got.any()):  # no part (every removed key outside a sliding window): the whole is 0
                    worst[key] = max(worst[key], float(whole.norm()) / (rounding * float(size.norm())) * tol(delta))
                    continue
                scale = float(whole.norm())
                worst[key] = max(worst[key], float(err.norm()) / scale if scale > 0 else float(err.norm()))
            # shares = inner products of the parts with the whole, computed without the parts
            coords = at.delta_parts[row] @ R.T
            whole = R @ delta
            if float(whole.norm()) > rounding * float((R @ at.mlp_input[row]).norm()) and not at.parallel:
                expected = coords @ whole / whole.dot(whole)
                worst["share"] = max(worst["share"], float((at.patch_share[row] - expected).abs().max()))
                worst["sum"] = max(worst["sum"], abs(float(at.patch_share[row].sum()) - 1))
            if float(corr.norm()) > rounding * float(at.mlp_input[row].norm()):
                expected = at.correction_parts[row] @ corr / corr.dot(corr)
                worst["share"] = max(worst["share"], float((at.correction_share[row] - expected).abs().max()))
                worst["sum"] = max(worst["sum"], abs(float(at.correction_share[row].sum()) - 1))
    return worst


def tol(x: torch.Tensor) -> float:
    return TOLERANCE[x.dtype]


def assert_complete(model, **kwargs) -> dict[str, float]:
    worst = completeness_errors(model, **kwargs)
    tol = TOLERANCE[model.cfg.dtype]
    assert max(worst.values()) <= tol, worst
    return worst


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", TINY_NAMES)
def test_parts_sum_to_the_patch_and_the_correction(load, name, dtype, one_thread):
    model = load(name, dtype)
    worst = assert_complete(model)
    print(f"{name} {dtype}: {worst}")
    at = patch_attribution(model, PROMPT, -1)
    assert at.sources and len(at.sources) == len(at.tokens) - len(at.kept)
    if block_family(model).parallel:  # the MLP input does not see attention: the correction carries everything
        assert float(at.patch_share.abs().max()) == 0 and float(at.patch_norm.abs().max()) == 0
        assert "parallel block" in at.note()
    else:
        assert float(at.patch_norm.min()) > 0
    assert torch.allclose(at.correction_share.sum((1, 2)), torch.ones(len(at.layers), dtype=dtype), atol=1e-5)


def test_parts_sum_for_another_kept_set(load, one_thread):
    """``remove=`` (context ablation): only tokens 5..9 are sources, and their parts sum to that patch."""
    model = load("tiny-gemma3", torch.float64)
    assert_complete(model, remove=range(5, 10))
    at = patch_attribution(model, PROMPT, 12, remove=range(5, 10))
    assert at.sources == (5, 6, 7, 8, 9) and at.kept == (0, 1, 2, 3, 4, 10, 11, 12)


def _drop_head(fn):
    def dropped(alpha, values, kept, removed, w_o, *args):
        out = fn(alpha, values, kept, removed, w_o, *args)
        out[..., 0, :, :] = 0  # head 0 is forgotten
        return out
    return dropped


def _bos_counted_as_removed(fn):
    def counted(n, positions, **kwargs):
        kept = fn(n, positions, **kwargs).clone()
        kept[torch.tensor(positions) > 0, 0] = False  # the kept BOS becomes a source (and leaves the kept mix)
        return kept
    return counted


@pytest.mark.parametrize("fault", ["dropped head", "kept token counted as removed", "Jacobian at the wrong end"])
def test_a_planted_fault_breaks_completeness(load, monkeypatch, fault, one_thread):
    model = load("tiny-gemma3", torch.float64)
    if fault == "dropped head":
        monkeypatch.setattr(attribution_module, "head_source_parts", _drop_head(core.head_source_parts))
        monkeypatch.setattr(attribution_module, "head_source_shares", _drop_head(core.head_source_shares))
    elif fault == "kept token counted as removed":
        monkeypatch.setattr(attribution_module, "kept_keys", _bos_counted_as_removed(attribution_module.kept_keys))
    else:  # every quadrature node at s = 1: the Jacobian of the contextual end instead of the path's mean
        def at_the_end(n, *, dtype=torch.float64, device="cpu"):
            return torch.ones(n, dtype=dtype, device=device), torch.full((n,), 1.0 / n, dtype=dtype, device=device)
        monkeypatch.setattr(core, "gauss_legendre", at_the_end)
    with pytest.raises(AssertionError):
        assert_complete(model)


def test_single_head_norm_free_toy_matches_its_closed_form():
    """One head, no norms, ``A = r + W_O z``: the parts are ``α_j O (v_j − v̄)`` and the shares
    ``⟨W δ_j, W δ⟩/‖W δ‖²`` in closed form (every quantity built by hand, in float64)."""
    g = torch.Generator().manual_seed(0)
    n, d_head, d, d_mlp = 9, 5, 7, 11
    scores = torch.randn(n, generator=g, dtype=torch.float64) * 2
    alpha = torch.softmax(scores, -1)
    values = torch.randn(n, 1, d_head, generator=g, dtype=torch.float64)
    w_o = torch.randn(1, d_head, d, generator=g, dtype=torch.float64)
    W = torch.randn(d_mlp, d, generator=g, dtype=torch.float64)
    r = torch.randn(d, generator=g, dtype=torch.float64)
    kept = torch.zeros(n, dtype=torch.bool)
    kept[[0, n - 1]] = True  # BOS and the query
    removed = ~kept
    # closed form
    v = values[:, 0]
    vbar = (alpha[kept, None] * v[kept]).sum(0) / alpha[kept].sum()
    A = r + (alpha[:, None] * v).sum(0) @ w_o[0]
    a = r + vbar @ w_o[0]
    parts = torch.stack([alpha[j] * (v[j] - vbar) @ w_o[0] if removed[j] else torch.zeros(d, dtype=torch.float64)
                         for j in range(n)])
    assert float((parts.sum(0) - (A - a)).abs().max()) <= 1e-12
    u = parts @ W.T
    share = u @ (W @ (A - a)) / (W @ (A - a)).square().sum()
    # the library's path: integrated Jacobian of the (here linear) map, then the share algebra
    R = torch.linalg.qr(W, mode="r")[1]
    fn = lambda x: r + x  # noqa: E731  the MLP input as a function of raw
    raw_0, raw_C = vbar @ w_o[0], (alpha[:, None] * v).sum(0) @ w_o[0]
    cot = core.share_cotangent((A - a)[None], R)
    g_vec = core.integrated_vjp(fn, raw_0[None], raw_C[None], cot, 3)
    mix = kept_set_output(scores[None, None], values, kept[None])[0]  # [1 head, d_head]: v̄ from the scores
    assert float((mix[0] - vbar).abs().max()) <= 1e-12
    got = core.head_source_shares(alpha[None, None], values, mix[None], removed[None], w_o, g_vec)[0, 0]
    assert float((got - share).abs().max()) <= 1e-12
    assert abs(float(got.sum()) - 1) <= 1e-12
    M = core.integrated_jacobian(fn, raw_0[None], raw_C[None], 3)[0]
    got_parts = core.head_source_parts(alpha[None], values, mix, removed, w_o)[0] @ M.T
    assert float((got_parts - parts).abs().max()) <= 1e-12


def test_quadrature_is_exact_for_polynomials_and_measures_a_curved_path():
    """n Gauss–Legendre nodes integrate a degree-(2n−1) polynomial exactly; on RMSNorm's curved path the error
    falls as nodes are added and the integrated Jacobian reproduces the difference of the endpoints."""
    nodes, weights = core.gauss_legendre(4)
    assert abs(float((weights * nodes ** 7).sum()) - 1 / 8) <= 1e-15
    g = torch.Generator().manual_seed(1)
    x0, x1 = torch.randn(2, 6, generator=g, dtype=torch.float64)
    norm = lambda x: x / x.square().mean(-1, keepdim=True).add(1e-6).sqrt()  # noqa: E731
    errs = [float((core.integrated_jacobian(norm, x0, x1, n) @ (x1 - x0) - (norm(x1) - norm(x0))).norm())
            for n in (2, 8, 32)]
    assert errs[0] > errs[1] > errs[2] and errs[2] <= 1e-12


def test_the_session_cache_gives_the_same_shares(load, one_thread):
    """A PatchSession holding a longer prompt lends its keys and values: only the query runs, same result."""
    model = load("tiny-gemma3", torch.float64)
    session = PatchSession(model, logits=False)
    session.update(PROMPT + "3;gh=4")
    for t in (9, len(PROMPT)):  # a pinned query inside the prompt, and the last token of PROMPT
        plain = patch_attribution(model, PROMPT, t)
        lent = patch_attribution(model, PROMPT, t, session=session)
        for part in PARTS:
            assert float((plain.shares(part) - lent.shares(part)).abs().max()) <= 1e-12
        assert torch.allclose(plain.final_residual, lent.final_residual, rtol=0, atol=1e-12)


def test_frames_summaries_and_errors(load):
    model = load("tiny-llama", torch.float64)
    at = patch_attribution(model, PROMPT, -1, layers=[0, 2], norms=True)
    frame = at.to_frame()
    assert list(frame.columns) == ["part", "position", "layer", "head", "source_position", "source_token", "offset",
                                   "share", "norm"]
    n_sources = len(at.sources)
    assert len(frame) == 2 * 2 * model.cfg.n_heads * n_sources and set(frame.layer) == {0, 2}
    assert frame.norm.notna().all() and (frame.offset == at.position - frame.source_position).all()
    assert at.head_map(2).shape == (model.cfg.n_heads, n_sources)
    assert torch.allclose(at.layer_heads().sum(-1), at.patch_share.sum((1, 2)))
    top = at.top(3, layer=2)
    assert len(top) == 3 and top.share.is_monotonic_decreasing and set(top.layer) == {2}
    with pytest.raises(ValueError, match="layer 1 is not held"):
        at.head_map(1)
    with pytest.raises(IndexError, match="outside the prompt"):
        patch_attribution(model, PROMPT, 99)
    with pytest.raises(ValueError, match="layers must be in"):
        patch_attribution(model, PROMPT, 3, layers=[7])
    empty = patch_attribution(model, PROMPT, 1)  # BOS and itself: nothing removed
    assert empty.sources == () and "no removed context" in empty.note() and empty.to_frame().empty
    assert float(empty.patch_norm.abs().max()) == 0


def test_what_the_patch_writes_is_the_readouts_derivative(load):
    """The patch's write at a layer is MLP(A) − MLP(a) (after the post-FFN norm); the logit changes are the
    derivative of the model's own readout (final norm, unembedding, soft-cap) along it (central differences)."""
    model = load("tiny-gemma2", torch.float64)  # post-FFN norm and final-logit soft-capping
    at = patch_attribution(model, PROMPT, -1)
    layer = at.layers[int(at.patch_norm.argmax())]
    writes = at.writes(model, layers=layer, k=4)
    row = at.layers.index(layer)
    block = model.blocks[layer]
    with torch.no_grad():
        out = block.ln2_post(block.mlp(torch.stack([at.mlp_input[row], at.kept_input[row]])[None]))[0]
        change = out[0] - out[1]
        readout = lambda x: model.adapter.apply_output_logits_transform(  # noqa: E731
            model.unembed(model.ln_final(x[None, None])))[0, 0]
        eps = 1e-6
        for part, vec in zip(PARTS, (change, at.correction[row])):
            numeric = (readout(at.final_residual + eps * vec) - readout(at.final_residual - eps * vec)) / (2 * eps)
            p = PARTS.index(part)
            ids = writes.promoted_ids[p, 0]
            assert torch.allclose(writes.promoted_logits[p, 0], numeric[ids], rtol=1e-6, atol=1e-9)
            assert int(ids[0]) == int(numeric.argmax()) and int(writes.suppressed_ids[p, 0, 0]) == int(numeric.argmin())
    assert abs(float(writes.output_norms[0, 0]) - float(change.norm())) <= 1e-9
    frame = writes.to_frame()
    assert len(frame) == 2 * 1 * 2 * 4 and "first-order" in writes.view


def test_a_parallel_blocks_patch_writes_nothing(load):
    model = load("tiny-gpt-neox", torch.float64)
    at = patch_attribution(model, PROMPT, -1)
    writes = at.writes(model, k=3)
    assert float(writes.output_norms[0].abs().max()) == 0 and float(writes.output_norms[1].min()) > 0


@pytest.mark.parametrize("fixture", ["gemma", "smollm"])
def test_embedded_models_parts_sum_to_the_patch_float32(request, fixture):
    """The embedded models, one query through a PatchSession: the parts sum to the token patch and the correction
    within 1e-5 relative (the patch: plus the float32 rounding of the reference itself: ``δ = A − a`` in float32 carries about
    ``eps·‖A‖``, which is more than 1e-5 of ``‖δ‖`` where the patch is 1% of the MLP input (SmolLM2 layer 25 here:
    the float32 token patch is 1.1e-5 from the float64 one, the attribution's sum 2e-6))."""
    model = request.getfixturevalue(fixture)
    prompt = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
    patches = token_patches(model, prompt)
    session = PatchSession(model, logits=False)
    session.update(prompt)
    t = len(patches.tokens) - 1
    at = patch_attribution(model, prompt, t, session=session, parts=True)
    eps = torch.finfo(torch.float32).eps
    for row, layer in enumerate(at.layers):
        R = patches.weights.r(layer)
        delta, corr, A = patches.delta[row, t], patches.correction[row, t], at.mlp_input[row]
        floor = 8 * eps * float((R @ A).norm())
        assert float((R @ (at.delta_parts[row].sum((0, 1)) - delta)).norm()) <= 1e-5 * float((R @ delta).norm()) + floor, \
            layer
        assert float((at.correction_parts[row].sum((0, 1)) - corr).norm()) <= 1e-5 * float(corr.norm()), layer
    assert float(at.patch_residual.abs().max()) <= 1e-5 and float(at.correction_residual.abs().max()) <= 1e-5
    assert torch.allclose(at.patch_norm, patches.norms()[:, t], rtol=1e-5)
