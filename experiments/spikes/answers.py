"""Answer every question once and keep what the features need (docs/design.md §2).

For a question with prompt length ``P`` (few-shot preamble + question + ``A:``) the
greedy completion ``g_0 g_1 …`` stops at a newline (or EOS) or after ``max_new_tokens``.
The *answer tokens* are the generated tokens before the first newline (``n_answer ≥ 1``),
at positions ``P … P + n_answer − 1``; position ``P − 1`` (``:`` of ``A:``) is the *last
prompt token*, whose output predicts ``g_0``.

Two passes per question (:func:`answer_one`):

1. **Generate** greedily with a plain key/value cache (:func:`greedy_continuation`; the
   few-shot preamble's keys and values are lent by the session, :meth:`PatchSession.prefix_cache`).
   Each step's logits give ``log p(g_k | prefix)`` and the entropy of the distribution
   ``g_k`` came from.
2. **Read** the patches once: token patches are causal (the patch at ``t`` depends only on
   tokens ``≤ t``), so one :meth:`PatchSession.update` over prompt + completion gives every
   position's patch exactly as the step-by-step generation did (tested against
   :func:`icl_lens.generate_with_patches`), and the residual stream entering layer
   ``n_layers // 2`` is recorded during that same forward
   (:func:`icl_lens.model._residual_stream.recording_residual`).

Kept per question: patch norms ``‖ΔW[l, t]‖_F`` and correction norms ``‖attn_C − attn_0‖[l, t]``
of every layer and position (the spike scores need the whole sequence for their windows),
the log-probs and entropies, the residual at positions ``P − PROMPT_TAIL … end``, and the
generated token ids and text (so anyone can re-score the answers).

The answer cache (:func:`save_answers`, :func:`load_answers`) is one safetensors file per
model: the arrays as tensors, everything else as JSON in the file's header. Loading it
parses data only (no pickle), so a cache file written by someone else cannot run code; a
file that is not such a cache is refused with :class:`AnswerCacheError`.
"""
from __future__ import annotations

import ctypes
import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file
from tqdm.auto import tqdm

import torch
from transformers import DynamicCache

from experiments.factual_prompts import FEW_SHOT, FactualPrompt, is_correct
from icl_lens.spikes import informative_positions
from icl_lens.spikes import predictive_stats
from icl_lens.patches import PatchSession
from icl_lens.model import encode_prompt, str_tokens
from icl_lens.model import recording_residual


PROMPT_TAIL = 4  # prompt positions P - 4 … P - 1 whose residual is kept (prompt-only probe)


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
    hidden: np.ndarray  # (PROMPT_TAIL + new) d_model: residual entering the probe layer at P - PROMPT_TAIL, …
    seconds: float
    generated_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # new: the generated token ids (completion = their decoded text)

    def hidden_at(self, position: int) -> np.ndarray:
        """The probe layer's residual at sequence position ``position`` (≥ P − PROMPT_TAIL)."""
        row = position - (self.prompt_length - PROMPT_TAIL)
        if not 0 <= row < self.hidden.shape[0]:
            raise IndexError(f"no residual kept at position {position}")
        return self.hidden[row]


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
    max_new_tokens: int = 8


def probe_layer(n_layers: int) -> int:
    """The layer whose incoming residual stream the hidden-state probe reads: the middle one."""
    return n_layers // 2


def common_prefix(a: torch.Tensor | None, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D id tensors (0 when ``a`` is None)."""
    if a is None:
        return 0
    m = min(len(a), len(b))
    diff = torch.nonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m


@torch.no_grad()
def greedy_continuation(model, ids: torch.Tensor, *, max_new_tokens: int, stop: str = "\n",
                        session: PatchSession | None = None, previous: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """Greedy decoding with a plain key/value cache; returns (generated ids, log-probs, entropies).

    Stops after an EOS token, once the generated text contains ``stop``, or after
    ``max_new_tokens`` (the stopping token is kept), as :func:`icl_lens.generate_with_patches`
    does with ``stop=(stop,)``. ``session`` (holding ``previous``, the ids of its last
    update) lends the keys and values of the prefix ``ids`` shares with ``previous``.
    """
    vocab = int(model.cfg.d_vocab)
    eos = getattr(model.tokenizer, "eos_token_id", None)
    n = min(common_prefix(previous, ids), len(ids) - 1)
    lent = session.prefix_cache(ids, n) if session is not None and n > 0 else None
    cache, start = (lent[0], n) if lent is not None else (DynamicCache(), 0)
    logits, cache = model(ids[None, start:], past_key_values=cache, return_type="logits_and_cache")
    out: list[int] = []
    logprobs, entropies = [], []
    for _ in range(max_new_tokens):
        logp, entropy = predictive_stats(logits[0, -1, :vocab])
        token = int(torch.argmax(logp))
        out.append(token)
        logprobs.append(float(logp[token]))
        entropies.append(entropy)
        if (eos is not None and token == eos) or stop in model.tokenizer.decode(out):
            break
        if len(out) == max_new_tokens:
            break
        step = torch.tensor([[token]], dtype=ids.dtype, device=ids.device)
        logits, cache = model(step, past_key_values=cache, return_type="logits_and_cache")
    return torch.tensor(out, dtype=ids.dtype, device=ids.device), np.array(logprobs), np.array(entropies)


def answer_one(model, item: FactualPrompt, session: PatchSession, *, max_new_tokens: int, layer: int,
               previous: torch.Tensor | None = None) -> tuple[Answered, torch.Tensor]:
    """Generate, then read every patch and the probe layer's residual in one pass (module docstring).

    ``session`` must be a ``PatchSession(model, logits=False)`` whose last update was ``previous``
    (or fresh, with ``previous=None``). Returns the answer and the ids of the full sequence.
    """
    start = time.perf_counter()
    ids = encode_prompt(model, item.text)
    new, logprobs, entropies = greedy_continuation(model, ids, max_new_tokens=max_new_tokens, session=session,
                                                   previous=previous)
    full = torch.cat([ids, new])
    with recording_residual(model, layer) as rec:
        patches = session.update(full)
    rows = rec.rows()
    computed = session.last_stats.recomputed
    if rows.shape[0] != computed:
        raise RuntimeError(f"recorded {rows.shape[0]} residual rows for {computed} computed positions")
    keep = len(new) + PROMPT_TAIL
    if keep > computed:
        raise RuntimeError(f"the session reused positions past P - {PROMPT_TAIL}; questions must differ there")
    tokens = str_tokens(model, new)
    text = "".join(tokens)
    n_answer = next((k for k, tok in enumerate(tokens) if "\n" in tok), len(tokens))
    return Answered(
        item=item, completion=text, correct=is_correct(text, item.answers),
        prompt_length=int(ids.numel()), n_answer=max(1, n_answer),
        norms=patches.norms().double().cpu().numpy(),
        correction_norms=patches.correction_norms().double().cpu().numpy(),
        informative=informative_positions(patches).numpy(),
        logprobs=logprobs, entropies=entropies, hidden=rows[-keep:].numpy(),
        seconds=time.perf_counter() - start, generated_ids=new.cpu().numpy().astype(np.int64),
    ), full


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


CACHE_FORMAT = "icl_lens.spikes.answers/2"
_ARRAYS = ("norms", "correction_norms", "informative", "logprobs", "entropies", "hidden", "generated_ids")


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


def answer_all(model, items: list[FactualPrompt], *, max_new_tokens: int, window: int | None = None,
               cache: Path | None = None) -> AnswerSet:
    """Answer ``items`` in order with one shared session (its cached preamble is reused).

    ``cache``: a safetensors file (:func:`save_answers`) to load the answers from if it exists
    (same model, questions, few-shot preamble and ``max_new_tokens``), else to save them to
    (re-running only the analysis costs no generation). A file there that is not an answer
    cache raises :class:`AnswerCacheError`; it is never unpickled. ``window`` is unused (the
    spike scores are computed from the cached norms), kept for callers.
    """
    name = model.cfg.model_name
    if cache is not None and Path(cache).exists():
        saved = load_answers(cache)
        if cache_matches(saved, name, items, max_new_tokens):
            return saved
    layer = probe_layer(int(model.cfg.n_layers))
    session = PatchSession(model, logits=False)
    start, cpu_start = time.perf_counter(), time.process_time()
    answers, previous = [], None
    for i, item in enumerate(tqdm(items, desc=f"{name}: answering", unit="question")):
        answer, previous = answer_one(model, item, session, max_new_tokens=max_new_tokens, layer=layer,
                                      previous=previous)
        answers.append(answer)
        if i % 10 == 9:
            release_freed_memory()
    out = AnswerSet(name, int(model.cfg.n_layers), layer, tuple(answers), time.perf_counter() - start,
                    time.process_time() - cpu_start, FEW_SHOT, max_new_tokens)
    if cache is not None:
        save_answers(out, cache)
    return out
