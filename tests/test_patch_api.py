"""The researcher's TokenPatches API: ``layers=`` (library and CLI), ``select``, ``len`` and a short ``repr``."""
import json
import subprocess
import sys
from dataclasses import fields, replace

import numpy as np
import pytest
import torch
from torch import Tensor

from icl_lens import TokenPatches, token_patches, verify_equivalence
from icl_lens.patches._kept_only import kept_only_logits
from icl_lens.model._reading import activations_captured

PROMPT = "The cat sat. The cat"


@pytest.fixture(scope="module")
def model(load):
    return load("tiny-gemma3", torch.float64)  # 4 layers, gated, sandwich norms


@pytest.fixture(scope="module")
def full(model):
    return token_patches(model, PROMPT)


def _tensor_fields(p: TokenPatches) -> dict[str, Tensor]:
    """Every per-layer tensor field, whatever the fields are (u, δ, a, ...): all but the prompt-wide ones."""
    return {f.name: getattr(p, f.name) for f in fields(p)
            if isinstance(getattr(p, f.name), Tensor) and f.name not in ("token_ids", "kept")}


def test_layers_keep_true_indices_and_equal_the_full_rows(model, full, tmp_path):
    part = token_patches(model, PROMPT, layers=[-1, 1, 1])
    assert part.layers == (1, 3) and part.n_layers == 2 and full.layers == (0, 1, 2, 3)
    for name, value in _tensor_fields(part).items():
        assert torch.allclose(value, _tensor_fields(full)[name][[1, 3]], rtol=1e-12, atol=0), name
    frame = part.to_frame()
    assert sorted(frame.layer.unique()) == [1, 3]
    merged = frame.merge(full.to_frame(), on=["layer", "position"], suffixes=("", "_all"))
    assert len(merged) == len(frame) and (merged.token == merged.token_all).all()
    back = TokenPatches.load(part.save(tmp_path / "part.safetensors"))
    assert back.layers == (1, 3) and torch.equal(back.v, part.v)
    batch = token_patches(model, [PROMPT, "hi"], layers=[2])
    assert [p.layers for p in batch] == [(2,), (2,)]
    for bad in ([4], [-5], []):
        with pytest.raises(ValueError, match=r"layers must be in 0\.\.3 \(the model has 4 layers\)"):
            token_patches(model, PROMPT, layers=bad)


def test_layers_stop_the_forward_after_the_last_one(model):
    later = "blocks.2.hook_resid_pre"
    with activations_captured(model, [later]) as seen:
        token_patches(model, PROMPT, layers=[0, 1])
    assert later not in seen
    with activations_captured(model, [later]) as seen:
        token_patches(model, PROMPT, layers=[2])
    assert later in seen


def test_kept_only_forward_edits_the_true_layers(model, full):
    """A selection of layer 2 edits layer 2: the same logits as all patches with the other layers zeroed."""
    ids = full.token_ids
    only = full.select(layers=[2])
    zero_others = replace(full, **{k: v.clone() for k, v in _tensor_fields(full).items()})
    for value in _tensor_fields(zero_others).values():
        value[[0, 1, 3]] = 0
    queries = [3, len(ids) - 1]
    got = kept_only_logits(model, ids, only, queries)
    assert torch.allclose(got, kept_only_logits(model, ids, zero_others, queries), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(got, kept_only_logits(model, ids, full, queries), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="every layer and position"):
        verify_equivalence(model, PROMPT, only)
    with pytest.raises(ValueError, match="every position"):
        kept_only_logits(model, ids, full.select(positions=[-1]), [len(ids) - 1])


def test_select_slices_every_field_and_keeps_true_indices(model, full, tmp_path):
    n = len(full.tokens)
    sel = full.select(layers=[0, -1], positions=[-1, 2])
    assert sel.layers == (0, 3) and sel.positions == (2, n - 1) and len(sel) == 2 and len(full) == n
    for name, value in _tensor_fields(sel).items():
        whole = _tensor_fields(full)[name]
        assert torch.equal(value, whole[[0, 3]][:, [2, n - 1]]), name
    assert sel.tokens == full.tokens and torch.equal(sel.token_ids, full.token_ids)
    assert torch.equal(sel.kept, full.kept[[2, n - 1]]) and sel.kept_positions(n - 1) == full.kept_positions(n - 1)
    frame = sel.to_frame()
    assert frame.layer.tolist() == [0, 0, 3, 3] and frame.position.tolist() == [2, n - 1, 2, n - 1]
    assert frame.token.tolist() == [full.tokens[2], full.tokens[-1]] * 2
    expected = full.to_frame().set_index(["layer", "position"]).loc[list(zip(frame.layer, frame.position))]
    # the same norms; computed for 2 rows instead of n, BLAS may round the last bits differently (one thread)
    assert np.allclose(frame.norm.to_numpy(), expected.norm.to_numpy(), rtol=1e-5, atol=0)
    again = sel.select(layers=3, positions=-1)
    assert again.layers == (3,) and again.positions == (n - 1,)
    with pytest.raises(ValueError, match=r"layers \[1\] are not held; these patches hold layers 0, 3"):
        sel.select(layers=[1])
    with pytest.raises(ValueError, match=r"positions \[99\] are not held"):
        full.select(positions=[99])
    with pytest.raises(ValueError, match="no positions selected"):
        full.select(positions=[])
    removed = token_patches(model, PROMPT, remove=[1, 2]).select(positions=[3, n - 1])
    for p in (sel, removed):
        back = TokenPatches.load(p.save(tmp_path / "sel.safetensors"))
        assert back.layers == p.layers and back.positions == p.positions and torch.equal(back.kept, p.kept)
        assert torch.equal(back.norms(), p.norms())


@pytest.mark.parametrize("asked", [[1, 2], [-2, -1]])
def test_every_accessor_that_takes_a_layer_takes_the_models_number(model, full, asked, tmp_path):
    """Issue 43: ``u(1)`` of a ``layers=[1, 2]`` set once returned layer 2's factor (rows, not layers)."""
    import icl_lens
    from icl_lens import NotHeldError
    from icl_lens.patches._kept_only import token_patch_edits
    from icl_lens.ui._analysis import alignment_matrix

    part = token_patches(model, PROMPT, layers=asked)
    held = tuple(sorted(a % 4 for a in asked))
    assert part.layers == held
    index = torch.tensor([[0, 3], [len(PROMPT) - 1, 2]])
    loaded = TokenPatches.load(part.save(tmp_path / "part.safetensors"), weights=icl_lens.dense_weights(model))
    picked = full.select(layers=list(held))
    same = lambda a, b: torch.allclose(a, b, rtol=1e-12, atol=1e-13)  # noqa: E731  (matmuls of other shapes: 1 ulp)
    for p in (part, loaded, picked):
        for layer in held:
            row = p.layer_row(layer)
            assert p.layers[row] == layer
            assert all(same(a, b) for a, b in zip(p.u(layer), full.u(layer)))
            assert all(same(a, b) for a, b in zip(p.u(layer, index), full.u(layer, index)))
            assert same(p.u_coordinates(layer), full.u_coordinates(layer))
            assert same(p.stacked_u(layer), full.stacked_u(layer))
            assert torch.equal(p.norms()[row], full.norms()[layer]) and torch.equal(p.v[row], full.v[layer])
            assert same(alignment_matrix(p, layer), alignment_matrix(full, layer))
            assert torch.equal(p.select(layers=layer).v, full.select(layers=layer).v)
            assert same(p[3].u(layer)[0], full.u(layer)[0][3])
        assert same(p.u_in, full.u_in[list(held)]) and same(p.u_gate, full.u_gate[list(held)])
        assert same(p.stacked_u(), full.stacked_u()[list(held)])
        frame = p.to_frame()
        assert sorted(frame.layer.unique()) == list(held)
        edits = token_patch_edits(p, index, torch.float64)
        whole = token_patch_edits(full, index, torch.float64)
        assert set(edits) == set(held) and all(same(edits[l].u_in, whole[l].u_in) for l in held)
        for absent in sorted(set(range(4)) - set(held)):
            for call in (p.u, p.u_coordinates, p.stacked_u, p.layer_row, lambda l: alignment_matrix(p, l)):
                with pytest.raises(NotHeldError, match=rf"layers \[{absent}\] are not held; these patches hold "
                                                       rf"layers {held[0]}, {held[1]}"):
                    call(absent)
        with pytest.raises(TypeError, match="integer indices"):
            p.u(1.0)
    if asked == [1, 2]:
        with pytest.raises(NotHeldError, match=r"layers \[0\] are not held"):
            part.u(0)


def test_patches_index_and_iterate_over_positions(model, full):
    """``p[t]`` is the frozen :class:`TokenPatch` of prompt position ``t``; iteration gives the positions held."""
    import dataclasses

    from icl_lens import NotHeldError, TokenPatch

    n = len(full.tokens)
    third = full[3]
    assert isinstance(third, TokenPatch) and third.position == 3 and third.token == full.tokens[3]
    assert third.token_id == int(full.token_ids[3]) and third.layers == full.layers
    assert torch.equal(third.v, full.v[:, 3]) and torch.equal(third.norm, full.norms()[:, 3])
    assert torch.equal(third.correction_norm, full.correction_norms()[:, 3]) and third.kept == (0, 3)
    assert all(torch.allclose(a, b[3], rtol=1e-12, atol=1e-14) for a, b in zip(third.u(2), full.u(2)))
    assert third.to_frame().norm.tolist() == full.to_frame().query("position == 3").norm.tolist()
    assert full[-1].position == n - 1 and len(repr(third)) < 200
    with pytest.raises(dataclasses.FrozenInstanceError):
        third.position = 4
    assert [p.position for p in full] == list(range(n)) and len(list(full)) == len(full)
    some = full.select(layers=[1, 3], positions=[2, 5])
    assert [p.position for p in some] == [2, 5] and some[5].layers == (1, 3)
    # a selection forms its norms from its own rows (a matmul of another shape): equal up to rounding, not bitwise
    torch.testing.assert_close(some[5].norm, full.norms()[[1, 3], 5], rtol=1e-12, atol=0)
    with pytest.raises(NotHeldError, match=r"positions \[0\] are not held; these patches hold positions 2, 5"):
        some[0]
    with pytest.raises(IndexError):
        full[n]
    with pytest.raises(TypeError, match="select"):
        full[1:3]
    batch = token_patches(model, [PROMPT, PROMPT])
    assert [p.position for p in batch[0]] == list(range(n))


def test_repr_is_short_and_says_what_is_held(model):
    long_prompt = " ".join(["ab"] * 80)  # 240 tokens (byte tokenizer)
    patches = token_patches(model, long_prompt)
    text = repr(patches)
    assert len(text) < 400 and "tensor(" not in text
    assert "'tiny-gemma3'" in text and f"{len(patches.tokens)} tokens" in text and "layers 0..3" in text
    assert "float64" in text and f"v 4×{len(patches)}×" in text
    picked = repr(patches.select(layers=[1, 3], positions=[0, -1]))
    assert "layers 1,3" in picked and f"positions 0,{len(patches.tokens) - 1}" in picked and len(picked) < 400


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "icl_lens.cli", "patches", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_layers(tmp_path):
    out = tmp_path / "p.safetensors"
    proc = _cli("abc abc", "--model", "tiny-llama", "--dtype", "float64", "--layers", "-1", "0", "--json",
                "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["exact"] and len(data["norms"]) == 2 and len(data["norms"][0]) == len(data["tokens"])
    assert TokenPatches.load(out).layers == (0, 2)
    proc = _cli("abc abc", "--model", "tiny-llama", "--layers", "3")
    assert proc.returncode == 2 and "layers must be in 0..2" in proc.stderr and "Traceback" not in proc.stderr
