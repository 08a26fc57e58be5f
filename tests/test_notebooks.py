"""Every workshop notebook runs top to bottom (solutions included) on the embedded models."""
import ast
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_is_a_numbered_path():
    assert NOTEBOOKS and NOTEBOOKS[0].name.startswith("01_")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path):
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    assert any("solution" in c.metadata.get("tags", []) for c in nb.cells), "exercises need hidden solutions"
    # cwd = notebooks/, as in JupyterLab and Binder: the notebooks import the helpers of notebooks/workshop/
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


def _assigned(source: str) -> set[str]:
    """Names a cell binds (assignments, imports, loop targets, function and class names)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def _loaded(source: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_a_self_serve_lesson(path):
    """Objective, time box, a claims table; every exercise has a check cell after its solution; solution
    cells use no name that only another solution cell defines (each runs on its own)."""
    cells = nbformat.read(path, as_version=4).cells
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    for needed in ("Learning objective", "Time box", "Paper says / we measure"):
        assert needed in text, f"{path.name}: no '{needed}'"
    code = [c for c in cells if c.cell_type == "code"]
    assert any("claims_view(" in c.source for c in code), f"{path.name}: the claims table is not built"
    solution = [i for i, c in enumerate(code) if "solution" in c.metadata.get("tags", [])]
    for i in solution:
        later = [c for c in code[i + 1:] if "solution" not in c.metadata.get("tags", [])]
        assert later and "check_" in later[0].source, f"{path.name}: solution cell {i} is not followed by a check cell"
    main = set().union(*(_assigned(c.source) for c in code if "solution" not in c.metadata.get("tags", [])))
    for i in solution:
        others = set().union(set(), *(_assigned(code[j].source) for j in solution if j != i))
        borrowed = (_loaded(code[i].source) - _assigned(code[i].source) - main) & others
        assert not borrowed, f"{path.name}: solution cell {i} needs {sorted(borrowed)} from another solution cell"
