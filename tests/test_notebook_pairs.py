"""Every notebook is a jupytext pair: a .ipynb and its percent-format .py twin, with the same cells."""
import pathlib
import shutil

import jupytext
import pytest
from jupytext.config import load_jupytext_config

ROOT = pathlib.Path(__file__).parents[1]
FOLDERS = [ROOT / "notebooks"]
NOTEBOOKS = sorted(p for folder in FOLDERS for p in folder.glob("*.ipynb"))


def cells(path):
    """What a pair must agree on: each cell's type, source and metadata (tags, hidden source)."""
    return [(c.cell_type, c.source, dict(c.metadata)) for c in jupytext.read(path).cells]


def out_of_sync(ipynb):
    """The first cell where the .ipynb and its .py twin differ, or None when they agree."""
    a, b = cells(ipynb), cells(ipynb.with_suffix(".py"))
    if len(a) != len(b):
        return f"{len(a)} cells in .ipynb, {len(b)} in .py"
    fields = ("type", "source", "metadata")
    return next((f"cell {i} differs in " + ", ".join(f for f, u, v in zip(fields, x, y) if u != v)
                 for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def test_every_folder_is_paired_by_jupytext_toml():
    assert len(NOTEBOOKS) >= 6
    for folder in FOLDERS:
        assert load_jupytext_config(str(folder)).formats in ("ipynb,py:percent", ["ipynb,py:percent"])
        orphans = [p.name for p in folder.glob("*.py") if not p.with_suffix(".ipynb").exists()]
        assert not orphans, f"{folder.name}: .py without a notebook: {orphans}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_pair_in_sync(path):
    assert path.with_suffix(".py").exists(), f"{path.name} has no .py twin: jupytext --sync {path.relative_to(ROOT)}"
    assert out_of_sync(path) is None, f"{out_of_sync(path)}; run jupytext --sync {path.relative_to(ROOT)}"


def test_editing_one_side_alone_is_caught(tmp_path):
    src = ROOT / "notebooks" / "01_quickstart.ipynb"
    ipynb = tmp_path / src.name
    shutil.copy(src, ipynb)
    twin = ipynb.with_suffix(".py")
    shutil.copy(src.with_suffix(".py"), twin)
    assert out_of_sync(ipynb) is None
    text = twin.read_text()
    for edited in (text.replace("import icl_lens\n", "import icl_lens as il\n", 1),
                   text.replace('tags=["solution"]', 'tags=["hide-input"]', 1),
                   text + "\n# %%\nprint('new cell')\n"):
        assert edited != text
        twin.write_text(edited)
        assert out_of_sync(ipynb) is not None
