"""The last cell of a workshop notebook: free the big objects it made, whichever of them exist.

A participant who skipped a section (the homework sections, an unanswered exercise) never
defined its variables, so a plain ``del model, parts, ...`` would stop with ``NameError`` at the
very cell meant to hand the memory back. :func:`free` deletes only the names that are there.
"""
from __future__ import annotations

import gc
from collections.abc import MutableMapping
from typing import Any


def free(namespace: MutableMapping[str, Any], *names: str) -> list[str]:
    """Delete each of ``names`` that ``namespace`` (the notebook's ``globals()``) holds, collect, and say which.

    Returns the names deleted; names never defined are skipped without an error.
    """
    freed = [name for name in names if name in namespace]
    for name in freed:
        del namespace[name]
    gc.collect()
    skipped = [name for name in names if name not in freed]
    print(f"freed {', '.join(freed) or 'nothing'}" + (f" (never defined here: {', '.join(skipped)})" if skipped else "")
          + ". Now shut this kernel down: Kernel → Shut Down Kernel.")
    return freed
