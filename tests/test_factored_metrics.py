"""Closed-form rank-1 metrics agree with the dense matrices they stand for (tiny sizes)."""
import torch

from icl_lens.core._factored import diff_norm, gram_cosine, patch_cosine, patch_inner, patch_norm, sum_norm
from icl_lens.core._kept_attention import bos_and_self_output, default_kept_mask, kept_set_output
from icl_lens.core._token_patch import input_pseudo_inverse, token_patch


_GEN = torch.Generator().manual_seed(0)


def _rand(*shape):
    return torch.randn(*shape, generator=_GEN, dtype=torch.float64)


def test_norm_inner_cosine_match_dense():
    u1, v1, u2, v2 = _rand(7, 5), _rand(7, 3), _rand(7, 5), _rand(7, 3)
    d1, d2 = torch.einsum("bi,bj->bij", u1, v1), torch.einsum("bi,bj->bij", u2, v2)
    dense_inner = (d1 * d2).sum((-1, -2))
    assert torch.allclose(patch_norm(u1, v1), d1.flatten(1).norm(dim=-1))
    assert torch.allclose(patch_inner(u1, v1, u2, v2), dense_inner)
    assert torch.allclose(patch_cosine(u1, v1, u2, v2), dense_inner / d1.flatten(1).norm(dim=-1) / d2.flatten(1).norm(dim=-1))
    assert torch.allclose(diff_norm(u1, v1, u2, v2), (d1 - d2).flatten(1).norm(dim=-1))
    assert torch.allclose(sum_norm(u1, v1), d1.sum(0).norm())
    g = gram_cosine(u1, v1)
    assert torch.allclose(torch.diagonal(g), torch.ones(7, dtype=torch.float64))
    assert torch.allclose(g[2, 4], patch_cosine(u1[2], v1[2], u1[4], v1[4]))


def test_zero_patch_has_zero_cosine_not_nan():
    u, v = torch.zeros(4, 5), _rand(4, 3).float()
    assert torch.equal(patch_cosine(u, v, u, v), torch.zeros(4))


def test_token_patch_solves_the_defining_equation():
    W, A, a = _rand(6, 4), _rand(3, 4), _rand(3, 4)
    u, v, zero = token_patch(W, A, a)
    patched = torch.einsum("oi,bi->bo", W, a) + u * (v * a).sum(-1, keepdim=True)  # (W + u vᵀ) a
    assert torch.allclose(patched, A @ W.T)
    assert not zero.any()
    # Minimum norm: ΔW lies in the row space of a (v ∥ a), which the min-norm solution requires.
    assert torch.allclose(torch.linalg.matrix_rank(torch.stack([v[0], a[0]])), torch.tensor(1))


def test_zero_input_gets_zero_patch_and_is_flagged():
    a = torch.zeros(2, 4)
    a[1] = 1.0
    v, zero = input_pseudo_inverse(a)
    assert zero.tolist() == [True, False]
    assert torch.isfinite(v).all() and v[0].abs().max() == 0


def test_bos_and_self_output_is_the_kept_set_softmax_for_grouped_heads():
    """The default kept set's two-way form equals the general kept-set softmax, head h reading kv head h // group
    (grouped-query attention), with a per-row keep_bos and in the cached (offset) form."""
    batch, n_heads, n_kv, n, d = 2, 6, 2, 7, 5
    scores, values = _rand(batch, n_heads, n, n), _rand(batch, n, n_kv, d)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
    keep = torch.tensor([True, False])
    got = bos_and_self_output(scores, values, keep_bos=keep)
    for b in range(batch):
        kept = default_kept_mask(n, keep_bos=bool(keep[b]))
        want = kept_set_output(scores[b], values[b], kept)
        torch.testing.assert_close(got[b], want, rtol=1e-12, atol=1e-12)
    # cached decoding: queries 4.. of the same prompt, key 0's value passed in
    off = 4
    tail = bos_and_self_output(scores[:, :, off:], values[:, off:], keep_bos=True, offset=off,
                               bos_value=values[:, 0])
    torch.testing.assert_close(tail[0], kept_set_output(scores[0], values[0], default_kept_mask(n, keep_bos=True))[off:],
                               rtol=1e-12, atol=1e-12)
