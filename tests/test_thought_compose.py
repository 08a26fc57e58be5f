"""Issue 22: the preserve penalty of the one least-squares fit, the model's own samples, and composed patches."""
from __future__ import annotations

import pytest
import torch

from icl_lens import thought_patch
from icl_lens.core._least_squares import (factored_least_squares, gain_vector, gram, input_map, mean_vector,
                                          preserve_weight)
from icl_lens.model._block_family import block_family
from icl_lens.model._greedy import last_logits
from icl_lens.thought._preserve import bos_samples, preserve_texts
from icl_lens.thought._result import ThoughtPatch

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
    # a gram that is not positive definite (here an indefinite penalty) is solved by LU, not left to Cholesky's failure
    bad = -3.0 * torch.eye(8, dtype=torch.float64)
    _, v = factored_least_squares(t, x, ridge=0.3, penalty=bad)
    gram = x.T @ x + bad + 0.3 * torch.eye(8, dtype=torch.float64)
    assert torch.linalg.cholesky_ex(gram).info > 0
    assert torch.allclose(v, torch.linalg.solve(gram, x.T).T, atol=1e-10)
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

    from icl_lens.thought._locality import load_locality
    from icl_lens.thought._preserve import PRESERVE_DIR

    measured = set(load_locality().texts)
    files = sorted(p for p in PRESERVE_DIR.glob("*.json") if p.name != "few_shot.json")
    assert len(files) == 2
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["generated_by"].startswith("python -m experiments.thought.preserve_samples")
        assert len(data["texts"]) >= 32 and not measured & set(data["texts"]), path.name


def test_few_shot_prompts_are_the_scripts_and_stay_apart_from_the_locality_measure(load):
    """The shipped few-shot preserve prompts are what the committed script writes; none holds an item of the
    locality measure's other task (a planted one is refused); the fit half holds the even-numbered prompts, the
    held-out half the others, every format in both; a model with a short context gets each prompt cut to it."""
    import json

    from experiments.thought import few_shot_preserve as fsp
    from experiments.thought.preserve_samples import write_few_shot
    from icl_lens.model._prompts import context_limit
    from icl_lens.thought._preserve import FEW_SHOT_FILE, few_shot_texts

    data = json.loads(FEW_SHOT_FILE.read_text(encoding="utf-8"))
    assert data["generated_by"] == "python -m experiments.thought.preserve_samples --few-shot-only"
    assert data["texts"] == fsp.texts() == few_shot_texts() and len(data["texts"]) == fsp.N_TASKS >= 20
    before = FEW_SHOT_FILE.read_bytes()
    write_few_shot()  # the script refuses nothing and rewrites the same bytes
    assert FEW_SHOT_FILE.read_bytes() == before
    with pytest.raises(ValueError, match="item of the locality"):
        fsp.check(set(), {fsp.TASKS[3][1][2][0]})
    with pytest.raises(ValueError, match="is a locality text"):
        fsp.check({fsp.text(5)}, set())
    for half in (0, 1):
        assert {i % len(fsp.FORMATS) for i in range(half, fsp.N_TASKS, 2)} == set(range(len(fsp.FORMATS)))
    smol = load("tiny-llama")  # 256 positions: some prompts are longer in its tokenizer
    fit, held = preserve_texts(smol, "fit"), preserve_texts(smol, "held_out")
    room = context_limit(smol) - 1
    prompts = few_shot_texts()
    for got, wanted in ((fit, prompts[0::2]), (held, prompts[1::2])):
        tail = got[-len(wanted):]
        assert all(w.startswith(g) for g, w in zip(tail, wanted))
        assert all(len(smol.tokenizer(g, add_special_tokens=False)["input_ids"]) <= room for g in tail)
    assert any(g != w for g, w in zip(fit[-len(prompts[0::2]):] + held[-len(prompts[1::2]):],
                                      prompts[0::2] + prompts[1::2]))  # at least one was cut


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


COLOURS = "Colours: red, blue, green.\n"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_joint_fit_over_one_task_is_the_single_fit(load, name):
    """thought_patch_joint over one task is thought_patch: the default kind, answer rows and the preserve penalty."""
    from icl_lens import thought_patch_joint

    model = load(name, torch.float64)
    settings = dict(answer_tokens=2, preserve=["The cat sat on the mat.", "1, 2, 3, 4"], preserve_strength=1.0)
    single = thought_patch(model, INSTRUCTION, ["q", "ab"], **settings)
    joint = thought_patch_joint(model, [(INSTRUCTION, ["q", "ab"])], **settings)
    for part in ("maps", "vectors", "down_u", "down_v"):
        assert torch.allclose(getattr(joint, part), getattr(single, part), rtol=0, atol=1e-12), part
    assert float(single.down_u.abs().max()) > 0 and joint.method == "joint" and single.method == "fit"
    assert joint.n_tokens == single.n_tokens and joint.queries == ("q", "ab")


def _rows(model, hooks: list[str], ids: list[int], start: int) -> dict[str, torch.Tensor]:
    """Each hook's activations at positions ``start:`` of one sequence (every position of a short prompt)."""
    _, cache = model.run_with_cache(torch.tensor([ids]), names_filter=lambda n: n in hooks)
    return {h: cache[h][0, start:].double() for h in hooks}


def test_joint_fit_solves_the_normal_equations_over_every_tasks_rows(load):
    """Two tasks, layer 0 only (kind "both", ridge 0.5): the input map solves the normal equations
    ``(D − X Mᵀ)ᵀ X = λ M`` over both tasks' query rows and the anchor rows (BOS, prefix; target 0), built here by
    reading each query after its own instruction with the model's own cache; the bias makes the block-0 residual
    sum to zero over both tasks' query rows. Dropping a task, reading it after the other task's instruction or
    counting it twice breaks both."""
    from icl_lens import thought_patch_joint
    from icl_lens.thought._instruction_batches import prefix_ids, text_ids, with_bos

    model = load("tiny-llama", torch.float64)
    family = block_family(model)
    a_hook, o_hook = family.mlp_input(0), family.resid_post(0)
    tasks = [(INSTRUCTION, ["q", "ab"]), (COLOURS, ["x", "yz w"])]
    patch = thought_patch_joint(model, tasks, kind="both", ridge=0.5, layers=[0], answer_tokens=0, preserve=())
    pre = prefix_ids(model, patch.query_prefix)
    x, d, o_ctx, o_plain = [], [], [], []
    for instruction, queries in tasks:
        for q in queries:
            q_ids = text_ids(model, q)
            ctx = _rows(model, [a_hook, o_hook], with_bos(model, text_ids(model, instruction) + q_ids), -len(q_ids))
            plain_ids = with_bos(model, pre + q_ids)
            plain = _rows(model, [a_hook], plain_ids, 0)[a_hook]
            n_anchor = len(plain_ids) - len(q_ids)
            x += [plain]  # anchors first, then the query tokens
            d += [torch.zeros(n_anchor, plain.shape[1], dtype=plain.dtype), ctx[a_hook] - plain[n_anchor:]]
            o_ctx.append(ctx[o_hook])
            with patch.applied():
                o_plain.append(_rows(model, [o_hook], plain_ids, n_anchor)[o_hook])
    x, d = torch.cat(x), torch.cat(d)
    m = patch.maps[0].double()
    lam = 0.5 * float((x ** 2).sum()) / x.shape[1]
    gradient = (d - x @ m.T).T @ x - lam * m
    assert float(torch.linalg.norm(d.T @ x)) > 1e-3  # the instructions matter at layer 0
    assert float(torch.linalg.norm(gradient)) <= 1e-9 * float(torch.linalg.norm(d.T @ x))
    rho = torch.cat(o_ctx) - torch.cat(o_plain)  # what the patched block 0 leaves, every query row of both tasks
    assert float(torch.linalg.norm(rho.sum(0))) <= 1e-9 * float(torch.linalg.norm(rho))
    assert float(torch.linalg.norm(rho)) > 1e-3


def test_the_least_squares_refuses_non_finite_inputs_and_keeps_huge_finite_ones():
    """A NaN or inf anywhere (targets, inputs, penalty) raises; finite entries whose sum overflows do not."""
    from icl_lens.core import SingularFitError

    x, t = torch.ones(3, 4), torch.ones(3, 2)
    for where in ("targets", "inputs", "penalty"):
        for bad in (float("nan"), float("inf"), -float("inf")):
            args = {"targets": t.clone(), "inputs": x.clone(), "penalty": torch.eye(4)}
            args[where][1, 1] = bad
            with pytest.raises(SingularFitError, match=where if where != "penalty" else "preserve penalty"):
                factored_least_squares(args["targets"], args["inputs"], ridge=0.1, penalty=args["penalty"])
    huge = torch.diag(torch.full((4,), 3e38))  # finite, but the float32 sum of its entries overflows to inf
    assert not torch.isfinite(huge.sum())
    u, v = factored_least_squares(t, x, ridge=0.1, penalty=huge)
    assert torch.isfinite(u).all() and torch.isfinite(v).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gram_multiplies_the_upper_strips_and_mirrors_them(dtype):
    """Issue 41: ``gram`` (the preserve covariances ``K₀K₀ᵀ`` from keys as rows) equals ``x.T @ x`` for widths that
    are, are not, and are below a multiple of its strip, and is exactly symmetric."""
    g = torch.Generator().manual_seed(0)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for rows, width, block in ((37, 64, 16), (37, 70, 16), (5, 9, 16), (200, 300, 256), (3, 1, 4)):
        x = torch.randn(rows, width, generator=g, dtype=dtype)
        got, want = gram(x, block), x.T @ x
        assert got.shape == (width, width) and got.dtype == dtype
        assert float((got - want).abs().max()) <= tol * float(want.abs().max()), (rows, width, block)
        assert torch.equal(got, got.T)
