"""The per-model result cache ``<report stem>.<model>.json`` beside the report, and carrying rows over."""
from __future__ import annotations

import json
from pathlib import Path


def carry_over(old: dict, new: dict) -> dict:
    """A table row whose patch conditions come from ``new`` and the other conditions (which do not depend on
    the patch: none, full, steering) from ``old``; the steering layer goes with the steering condition."""
    kept = {"steering_layer"} if "steering" not in new["accuracy"] else set()
    row = {**old, **{k: v for k, v in new.items() if not isinstance(v, dict) and k not in kept}}
    for key, value in new.items():
        if isinstance(value, dict):
            row[key] = {**old.get(key, {}), **value}
    from icl_lens.thought.evaluate import agreement

    answers = row["answers"]
    row["agreement_with_full"] = {c: agreement(a, answers["full"]) for c, a in answers.items() if c != "full"}
    row["carried_over"] = [c for c in old["accuracy"] if c not in new["accuracy"]]
    return row


def cache_path(out: Path, model: str) -> Path:
    return out.with_name(f"{out.stem}.{model}.json")


def cached(out: Path, model: str) -> dict:
    cache = cache_path(out, model)
    return json.loads(cache.read_text()) if cache.exists() else {}
