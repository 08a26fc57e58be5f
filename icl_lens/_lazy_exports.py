"""Lazy package exports (PEP 562 module ``__getattr__``): a package's public names are imported
on first use, so importing the package itself (for example to parse the command line) costs
no torch or TransformerLens import. ``from icl_lens import token_patches`` works as before.

The package lists its public names once, as ordinary imports inside its first
``if TYPE_CHECKING:`` block (so type checkers and editors see the real objects);
:func:`lazy_exports` reads that block from the package's source and imports each name from its
module when it is first asked for. Later ``TYPE_CHECKING`` blocks (names used only in
annotations) are not exports.
"""
from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path


def type_checking_imports(source: str) -> dict[str, str]:
    """``{name: module}`` for every ``from module import name`` in the first ``if TYPE_CHECKING:``."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            return {alias.asname or alias.name: stmt.module for stmt in node.body
                    if isinstance(stmt, ast.ImportFrom) and stmt.module for alias in stmt.names}
    return {}


def lazy_exports(namespace: dict, submodules: tuple[str, ...] = (),
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, names)`` for the package whose ``globals()`` is ``namespace``: the
    public names are those its ``if TYPE_CHECKING:`` block imports; ``submodules`` are subpackages
    exported as attributes (``icl_lens.lab``)."""
    package = namespace["__name__"]
    exports = type_checking_imports(Path(namespace["__file__"]).read_text(encoding="utf-8"))

    def __getattr__(name: str) -> object:
        if name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        elif name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports, *submodules})

    return __getattr__, __dir__, sorted(exports)
