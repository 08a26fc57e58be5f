"""Structural promises: imports point one way (core ← model ← concepts ← front ends) and never in a
circle, no module borrows another's private names, hooks pass through the two doors (model/_reading.py,
model/_weight_edits.py), and hooks never outlive the call that added them, even after an error raised
inside a hook."""
import ast
import pathlib

import pytest
import torch

from icl_lens import NonFiniteActivationError, thought_patch, token_patches, trajectory, verify_equivalence
from icl_lens.model._tiny_models import TINY_NAMES
from icl_lens.model._weight_edits import MLPEdit, edits_applied

PACKAGE = pathlib.Path(__file__).parents[1] / "icl_lens"
# What each layer must never import (prefix match on module names). Nothing in the package imports the
# experiments, benchmarks or workshop helpers that live beside it in the checkout.
_OUTSIDE = ("experiments", "benchmarks", "workshop")
_FRONT = ("ipywidgets", "plotly", "icl_lens.ui", "icl_lens.cli", *_OUTSIDE)
# Concepts: token patches underlie the others; spikes read patches; the rest stand side by side.
_CONCEPTS = ("icl_lens.patches", "icl_lens.spikes", "icl_lens.dynamics", "icl_lens.thought", "icl_lens.lab",
             "icl_lens.sweep")
FORBIDDEN = {
    "stats": ("transformer_lens", "transformers", "icl_lens.core", "icl_lens.model", *_CONCEPTS, *_FRONT),
    "core": ("transformer_lens", "transformers", "icl_lens.model", *_CONCEPTS, *_FRONT),
    "model": (*_CONCEPTS, *_FRONT),
    "patches": tuple(c for c in _CONCEPTS if c != "icl_lens.patches") + _FRONT,
    "spikes": tuple(c for c in _CONCEPTS if c not in ("icl_lens.patches", "icl_lens.spikes")) + _FRONT,
    "dynamics": ("icl_lens.spikes", "icl_lens.thought", "icl_lens.lab", "icl_lens.sweep", *_FRONT),
    "thought": ("icl_lens.spikes", "icl_lens.lab", "icl_lens.sweep", *_FRONT),
    "lab": ("icl_lens.spikes", "icl_lens.thought", "icl_lens.sweep", *_FRONT),
    "sweep": ("icl_lens.spikes", "icl_lens.thought", "icl_lens.lab", *_FRONT),
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
    from icl_lens.model._block_family import FAMILIES

    names = {f.name for f in FAMILIES} | {a for f in FAMILIES for a in f.architectures}
    allowed = {"_block_family.py", "_tiny_models.py", "_loading.py"}  # the table; the tiny configs; GGUF classes
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


def test_activations_captured_reads_stops_and_cleans_up(load):
    """The read door: recorded sites equal the cache, the forward stops after ``stop_after`` (a later
    site never fires), an inner block's stop is its own, and hooks go away after an error in a hook."""
    from icl_lens.model._reading import activations_captured

    model = load("tiny-llama")
    ids = torch.tensor([[1, 40, 41, 42]])
    first, later = "blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"
    _, cache = model.run_with_cache(ids, names_filter=lambda n: n in (first, later))
    with torch.no_grad(), activations_captured(model, [first, later], stop_after=first) as acts:
        model(ids)
        raise AssertionError("the stopped forward must end the block")  # never reached
    assert torch.equal(acts[first], cache[first]) and later not in acts
    with torch.no_grad(), activations_captured(model, [later]) as outer:
        with activations_captured(model, [first], stop_after=first) as inner:
            model(ids)
        model(ids)  # the inner stop ended the inner block only
    assert torch.equal(inner[first], cache[first]) and torch.equal(outer[later], cache[later])
    assert _hook_count(model) == 0

    def broken(x, hook):
        raise ValueError("a hook failed")

    with pytest.raises(ValueError, match="a hook failed"), activations_captured(model, [(first, broken)], stop_after=later):
        model(ids)
    assert _hook_count(model) == 0
    with pytest.raises(KeyError, match="no_such_hook"), activations_captured(model, ["no_such_hook"]):
        model(ids)
    assert _hook_count(model) == 0


def test_hooks_are_attached_as_transformer_lens_does_with_each_name_resolved_once(load, monkeypatch):
    """Issue 41: the doors attach hooks like ``model.hooks`` (an alias reads its canonical point, the same values,
    nested levels, nothing left behind, TransformerLens's or torch's), resolving each name once per model rather than
    from the whole alias table at every entry; an unknown name raises every time."""
    from icl_lens.model._per_model import model_cache
    from icl_lens.model._reading import activations_captured

    model = load("tiny-gemma3")
    model_cache(model, "hook_points").clear()
    resolved, resolve = [], type(model)._resolve_hook_point
    monkeypatch.setattr(type(model), "_resolve_hook_point",
                        lambda self, name, *rest: resolved.append(name) or resolve(self, name, *rest))
    ids = torch.tensor([[1, 40, 41, 42]])
    names = ["hook_embed", "blocks.1.hook_resid_post"]  # an alias (of embed.hook_out) and a canonical name
    reference = {}
    with torch.no_grad(), model.hooks(fwd_hooks=[(n, lambda x, hook, n=n: reference.__setitem__(n, x)) for n in names]):
        model(ids)
    resolved.clear()
    for _ in range(3):
        with torch.no_grad(), activations_captured(model, names) as acts:
            with activations_captured(model, [names[1]]) as inner:
                model(ids)
        assert all(torch.equal(acts[n], reference[n]) for n in names) and torch.equal(inner[names[1]], reference[names[1]])
    assert resolved == names  # once each, at the first entry
    assert _hook_count(model) == 0 and not any(hp._forward_hooks for hp in model.hook_dict.values())
    assert getattr(model, "context_level", 0) == 0
    for _ in range(2):
        with pytest.raises(KeyError, match="no_such_hook"), activations_captured(model, ["no_such_hook"]):
            model(ids)
    assert _hook_count(model) == 0


@pytest.mark.parametrize("name", TINY_NAMES)
def test_layer_steps_run_each_block_as_the_forward_does(load, name):
    """The read door's block-at-a-time run (issue 41's one-pass thought fit): each block, run alone on the residual
    the one before left, gives the forward's block output (float64, right-padded rows of a batch; the arguments
    captured from one row, whose forward computes block 0 only and stops at the last block's entrance), a read's stop
    inside the block ends that block only, a batch of a length seen before costs no capture forward, and no hook (TransformerLens's or torch's) stays behind."""
    from icl_lens.model._reading import activations_captured, layer_steps

    model = load(name, torch.float64)
    ids = torch.tensor([[1, 40, 41, 42, 43, 44], [1, 50, 51, 0, 0, 0], [1, 60, 61, 62, 0, 0]])
    names = [f"blocks.{l}.hook_resid_post" for l in range(model.cfg.n_layers)]
    with torch.no_grad(), activations_captured(model, names) as acts:
        model(ids, return_type=None)
    known = {}
    with torch.no_grad():
        steps = layer_steps(model, ids, known)
        with activations_captured(model, [names[0]], stop_after=names[0]) as read:
            steps.run()
            raise AssertionError("the read's stop must end the block's run")  # never reached
        close = lambda x, y: float((x - y).abs().max()) <= 1e-12 * float(y.abs().max())  # noqa: E731 (float rounding:
        # GPT-2's attention takes the one-row mask through another kernel)
        assert close(read[names[0]], acts[names[0]]) and steps.layer == 0
        for layer, name_ in enumerate(names):
            assert close(steps.run(advance=True), acts[name_]), layer
        assert steps.layer == model.cfg.n_layers
        with pytest.raises(IndexError):
            steps.run()
        steps.restart()
        assert steps.layer == 0 and torch.equal(steps.resid, steps.embedded)
        again = layer_steps(model, ids.flip(0), known)
        assert again.calls is steps.calls and len(known) == 1
        # the capture forward computes block 0 only: the blocks between hand their input on, the last block and
        # the unembedding never run; every block's own forward is back afterwards
        with activations_captured(model, [*names, "unembed.hook_in"]) as ran:
            fresh = layer_steps(model, ids, {})
        assert list(ran) == [names[0]] and all("forward" not in vars(b) for b in model.blocks)
        assert close(fresh.run(advance=True), acts[names[0]]) and close(fresh.run(), acts[names[1]])
    assert _hook_count(model) == 0
    assert not any(b._forward_pre_hooks for b in model.blocks)


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


def _module_name(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the package modules it imports, at module level or inside functions (``ast``).

    ``from a.b import c`` points at ``a.b.c`` when that is a module, else at ``a.b``.
    Parent packages imported implicitly are not arrows (every module would then sit in a
    circle with its package's ``__init__``).
    """
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    top = root.name
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _imports(path):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
                continue
            base = node.module or ""
            if node.level:  # relative import
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in files else base)
        graph[name] = {t for t in targets if t in files and t != name and t.split(".")[0] == top}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports ``[m0, m1, …, m0]``, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle():
    """No module of icl_lens imports another that (directly or not) imports it back, also lazily inside a function."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_import_circle_is_found(tmp_path):
    """The check sees a circle made by a function-level import (the kind model/capture.py used to have)."""
    pkg = tmp_path / "icl_lens"
    (pkg / "model").mkdir(parents=True)
    for f in ("__init__.py", "model/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "model/a.py").write_text("from icl_lens.model.b import g\n")
    (pkg / "model/b.py").write_text("def g():\n    from icl_lens.model import c\n")
    (pkg / "model/c.py").write_text("from icl_lens.model.a import *\n")
    graph = import_graph(pkg)
    assert find_cycle(graph) == ["icl_lens.model.a", "icl_lens.model.b", "icl_lens.model.c", "icl_lens.model.a"]
    (pkg / "model/c.py").write_text("import torch\n")
    assert find_cycle(import_graph(pkg)) is None


HOOK_CALLS = {"add_hook", "add_perma_hook", "run_with_hooks", "register_forward_hook", "register_forward_pre_hook",
              "register_full_backward_hook", "register_backward_hook"}
DOORS = {"model/_reading.py", "model/_weight_edits.py"}  # the one door to read, the one door to write


def _reference_calls(tree: ast.AST) -> set[int]:
    """Line numbers of the calls inside a reference method (a function named ``*_naive``), which may read
    through TransformerLens's own ``run_with_cache``."""
    return {n.lineno for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and f.name.endswith("_naive") for n in ast.walk(f) if isinstance(n, ast.Call)}


def hook_plumbing(path: pathlib.Path) -> list[str]:
    """Lines of ``path`` that add hooks to a model, read through ``run_with_cache`` (outside a reference method),
    pass extra hooks through the write door, or define an exception that stops a forward."""
    found = []
    tree = ast.parse(path.read_text())
    reference = _reference_calls(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            scoped = attr == "hooks" and (any(k.arg in ("fwd_hooks", "bwd_hooks") for k in node.keywords)
                                          or (node.args and isinstance(node.args[0], (ast.List, ast.ListComp))))
            cached = attr == "run_with_cache" and node.lineno not in reference
            if attr in HOOK_CALLS or scoped or cached:
                found.append((node.lineno, f"{ast.unparse(node.func)}(…)"))
        if isinstance(node, ast.Call) and any(k.arg == "extra_hooks" for k in node.keywords):
            found.append((node.lineno, f"{ast.unparse(node.func)}(extra_hooks=…)"))
        elif isinstance(node, ast.ClassDef) and any(w in node.name.lower() for w in ("stop", "halt", "abort")):
            bases = {ast.unparse(b) for b in node.bases}
            if bases & {"Exception", "BaseException", "RuntimeError", "StopIteration"} or any("Error" in b or "Exception" in b for b in bases):
                found.append((node.lineno, f"class {node.name}"))
    return [f"{path.name}:{line}: {what}" for line, what in sorted(found)]


def test_hooks_pass_through_the_two_doors():
    """Only model/_reading.py (activations_captured) and model/_weight_edits.py (edits_applied) add hooks
    to a model or stop a forward; every other module reads and writes through them (``run_with_cache`` only in
    a reference method, ``*_naive``; no extra hooks through the write door)."""
    found = [line for path in sorted(PACKAGE.rglob("*.py")) if str(path.relative_to(PACKAGE)) not in DOORS
             for line in hook_plumbing(path)]
    assert not found, f"hooks outside the doors: {found}"


def test_hook_plumbing_is_found(tmp_path):
    """A hand-written read loop (the five of before the read door) is caught; a capture's own ``hooks(layer)`` is not."""
    loop = tmp_path / "loop.py"
    loop.write_text(
        "class StopForward(Exception):\n    pass\n\n"
        "def read(model, ids, name):\n"
        "    with model.hooks(fwd_hooks=[(name, grab)]):\n"
        "        try:\n            model(ids)\n        except StopForward:\n            pass\n"
        "    model.blocks[0].hook_resid_pre.add_hook(grab)\n"
        "    capture.hooks(3)\n"
        "    model.run_with_cache(ids)\n"
        "    with edits_applied(model, {}, extra_hooks=[(name, grab)]):\n        pass\n"
        "def patches_naive(model, ids):\n    return model.run_with_cache(ids)\n")
    assert hook_plumbing(loop) == ["loop.py:1: class StopForward", "loop.py:5: model.hooks(…)",
                                   "loop.py:10: model.blocks[0].hook_resid_pre.add_hook(…)",
                                   "loop.py:12: model.run_with_cache(…)", "loop.py:13: edits_applied(extra_hooks=…)"]


def test_top_level_layout():
    """The checkout's top level: the package, its front-end source, notebooks, tests, Binder, experiments,
    benchmarks, docs, the reports they write, and the files that describe and build them; nothing else."""
    import subprocess

    root = pathlib.Path(__file__).parents[1]
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    top = {path.split("/", 1)[0] for path in tracked}
    folders = {"icl_lens", "widgets", "notebooks", "tests", "binder", "experiments", "benchmarks", "docs", "reports",
               ".ci"}
    files = {"pyproject.toml", "README.md", "EVAL.md", "BENCHMARKS.md", "Makefile", "jupytext.toml", ".gitignore"}
    assert top <= folders | files, f"unexpected at the top level: {sorted(top - folders - files)}"


ROOT = PACKAGE.parent
PACKAGES = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
# Modules meant to be called by name: commands (``python -m ...``, the ``icl-lens`` script). Every other
# module under a face is private (``_name.py``): callers use the face.
COMMANDS = {"icl_lens.cli", "icl_lens.__main__", "icl_lens.lab.seeds", "icl_lens.lab.train"}


def deep_imports(path: pathlib.Path) -> list[str]:
    """Imports of ``path`` that reach into icl_lens below a face (a module file, not a package's ``__init__``)."""
    found = []
    for node in _imports(path):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        found += [f"{path.name}:{node.lineno}: {name}" for name in names
                  if name.split(".")[0] == "icl_lens" and name not in PACKAGES]
    return found


def test_outside_code_imports_faces_only():
    """experiments/, notebooks/ and benchmarks/ import icl_lens only through its faces (package ``__init__``)."""
    files = sorted(p for folder in ("experiments", "notebooks", "benchmarks") for p in (ROOT / folder).rglob("*.py"))
    assert files
    found = [line for path in files for line in deep_imports(path)]
    assert not found, f"imports below a face: {found}"


def test_deep_import_is_found(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import icl_lens\nfrom icl_lens.patches import TokenPatches\nfrom icl_lens.lab import seeds\n"
                      "def f():\n    from icl_lens.model._greedy import last_logits\n    import icl_lens.thought._fit\n")
    assert [line.split(": ", 1)[1] for line in deep_imports(script)] == ["icl_lens.model._greedy",
                                                                         "icl_lens.thought._fit"]


def test_every_subpackage_has_a_face_and_private_rooms():
    """Each subpackage's ``__init__`` lists its public names (``__all__``); its other modules are private
    (``_name.py``) unless they are commands."""
    import importlib

    no_face = [pkg for pkg in sorted(PACKAGES) if not hasattr(importlib.import_module(pkg), "__all__")]
    assert not no_face, f"packages without __all__: {no_face}"
    public = [name for p in sorted(PACKAGE.rglob("*.py")) if not p.name.startswith("_")
              and (name := _module_name(p)) not in COMMANDS]
    assert not public, f"modules that are neither a face, a command nor private: {public}"
    for pkg in PACKAGES:  # every name a face hands on exists
        module = importlib.import_module(pkg)
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, f"{pkg} lists {missing} but has no such names"
