"""``python -m experiments.thought.preserve_samples``: the texts a thought patch's fit preserves, as package data.

Writes ``icl_lens/thought/tasks/preserve/<model>.json`` = ``{"generated_by", "model", "n", "tokens", "seed",
"texts"}`` with :func:`icl_lens.thought._preserve.bos_samples` (``N_SAMPLES`` continuations of ``[BOS]`` alone,
``SAMPLE_TOKENS`` tokens each, temperature 1, seed ``SAMPLE_SEED``), and ``tasks/preserve/few_shot.json`` =
``{"generated_by", "about", "texts"}``, the few-shot prompts of :mod:`experiments.thought.few_shot_preserve`
(``--few-shot-only`` writes only these; no model is loaded). A sample that repeats one of the locality
measure's texts (``tasks/locality.json``) is refused, and so is a few-shot prompt that meets the measure
(:func:`~experiments.thought.few_shot_preserve.check`): the texts a fit preserves are never the ones that
measure locality.
"""
from __future__ import annotations

import argparse
import json

GENERATED_BY = "python -m experiments.thought.preserve_samples"


def write_samples(model_name: str) -> str:
    import torch

    from icl_lens.model import load_model
    from icl_lens.thought import load_locality
    from icl_lens.thought import N_SAMPLES, PRESERVE_DIR, SAMPLE_SEED, SAMPLE_TOKENS, bos_samples, preserve_file

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


def write_few_shot() -> str:
    from experiments.thought import few_shot_preserve
    from icl_lens.thought import load_locality
    from icl_lens.thought import FEW_SHOT_FILE, PRESERVE_DIR

    loc = load_locality()
    items = {p.rstrip(":").strip() for p in loc.other_prompts}
    items |= {line.split(":", 1)[0].strip() for line in loc.other_instruction.splitlines()[1:] if ":" in line}
    few_shot_preserve.check(set(loc.texts), items)
    PRESERVE_DIR.mkdir(exist_ok=True)
    FEW_SHOT_FILE.write_text(json.dumps({"generated_by": f"{GENERATED_BY} --few-shot-only",
                                         "about": few_shot_preserve.__doc__.split("\n\n")[0],
                                         "texts": few_shot_preserve.texts()}, ensure_ascii=False, indent=1) + "\n",
                             encoding="utf-8")
    return str(FEW_SHOT_FILE)


def main(argv: list[str] | None = None) -> int:
    from icl_lens.model import EMBEDDED_MODELS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(EMBEDDED_MODELS), choices=list(EMBEDDED_MODELS))
    p.add_argument("--few-shot-only", action="store_true", help="write only the few-shot prompts (no model)")
    args = p.parse_args(argv)
    print(write_few_shot(), flush=True)
    if args.few_shot_only:
        return 0
    for name in args.models:
        print(write_samples(name), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
