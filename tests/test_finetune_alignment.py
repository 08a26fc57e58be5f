"""Explicit SGD vs implicit update: the factored SGD equals dense SGD on real parameters,
closed-form cosines equal dense ones, the model is left unchanged, bad input fails fast."""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from icl_lens import FinetuneAlignment, finetune_alignment
from icl_lens.core.factored import stack_outputs
from icl_lens.model.block_family import block_family, original
from icl_lens.model.explicit_finetune import contextual_target_loss
from icl_lens.model.kept_only import kept_only_masks

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


def _dense_sgd(model, ids, kept, contextual, steps, lr):
    """Reference: SGD on dense copies of the weights through torch.func.functional_call."""
    hf = model.original_model
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
    names, deltas, losses = _dense_sgd(model, ids, kept, contextual, STEPS, LR)
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
