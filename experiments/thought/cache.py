"""The per-model result cache ``<report stem>.<model>.json`` beside the report."""
from __future__ import annotations

import json
from pathlib import Path


def cache_path(out: Path, model: str) -> Path:
    return out.with_name(f"{out.stem}.{model}.json")


def cached(out: Path, model: str) -> dict:
    cache = cache_path(out, model)
    return json.loads(cache.read_text()) if cache.exists() else {}
