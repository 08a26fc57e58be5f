"""Structural promises: the math core imports no model or UI code; hooks never leak."""
import ast
import pathlib

import pytest
import torch

from icl_lens import token_patches, verify_equivalence

CORE = pathlib.Path(__file__).parents[1] / "icl_lens" / "core"
FORBIDDEN = ("transformer_lens", "transformers", "ipywidgets", "plotly", "icl_lens.model", "icl_lens.ui")


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_is_pure_torch(path):
    tree = ast.parse(path.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [m for m in names if m.startswith(FORBIDDEN)]


def _hook_count(model):
    return sum(len(hp.fwd_hooks) for hp in model.hook_dict.values())


def test_hooks_are_removed_even_after_errors(load):
    model = load("tiny-gemma3", torch.float32)
    assert _hook_count(model) == 0
    patches = token_patches(model, "hooks come and go")
    verify_equivalence(model, "hooks come and go", patches)
    assert _hook_count(model) == 0
    with pytest.raises(Exception):
        token_patches(model, "")
    assert _hook_count(model) == 0


def test_results_are_frozen_with_tidy_frames(load):
    patches = token_patches(load("tiny-llama"), "ab ab")
    with pytest.raises(Exception):
        patches.kept_bos = False
    frame = patches.to_frame()
    assert list(frame.columns) == ["layer", "position", "token", "norm", "correction_norm"]
    assert len(frame) == patches.n_layers * patches.n_positions
    # Gated norm formula of DESIGN.md §2.
    l, t = 1, 4
    expected = torch.sqrt(patches.u_gate[l, t].norm() ** 2 + patches.u_in[l, t].norm() ** 2) * patches.v[l, t].norm()
    assert torch.isclose(patches.norms()[l, t], expected)
