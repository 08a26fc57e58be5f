"""App mode: the dashboard served to visitors (Voila, ``make app``) instead of run in one's own notebook.

A visitor of a served dashboard is not the operator of the machine, so in app mode:

- the model box loads only the embedded model names (:func:`icl_lens.model._loading.known_model_names`)
  unless the operator allows more: ``dashboard(allow_models=...)`` or the environment variable
  ``ICL_LENS_APP_MODELS`` (``*`` = any name, local folder or hub id; else a comma-separated
  list of extra names);
- messages shown in the page name no server path (:func:`redact_paths`; the full error stays in
  ``Dashboard.last_error`` for the operator);
- exports go to a private folder made for each dashboard, i.e. each visitor's kernel
  (:func:`private_export_dir`), never one folder every visitor shares.

App mode is on when the kernel was started by Voila (it sets ``VOILA_BASE_URL`` /
``VOILA_REQUEST_URL`` in the kernel's environment) or when ``dashboard(app=True)``.
"""
from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from icl_lens.model._loading import known_model_names

APP_MODELS_ENV = "ICL_LENS_APP_MODELS"
VOILA_ENV = ("VOILA_BASE_URL", "VOILA_REQUEST_URL", "VOILA_KERNEL_ID")


def in_app_mode(app: bool | None = None) -> bool:
    """``app`` if given, else whether this kernel was started by Voila."""
    return bool(app) if app is not None else any(name in os.environ for name in VOILA_ENV)


@dataclass(frozen=True)
class ModelPolicy:
    """Which names the model box may load: ``any`` name (folders, hub ids), else ``names`` only."""

    any: bool
    names: tuple[str, ...]

    def allows(self, name: str) -> bool:
        return self.any or name in self.names

    def refusal(self, name: str) -> str:
        return (f"Model {name!r} is not offered here; choose one of: {', '.join(self.names)} "
                f"(the operator can allow more with dashboard(allow_models=...) or {APP_MODELS_ENV}).")


def model_policy(allow_models: bool | str | Iterable[str] | None, app: bool) -> ModelPolicy:
    """The model box's policy.

    ``allow_models``: True (any name, folder or hub id), False (embedded names only), a list of
    extra names (besides the embedded ones), or None: then ``ICL_LENS_APP_MODELS`` if set
    (``*`` = any, else a comma-separated list of extra names; empty = embedded only), else
    embedded names only in app mode and any name in one's own notebook.
    """
    embedded = tuple(known_model_names())
    if allow_models is None:
        env = os.environ.get(APP_MODELS_ENV)
        if env is None:
            return ModelPolicy(any=not app, names=embedded)
        allow_models = True if env.strip() == "*" else [n.strip() for n in env.split(",") if n.strip()]
    if isinstance(allow_models, bool):
        return ModelPolicy(any=allow_models, names=embedded)
    if isinstance(allow_models, str):
        allow_models = [allow_models]
    extra = tuple(str(n) for n in allow_models if str(n) not in embedded)
    return ModelPolicy(any=False, names=embedded + extra)


# An absolute POSIX path (``/x/y``) or a home path (``~/x``), not the tail of a URL or of a hub id.
_PATH = re.compile(r"(?<![\w.:/~-])(?:~|/)(?:[^\s'\"`<>()\[\]{},;:]*)")


def redact_paths(text: str) -> str:
    """``text`` with every absolute or home path replaced by ``<path>`` (hub ids and URLs stay)."""
    return _PATH.sub(lambda m: "<path>" if len(m.group(0)) > 1 else m.group(0), text)


def private_export_dir() -> Path:
    """A new folder only this process's user can read (mode 0700), one per dashboard."""
    return Path(tempfile.mkdtemp(prefix="icl_lens_exports_"))
