"""Structural promises: imports point one way (core ← model ← features ← front ends), no module
borrows another's private names, and hooks never outlive the call that added them, even after an
error raised inside a hook."""
import ast
import pathlib

import pytest
import torch

from icl_lens import NonFiniteActivationError, thought_patch, token_patches, trajectory, verify_equivalence
from icl_lens.model.weight_edits import MLPEdit, edits_applied

PACKAGE = pathlib.Path(__file__).parents[1] / "icl_lens"
# What each layer must never import (prefix match on module names).
FORBIDDEN = {
    "core": ("transformer_lens", "transformers", "ipywidgets", "plotly", "icl_lens.model", "icl_lens.thought",
             "icl_lens.lab", "icl_lens.sweep", "icl_lens.ui", "icl_lens.evals", "icl_lens.cli"),
    "model": ("ipywidgets", "plotly", "icl_lens.thought", "icl_lens.lab", "icl_lens.sweep", "icl_lens.ui",
              "icl_lens.evals", "icl_lens.cli"),
    "thought": ("ipywidgets", "plotly", "icl_lens.lab", "icl_lens.sweep", "icl_lens.ui", "icl_lens.evals",
                "icl_lens.cli"),
    "lab": ("ipywidgets", "plotly", "icl_lens.thought", "icl_lens.sweep", "icl_lens.ui", "icl_lens.evals",
            "icl_lens.cli"),
    "sweep": ("ipywidgets", "plotly", "icl_lens.thought", "icl_lens.lab", "icl_lens.ui", "icl_lens.evals",
              "icl_lens.cli"),
}


def _imports(path: pathlib.Path) -> list[ast.AST]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _modules(path: pathlib.Path) -> list[str]:
    names = []
    for node in _imports(path):
        names += [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    return names


LAYERED = [(layer, p) for layer in FORBIDDEN for p in sorted((PACKAGE / layer).rglob("*.py"))]


@pytest.mark.parametrize("layer,path", LAYERED, ids=lambda x: x if isinstance(x, str) else x.name)
def test_imports_point_one_way(layer, path):
    bad = [m for m in _modules(path) if m.startswith(FORBIDDEN[layer])]
    assert not bad, f"{path.relative_to(PACKAGE)} ({layer}) imports {bad}"


def test_no_private_names_cross_modules():
    borrowed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in _imports(path):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("icl_lens"):
                borrowed += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert not borrowed


def test_families_are_described_in_one_place():
    """No module but block_family.py decides anything by a family's name or a model class name
    (docs/design.md §2): everything that differs between families is data on its table entry."""
    from icl_lens.model.block_family import FAMILIES

    names = {f.name for f in FAMILIES} | {a for f in FAMILIES for a in f.architectures}
    allowed = {"block_family.py", "tiny_models.py", "loading.py"}  # the table; the tiny configs; GGUF classes
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                parts = [node.left, *node.comparators]
                if any(isinstance(p, ast.Constant) and p.value in names for p in parts) or any(
                        isinstance(p, ast.Attribute) and p.attr == "name" and "family" in ast.unparse(p) for p in parts):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not found


def _hook_count(model):
    return sum(len(hp.fwd_hooks) for hp in model.hook_dict.values())


def test_hooks_are_removed_after_normal_calls(load):
    model = load("tiny-gemma3", torch.float32)
    assert _hook_count(model) == 0
    patches = token_patches(model, "hooks come and go")
    verify_equivalence(model, "hooks come and go", patches)
    trajectory(model, "hooks come and go")
    with thought_patch(model, "an instruction\n", ["q"]).applied():
        assert _hook_count(model) > 0
    assert _hook_count(model) == 0


def test_hooks_are_removed_after_an_error_inside_a_hook():
    """A NaN in the embeddings makes the capture hook raise mid-forward; no hook may stay behind."""
    from icl_lens import load_model

    model = load_model("tiny-llama")  # a private copy: its weights get broken below
    x_id = model.tokenizer("x", add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        model.original_model.model.embed_tokens.weight[x_id] = float("nan")
    with pytest.raises(NonFiniteActivationError, match="layer 0"):
        token_patches(model, "a x b")
    assert _hook_count(model) == 0
    with pytest.raises(NonFiniteActivationError):
        thought_patch(model, "instruction x\n", ["q"])
    assert _hook_count(model) == 0
    bad_edit = {0: MLPEdit(v=torch.ones(3, 7), u_in=torch.ones(3, 160))}  # v has the wrong width: fails in the hook
    with pytest.raises(RuntimeError), edits_applied(model, bad_edit):
        model(torch.tensor([[1, 40, 41]]))
    assert _hook_count(model) == 0


def test_results_are_frozen_with_tidy_frames(load):
    patches = token_patches(load("tiny-llama"), "ab ab")
    with pytest.raises(Exception):
        patches.kept_bos = False
    frame = patches.to_frame()
    assert list(frame.columns) == ["layer", "position", "token", "norm", "correction_norm"]
    assert len(frame) == patches.n_layers * patches.n_positions
    # Gated norm formula of docs/design.md §2.
    l, t = 1, 4
    expected = torch.sqrt(patches.u_gate[l, t].norm() ** 2 + patches.u_in[l, t].norm() ** 2) * patches.v[l, t].norm()
    assert torch.isclose(patches.norms()[l, t], expected)
