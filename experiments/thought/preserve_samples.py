"""``python -m experiments.thought.preserve_samples``: the embedded models' own samples from BOS, as package data.

Writes ``icl_lens/thought/tasks/preserve/<model>.json`` = ``{"generated_by", "model", "n", "tokens", "seed",
"texts"}`` with :func:`icl_lens.thought.preserve.bos_samples` (``N_SAMPLES`` continuations of ``[BOS]`` alone,
``SAMPLE_TOKENS`` tokens each, temperature 1, seed ``SAMPLE_SEED``). A sample that repeats one of the locality
measure's texts (``tasks/locality.json``) is refused, so the texts a fit preserves are never the ones that measure
locality.
"""
from __future__ import annotations

import argparse
import json

GENERATED_BY = "python -m experiments.thought.preserve_samples"


def write_samples(model_name: str) -> str:
    import torch

    from icl_lens.model.loading import load_model
    from icl_lens.thought.locality import load_locality
    from icl_lens.thought.preserve import N_SAMPLES, PRESERVE_DIR, SAMPLE_SEED, SAMPLE_TOKENS, bos_samples, preserve_file

    torch.set_num_threads(1)
    model = load_model(model_name)
    texts = bos_samples(model, N_SAMPLES, SAMPLE_TOKENS, seed=SAMPLE_SEED)
    if set(texts) & set(load_locality().texts):
        raise SystemExit(f"{model_name}: a sample repeats a locality text; refusing to write it")
    PRESERVE_DIR.mkdir(exist_ok=True)
    path = preserve_file(model.cfg.model_name)
    path.write_text(json.dumps({"generated_by": f"{GENERATED_BY} --models {model_name}", "model": model.cfg.model_name,
                                "n": N_SAMPLES, "tokens": SAMPLE_TOKENS, "seed": SAMPLE_SEED, "texts": texts},
                               ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return str(path)


def main(argv: list[str] | None = None) -> int:
    from icl_lens.model.loading import EMBEDDED_MODELS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(EMBEDDED_MODELS), choices=list(EMBEDDED_MODELS))
    args = p.parse_args(argv)
    for name in args.models:
        print(write_samples(name), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
