"""Answer every question once and keep what the features need (docs/design.md §2).

For a question with prompt length ``P`` (few-shot preamble + question + ``A:``) the
greedy completion ``g_0 g_1 …`` stops at a newline or after ``max_new_tokens``. The
*answer tokens* are the generated tokens before the first newline (``n_answer ≥ 1``), at
positions ``P … P + n_answer − 1``; position ``P − 1`` (``:`` of ``A:``) is the *last prompt
token*, whose output predicts ``g_0``. Kept per question, all from the one generation
(:func:`icl_lens.generate_with_patches` over a shared :class:`icl_lens.PatchSession`):

* patch norms ``‖ΔW[l, t]‖_F`` and correction norms ``‖attn_C − attn_0‖[l, t]`` of every
  layer and position (the spike scores need the whole sequence for their windows),
* ``log p(g_k | prefix)`` and the entropy of the distribution ``g_k`` came from,
* the residual stream entering layer ``n_layers // 2`` at positions ``P − 1 …`` (recorded
  during the same forwards by :func:`icl_lens.model.residual_stream.recording_residual`).

The answer cache (:func:`save_answers`, :func:`load_answers`) is one safetensors file per
model: the arrays as tensors, everything else as JSON in the file's header. Loading it
parses data only (no pickle), so a cache file written by someone else cannot run code; a
file that is not such a cache is refused with :class:`AnswerCacheError`.
"""
from __future__ import annotations

import ctypes
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file
from tqdm.auto import tqdm

from experiments.factual_prompts import FEW_SHOT, FactualPrompt, is_correct
from icl_lens.model.generation import generate_with_patches
from icl_lens.model.incremental import PatchSession
from icl_lens.model.residual_stream import recording_residual


@dataclass(frozen=True)
class Answered:
    """One question's generation, reduced to what the features need (module docstring)."""

    item: FactualPrompt
    completion: str
    correct: bool
    prompt_length: int
    n_answer: int  # generated tokens before the first newline (at least 1)
    norms: np.ndarray  # layer pos: patch norms, whole sequence
    correction_norms: np.ndarray  # layer pos: correction norms, whole sequence
    informative: np.ndarray  # pos: positions whose kept set removes context
    logprobs: np.ndarray  # new
    entropies: np.ndarray  # new
    hidden: np.ndarray  # (new + 1) d_model: residual entering the probe layer at P - 1, P, ...
    seconds: float


@dataclass(frozen=True)
class AnswerSet:
    """All answers of one model, and how long producing them took (wall clock and this process's CPU time)."""

    model_name: str
    n_layers: int
    probe_layer: int
    answers: tuple[Answered, ...]
    seconds: float
    cpu_seconds: float = float("nan")
    preamble: str = ""
    max_new_tokens: int = 8  # answer caches saved before this was recorded were all generated with 8


def probe_layer(n_layers: int) -> int:
    """The layer whose incoming residual stream the hidden-state probe reads: the middle one."""
    return n_layers // 2


def answer_one(model, item: FactualPrompt, session: PatchSession, *, max_new_tokens: int, window: int,
               layer: int) -> Answered:
    start = time.perf_counter()
    with recording_residual(model, layer) as rec:
        gen = generate_with_patches(model, item.text, max_new_tokens=max_new_tokens, stop=("\n",),
                                    session=session, window=window)
    rows = rec.rows()
    if rows.shape[0] != sum(gen.recomputed):
        raise RuntimeError(f"recorded {rows.shape[0]} residual rows for {sum(gen.recomputed)} computed positions")
    n_answer = next((k for k, tok in enumerate(gen.generated_tokens) if "\n" in tok), gen.n_new)
    return Answered(
        item=item, completion=gen.text, correct=is_correct(gen.text, item.answers),
        prompt_length=gen.prompt_length, n_answer=max(1, n_answer),
        norms=gen.patches.norms().double().cpu().numpy(),
        correction_norms=gen.patches.correction_norms().double().cpu().numpy(),
        informative=gen.spikes.informative.cpu().numpy(),
        logprobs=gen.logprobs.numpy(), entropies=gen.entropies.numpy(),
        hidden=rows[-(gen.n_new + 1):].numpy(), seconds=time.perf_counter() - start,
    )


def release_freed_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's ``malloc_trim``; a no-op elsewhere).

    Each question allocates and frees tensors of many sizes (Gemma's logits alone are
    ~1 MB per position); glibc keeps the freed pieces, and without trimming a run over
    hundreds of questions grows by ~20 MB per question (measured with Gemma 3 270M).
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def cache_matches(saved: AnswerSet, model_name: str, items: list[FactualPrompt], max_new_tokens: int) -> bool:
    """Whether saved answers were generated by this model, for these questions, after the current few-shot
    preamble and with this ``max_new_tokens``."""
    return (saved.model_name == model_name and getattr(saved, "preamble", "") == FEW_SHOT
            and saved.max_new_tokens == max_new_tokens and [a.item for a in saved.answers] == list(items))


CACHE_FORMAT = "icl_lens.spikes.answers/1"
_ARRAYS = ("norms", "correction_norms", "informative", "logprobs", "entropies", "hidden")


class AnswerCacheError(ValueError):
    """A file given as the answer cache is not one written by :func:`save_answers`."""


def save_answers(answer_set: AnswerSet, path: Path | str) -> Path:
    """Write ``answer_set`` as one safetensors file (arrays) with a JSON header (everything else)."""
    path = Path(path)
    tensors, rows = {}, []
    for i, a in enumerate(answer_set.answers):
        for name in _ARRAYS:
            tensors[f"{i}.{name}"] = np.ascontiguousarray(getattr(a, name))
        rows.append({"item": asdict(a.item), "completion": a.completion, "correct": bool(a.correct),
                     "prompt_length": int(a.prompt_length), "n_answer": int(a.n_answer), "seconds": float(a.seconds)})
    head = {f.name: getattr(answer_set, f.name) for f in fields(AnswerSet) if f.name != "answers"}
    meta = {"format": CACHE_FORMAT, "answer_set": json.dumps(head), "answers": json.dumps(rows)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)
    return path


def load_answers(path: Path | str) -> AnswerSet:
    """Read a file written by :func:`save_answers`; anything else raises :class:`AnswerCacheError`."""
    try:
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
            if meta.get("format") != CACHE_FORMAT:
                raise AnswerCacheError(f"{path} is not an answer cache of format {CACHE_FORMAT}; remove it to regenerate")
            arrays = {key: f.get_tensor(key) for key in f.keys()}
        head, rows = json.loads(meta["answer_set"]), json.loads(meta["answers"])
        answers = tuple(
            Answered(item=FactualPrompt(**{**r["item"], "answers": tuple(r["item"]["answers"])}),
                     completion=r["completion"], correct=r["correct"], prompt_length=r["prompt_length"],
                     n_answer=r["n_answer"], seconds=r["seconds"], **{n: arrays[f"{i}.{n}"] for n in _ARRAYS})
            for i, r in enumerate(rows))
        return AnswerSet(answers=answers, **head)
    except AnswerCacheError:
        raise
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as err:
        raise AnswerCacheError(f"{path} is not a readable answer cache ({type(err).__name__}: {err}); "
                               "remove it to regenerate") from None


def answer_all(model, items: list[FactualPrompt], *, max_new_tokens: int, window: int,
               cache: Path | None = None) -> AnswerSet:
    """Answer ``items`` in order with one shared session (its cached preamble is reused).

    ``cache``: a safetensors file (:func:`save_answers`) to load the answers from if it exists
    (same model, questions, few-shot preamble and ``max_new_tokens``), else to save them to
    (re-running only the analysis costs no generation). A file there that is not an answer
    cache raises :class:`AnswerCacheError`; it is never unpickled.
    """
    name = model.cfg.model_name
    if cache is not None and Path(cache).exists():
        saved = load_answers(cache)
        if cache_matches(saved, name, items, max_new_tokens):
            return saved
    layer = probe_layer(int(model.cfg.n_layers))
    session = PatchSession(model)
    start, cpu_start = time.perf_counter(), time.process_time()
    answers = []
    for i, item in enumerate(tqdm(items, desc=f"{name}: answering", unit="question")):
        answers.append(answer_one(model, item, session, max_new_tokens=max_new_tokens, window=window, layer=layer))
        if i % 10 == 9:
            release_freed_memory()
    out = AnswerSet(name, int(model.cfg.n_layers), layer, tuple(answers), time.perf_counter() - start,
                    time.process_time() - cpu_start, FEW_SHOT, max_new_tokens)
    if cache is not None:
        save_answers(out, cache)
    return out
