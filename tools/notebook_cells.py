"""Cell constructors shared by the notebook generators in tools/ (markdown, code, hidden solution)."""
import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell


def solution(src: str):
    """A code cell with its source hidden and tagged ``solution`` (exercises' answers)."""
    cell = code(src)
    cell.metadata.update({"jupyter": {"source_hidden": True}, "tags": ["solution"]})
    return cell


def write(cells, path: str) -> None:
    nb = nbf.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbf.write(nb, path)
    print(f"wrote {path}")
