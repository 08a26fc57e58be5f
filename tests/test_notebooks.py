"""Every workshop notebook runs top to bottom (solutions included) on the embedded models."""
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_is_a_numbered_path():
    assert NOTEBOOKS and NOTEBOOKS[0].name.startswith("01_")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    assert any("solution" in c.metadata.get("tags", []) for c in nb.cells), "exercises need hidden solutions"
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
