"""Explicit SGD vs implicit update: the factored SGD equals dense SGD on real parameters,
closed-form cosines equal dense ones, the model is left unchanged, bad input fails fast."""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from icl_lens import FinetuneAlignment, finetune_alignment, load_model
from icl_lens.core._factored import stack_outputs
from icl_lens.model._block_family import block_family, original
from icl_lens.dynamics._explicit_finetune import contextual_target_loss
from icl_lens.patches._kept_only import kept_only_masks

TINY = ("tiny-gpt2", "tiny-llama", "tiny-gemma3")
PROMPT = "ab=1;cd=2;ef=3;ab=1;cd="
LR, STEPS = 0.05, 3


def _param_names(model) -> list[list[tuple[str, bool]]]:
    """Per layer: (HF parameter name, stored transposed?) of W_in/W_up and W_gate."""
    hf = model.original_model
    by_id = {id(p): n for n, p in hf.named_parameters()}
    out = []
    for block in model.blocks:
        mods = [original(block.mlp.__getattr__("in"))]
        if block_family(model).gated:
            mods.append(original(block.mlp.gate))
        out.append([(by_id[id(m.weight)], type(m).__name__ == "Conv1D") for m in mods])
    return out


def _reference_model(name: str, dtype: torch.dtype):
    """A Hugging Face model of its own for ``functional_call``, which leaves the weights it overrode non-leaf in the
    model it ran (the bridge keeps its own references to them): the session's shared model must stay intact."""
    return load_model(name, dtype=dtype).original_model


def _dense_sgd(name, model, ids, kept, contextual, steps, lr):
    """Reference: SGD on dense copies of the weights through torch.func.functional_call (on :func:`_reference_model`)."""
    hf = _reference_model(name, model.cfg.dtype)
    names = _param_names(model)
    params = dict(hf.named_parameters())
    deltas = {n: torch.zeros_like(params[n]) for layer in names for n, _ in layer}
    mask = kept_only_masks(model, kept)
    losses = []
    for _ in range(steps + 1):
        live = {n: d.clone().requires_grad_(True) for n, d in deltas.items()}
        override = {n: params[n].detach() + live[n] for n in live}
        logits = functional_call(hf, override, (ids[kept],), {"position_ids": kept, "attention_mask": mask}).logits
        loss = contextual_target_loss(logits[0, -1], contextual)
        losses.append(float(loss.detach()))
        if len(losses) > steps:
            break
        grads = torch.autograd.grad(loss, list(live.values()))
        for (n, d), g in zip(deltas.items(), grads):
            deltas[n] = d - lr * g
    return names, deltas, losses


@pytest.mark.parametrize("name", TINY)
def test_factored_sgd_equals_dense_sgd(load, name):
    model = load(name, torch.float64)
    result = finetune_alignment(model, PROMPT, lr=LR, steps=STEPS)
    ids = model.to_tokens(PROMPT)[0]
    t = ids.numel() - 1
    kept = torch.tensor([[0, t]])
    with torch.no_grad():
        contextual = model(ids[None])[0, -1]
    names, deltas, losses = _dense_sgd(name, model, ids, kept, contextual, STEPS, LR)
    assert torch.allclose(result.losses, torch.tensor(losses, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    assert losses[-1] < losses[0]  # SGD did learn something
    gated = result.explicit_u_gate is not None
    for layer, layer_names in enumerate(names):
        factors = [result.explicit_u_in[layer]] + ([result.explicit_u_gate[layer]] if gated else [])
        for (pname, transposed), u in zip(layer_names, factors):
            dense = torch.einsum("sru,srd->ud", u, result.explicit_v[layer])  # test-only reconstruction
            ref = deltas[pname].T if transposed else deltas[pname]
            scale = ref.abs().max()
            assert scale > 0
            assert float((dense - ref).abs().max() / scale) <= 1e-8, (layer, pname)


def test_model_left_unchanged(load):
    model = load("tiny-gemma3", torch.float64)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = model.to_tokens(PROMPT)
    with torch.no_grad():
        logits_before = model(ids)
    finetune_alignment(model, PROMPT, lr=0.5, steps=2)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    leaves = [(n, p) for n, p in model.original_model.named_parameters() if p.is_leaf]
    assert leaves and all(p.grad is None for _, p in leaves)
    with torch.no_grad():
        assert torch.equal(model(ids), logits_before)  # no hook left behind


def test_closed_form_cosines_match_dense(load):
    model = load("tiny-llama", torch.float64)
    res = finetune_alignment(model, PROMPT, lr=LR, steps=STEPS)
    U = stack_outputs(res.explicit_u_in, res.explicit_u_gate)  # layer step row d_u
    per_step = torch.einsum("lsru,lsrd->lsud", U, res.explicit_v)
    explicit = per_step.cumsum(1)  # E_s, s = 1..steps
    query_only = torch.einsum("lsu,lsd->lud", U[:, :, -1], res.explicit_v[:, :, -1])
    imp = torch.einsum("liu,lid->liud", res.implicit.stacked_u(), res.implicit.v)  # P_i
    flat = lambda x: x.flatten(-2)  # noqa: E731

    def cos(a, b):
        return (flat(a) * flat(b)).sum(-1) / (flat(a).norm(dim=-1) * flat(b).norm(dim=-1))

    total = explicit[:, -1]
    assert torch.allclose(res.cosine(), cos(imp[:, -1], total), atol=1e-10)
    assert torch.allclose(res.cosine("query"), cos(imp[:, -1], query_only), atol=1e-10)
    assert torch.allclose(res.cosine_by_sgd_step(), cos(imp[:, -1:], explicit), atol=1e-10)
    assert torch.allclose(res.explicit_norms(), flat(explicit).norm(dim=-1), rtol=1e-10)
    assert torch.allclose(res.cumulative_cosine()[:, 1:], cos(imp[:, 1:], total[:, None]), atol=1e-10)
    assert float(res.cumulative_cosine()[:, 0].abs().max()) == 0.0  # W_0 − W_0 = 0
    grads = imp[:, 1:] - imp[:, :-1]
    assert torch.allclose(res.meta_gradient_cosine(), cos(grads, total[:, None]), atol=1e-10)
    frame = res.to_frame()
    assert list(frame.columns) == ["layer", "step", "metric", "value"] and frame.value.notna().all()
    assert isinstance(res, FinetuneAlignment) and res.rows == (0, res.implicit.query)


def test_custom_loss_and_bad_input(load):
    model = load("tiny-gpt2", torch.float64)

    def logit_mse(logits, contextual):
        return ((logits - contextual) ** 2).mean()

    res = finetune_alignment(model, PROMPT, lr=1e-3, steps=2, loss=logit_mse)
    assert res.loss_name == "logit_mse" and res.losses.shape == (3,)
    assert float(res.losses[1]) < float(res.losses[0])
    with pytest.raises(ValueError):
        finetune_alignment(model, PROMPT, steps=0)
    with pytest.raises(ValueError):
        finetune_alignment(model, PROMPT, lr=-1.0)
    with pytest.raises(ValueError):
        finetune_alignment(model, PROMPT, steps=1, loss=lambda logits, ctx: logits)  # not a scalar
    with pytest.raises(ValueError):
        res.cosine(rows="bos")


@pytest.mark.parametrize("name", TINY)
def test_context_token_steps_equal_dense_gradients(load, name):
    """One descent direction per context token = −∇ of the dense weights (torch.func), BOS row included."""
    from icl_lens.dynamics._explicit_finetune import context_token_steps, context_token_steps_many

    model = load(name, torch.float64)
    steps = context_token_steps(model, PROMPT)
    ids = model.to_tokens(PROMPT)[0]
    hf = _reference_model(name, torch.float64)
    names = _param_names(model)
    params = dict(hf.named_parameters())
    assert steps.positions == tuple(range(1, ids.numel() - 1)) and steps.u.shape[2] == 2
    gated = block_family(model).gated
    d_mlp = model.cfg.d_mlp
    for j in (0, len(steps.positions) // 2, len(steps.positions) - 1):
        p = steps.positions[j]
        kept = torch.tensor([[0, p]])
        live = {n: torch.zeros_like(params[n], requires_grad=True) for layer in names for n, _ in layer}
        override = {n: params[n].detach() + live[n] for n in live}
        logits = functional_call(hf, override, (ids[kept],), {"position_ids": kept,
                                                              "attention_mask": kept_only_masks(model, kept)}).logits
        loss = torch.nn.functional.cross_entropy(logits[0, -1][None], ids[p + 1][None])
        assert float(loss.detach()) == pytest.approx(float(steps.losses[j]), rel=1e-9)
        grads = dict(zip(live, torch.autograd.grad(loss, list(live.values()))))
        for layer, layer_names in enumerate(names):
            u = steps.u[layer, j]  # row, d_u (gate first for gated MLPs)
            parts = [u[:, d_mlp:] if gated else u] + ([u[:, :d_mlp]] if gated else [])
            for (pname, transposed), part in zip(layer_names, parts):
                dense = torch.einsum("ru,rd->ud", part, steps.v[layer, j])
                ref = -(grads[pname].T if transposed else grads[pname])
                assert ref.abs().max() > 0
                assert float((dense - ref).abs().max() / ref.abs().max()) <= 1e-8, (layer, pname, j)
    # The batched form over several prompts gives the same steps.
    other = "zz=9;yy=8;zz="
    both = context_token_steps_many(model, [other, PROMPT], batch_rows=5)
    assert torch.allclose(both[1].u, steps.u, rtol=1e-9, atol=1e-12)
    assert torch.allclose(both[1].query_u, steps.query_u, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", TINY)
def test_context_effect_parts(load, name):
    """The full patch reproduces the contextual distribution; no patch is the context-free model;
    each part alone is in between, and several prompts batched give the per-prompt numbers."""
    from icl_lens.patches._context_effect import context_effect

    model = load(name, torch.float64)
    one = context_effect(model, PROMPT)
    assert float(one.kl["full"].max()) <= 1e-10
    assert float(one.kl["none"].mean()) > 1e-3
    un = one.unexplained()
    assert un["none"] == 1.0 and un["full"] <= 1e-9
    ids = model.to_tokens(PROMPT)[0]
    with torch.no_grad():
        free = model(ids[torch.tensor([[0, ids.numel() - 1]])], position_ids=torch.tensor([[0, ids.numel() - 1]]),
                     attention_mask=kept_only_masks(model, torch.tensor([[0, ids.numel() - 1]])))[0, -1]
        ctx = model(ids[None])[0, -1]
    kl = (ctx.softmax(-1) * (ctx.log_softmax(-1) - free.log_softmax(-1))).sum()
    assert float(one.kl["none"][-1]) == pytest.approx(float(kl), rel=1e-9)
    batched = context_effect(model, ["zz=9;yy=8;zz=", PROMPT], positions=[-1])
    assert batched.prompts == (0, 1)
    for variant in ("none", "w_in", "correction"):
        assert float(batched.kl[variant][1]) == pytest.approx(float(one.kl[variant][-1]), rel=1e-8)


def test_context_alignment_table_matches_direct_cosines(load):
    from icl_lens.dynamics._sgd_alignment import trajectory_sgd_cosines
    from icl_lens.dynamics._context_alignment import context_alignment
    from icl_lens.dynamics._explicit_finetune import context_token_steps
    from icl_lens import trajectory

    model = load("tiny-llama", torch.float64)
    prompts = [PROMPT, "zz=9;yy=8;zz=9;yy="]
    table = context_alignment(model, prompts)
    traj = trajectory(model, prompts[0], order="absorb")
    steps = context_token_steps(model, prompts[0])
    cum, step = trajectory_sgd_cosines(traj.stacked_u(), traj.v, steps.u, steps.v)
    assert torch.allclose(table.per_prompt["sgd:absorb:cumulative"][0].double(), cum.mean(-1), atol=1e-6)
    assert torch.allclose(table.per_prompt["sgd:absorb:step"][0].double(), step.mean(-1), atol=1e-6)
    assert set(table.summary().comparison) == {"sgd", "control", "query_input", "random"}
    with pytest.raises(ValueError, match="2 prompts"):
        context_alignment(model, prompts[:1])
