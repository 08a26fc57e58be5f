"""Issue 22: the preserve penalty of the one least-squares fit, the model's own samples, and composed patches."""
from __future__ import annotations

import pytest
import torch

from icl_lens import thought_patch
from icl_lens.core.least_squares import factored_least_squares, gain_vector, input_map, mean_vector, preserve_weight
from icl_lens.model.greedy import last_logits
from icl_lens.thought.preserve import bos_samples, preserve_texts
from icl_lens.thought.result import ThoughtPatch

INSTRUCTION = "Remember: the secret word is banana, and 7 follows 3.\n"


def test_penalised_least_squares_is_the_augmented_system():
    """min ‖T − X Mᵀ‖² + w‖K₀ Mᵀ‖² + λ‖M‖² is least squares over [X; √w K₀] with targets [T; 0] (MEMIT eq. 14)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 8, generator=gen, dtype=torch.float64)
    t = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    k0 = torch.randn(20, 8, generator=gen, dtype=torch.float64)
    for lam in (0.0, 0.3):
        w = preserve_weight(x, k0.T @ k0, 2.0)
        assert w == pytest.approx(2.0 * float((x ** 2).sum()) / float((k0 ** 2).sum()))
        u, v = factored_least_squares(t, x, ridge=lam, penalty=w * k0.T @ k0)
        assert u.shape == (5, 6) and v.shape == (5, 8)  # still n factor rows
        xa = torch.cat([x, w ** 0.5 * k0, lam ** 0.5 * torch.eye(8, dtype=torch.float64)])
        ta = torch.cat([t, torch.zeros(28, 6, dtype=torch.float64)])
        expected = torch.linalg.lstsq(xa, ta).solution.T
        assert torch.allclose(u.T @ v, expected, atol=1e-10)
        delta = torch.randn(5, 8, generator=gen, dtype=torch.float64)
        u2, v2 = factored_least_squares(delta, x, ridge=lam, penalty=w * k0.T @ k0)
        assert torch.allclose(input_map(delta, x, ridge=lam, penalty=w * k0.T @ k0), u2.T @ v2)
    rho = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    assert torch.allclose(mean_vector(rho, penalty=4.0), rho.sum(0) / 8)
    y = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    p = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    assert torch.allclose(gain_vector(rho, y, penalty=p), (rho * y).sum(0) / ((y * y).sum(0) + p))


def test_bos_samples_are_seeded_and_split_in_halves(load):
    model = load("tiny-llama")
    a, b = bos_samples(model, 6, 5, seed=1), bos_samples(model, 6, 5, seed=1)
    assert a == b and len(a) >= 4 and a != bos_samples(model, 6, 5, seed=2)
    fit, held, every = (preserve_texts(model, s) for s in ("fit", "held_out", "all"))
    assert fit + held == every and len(fit) == len(every) // 2 and not set(fit) & set(held)
    with pytest.raises(ValueError):
        preserve_texts(model, "test")


def test_shipped_samples_never_hold_a_locality_text():
    import json

    from icl_lens.thought.locality import load_locality
    from icl_lens.thought.preserve import PRESERVE_DIR

    measured = set(load_locality().texts)
    files = sorted(PRESERVE_DIR.glob("*.json"))
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["generated_by"].startswith("python -m experiments.thought.preserve_samples")
        assert len(data["texts"]) >= 32 and not measured & set(data["texts"]), path.name


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_composed_patches_add_their_edits(load, name):
    """One patch composed alone is that patch; with a zero patch it is unchanged; two patches' maps, vectors and
    ΔW_out add; mismatched kinds are refused."""
    model = load(name, torch.float64)
    p = thought_patch(model, INSTRUCTION, ["q", "ab"], answer_tokens=0)
    q = thought_patch(model, "Colours: red, blue, green.\n", ["x", "yz"], answer_tokens=0)
    ids = [p.prompt_ids("q")]

    def logits(patch):
        with patch.applied():
            return last_logits(model, ids)[0]

    zero = q.random_control().__class__(**{**{f: getattr(q, f) for f in q.__dataclass_fields__},
                                             "maps": torch.zeros_like(q.maps), "vectors": torch.zeros_like(q.vectors),
                                             "down_u": torch.zeros_like(q.down_u)})
    assert torch.equal(logits(ThoughtPatch.composed([p])), logits(p))
    assert torch.allclose(logits(ThoughtPatch.composed([p, zero])), logits(p), atol=1e-12)
    both = ThoughtPatch.composed([p, q])
    assert torch.allclose(both.maps, p.maps + q.maps) and torch.allclose(both.vectors, p.vectors + q.vectors)
    for l in both.layers:
        dw = lambda t: t.down_u[l].T @ t.down_v[l]  # noqa: E731
        assert torch.allclose(dw(both), dw(p) + dw(q))
    assert not torch.allclose(logits(both), logits(p))
    assert both.method == "composed"
    with pytest.raises(ValueError, match="kind"):
        ThoughtPatch.composed([p, thought_patch(model, INSTRUCTION, ["q"], kind="both", answer_tokens=0)])
