"""Lazy package exports (PEP 562 module ``__getattr__``): a package's public names are imported
on first use, so importing the package itself (for example to parse the command line) costs
no torch or TransformerLens import. ``from icl_lens import token_patches`` works as before.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(namespace: dict, exports: Mapping[str, str], submodules: tuple[str, ...] = (),
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the package whose ``globals()`` is ``namespace``: ``exports``
    maps a public name to the module defining it; ``submodules`` are subpackages exported as
    attributes (``icl_lens.lab``)."""
    package = namespace["__name__"]

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

    return __getattr__, __dir__
