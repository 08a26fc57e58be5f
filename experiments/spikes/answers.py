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

3. **Sample** ``n_samples`` (5) more answers at temperature 1 from the same prompt, as one
   batch: the prompt's keys and values from pass 1 are repeated ``n_samples`` times and each
   row draws its tokens from ``softmax(logits / T)`` (a generator seeded from the question
   text, so a rerun draws the same samples), stopping as the greedy answer does. How many
   of them agree with the greedy answer is the *sampling agreement* baseline (the cheap form
   of semantic-entropy detection; Kuhn et al. 2023, arXiv 2302.09664).

Kept per question: patch norms ``‖ΔW[l, t]‖_F`` and correction norms ``‖attn_C − attn_0‖[l, t]``
of every layer and position (the spike scores need the whole sequence for their windows),
the log-probs and entropies, the residual at positions ``P − PROMPT_TAIL … end``, the
generated token ids and text (so anyone can re-score the answers) and the sampled texts.

The answer cache (:func:`save_answers`, :func:`load_answers`) is a folder per model of
safetensors files, each holding the answers of a run of questions: the arrays as tensors,
everything else as JSON in the file's header. :func:`answer_all` writes one file every
``chunk`` questions, so an interrupted run resumes where it stopped, and keys answers by the
model's input text, so questions added to the set are the only ones answered on the next
run. Loading parses data only (no pickle), so a cache file written by someone else cannot
run code; a file that is not such a cache is refused with :class:`AnswerCacheError`.
"""
from __future__ import annotations

import ctypes
import json
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file
from tqdm.auto import tqdm

import torch
from transformers import DynamicCache

from experiments.factual_prompts import FEW_SHOT, FactualPrompt, is_correct_answer
from icl_lens.model import encode_prompt, recording_residual, str_tokens
from icl_lens.patches import PatchSession
from icl_lens.spikes import (
    PromptState,
    informative_positions,
    predictive_stats,
    probe_layer,
    sample_continuations,
    sample_seed,
    stopped,
)


PROMPT_TAIL = 4  # prompt positions P - 4 … P - 1 whose residual is kept (prompt-only probe)
N_SAMPLES = 5  # answers sampled per question for the sampling-agreement baseline
TEMPERATURE = 1.0


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
    samples: tuple[str, ...] = ()  # completions sampled at temperature 1 (module docstring, pass 3)
    cpu_seconds: float = float("nan")  # this process's CPU time for the question

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
    n_samples: int = 0
    temperature: float = TEMPERATURE


def common_prefix(a: torch.Tensor | None, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D id tensors (0 when ``a`` is None)."""
    if a is None:
        return 0
    m = min(len(a), len(b))
    diff = torch.nonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m


@torch.no_grad()
def greedy_continuation(model, ids: torch.Tensor, *, max_new_tokens: int, stop: str = "\n",
                        session: PatchSession | None = None, previous: torch.Tensor | None = None,
                        keep_prompt: bool = False):
    """Greedy decoding with a plain key/value cache; returns (generated ids, log-probs, entropies),
    and with ``keep_prompt`` also the :class:`PromptState` the samples start from.

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
    logits, cache = model(ids[None, start:], past_key_values=cache, return_type="logits_and_cache", logits_to_keep=1)
    # a step appends by concatenation (new tensors), so these stay the prompt's keys and values
    prompt = PromptState(tuple((layer.keys, layer.values) for layer in cache.layers), logits[0, -1, :vocab])
    out: list[int] = []
    logprobs, entropies = [], []
    for _ in range(max_new_tokens):
        logp, entropy = predictive_stats(logits[0, -1, :vocab])
        token = int(torch.argmax(logp))
        out.append(token)
        logprobs.append(float(logp[token]))
        entropies.append(entropy)
        if stopped(model, out, stop, eos) or len(out) == max_new_tokens:
            break
        step = torch.tensor([[token]], dtype=ids.dtype, device=ids.device)
        logits, cache = model(step, past_key_values=cache, return_type="logits_and_cache", logits_to_keep=1)
    result = (torch.tensor(out, dtype=ids.dtype, device=ids.device), np.array(logprobs), np.array(entropies))
    return (*result, prompt) if keep_prompt else result


def answer_one(model, item: FactualPrompt, session: PatchSession, *, max_new_tokens: int, layer: int,
               previous: torch.Tensor | None = None, n_samples: int = 0, temperature: float = TEMPERATURE,
               seed: int = 0) -> tuple[Answered, torch.Tensor]:
    """Generate, read every patch and the probe layer's residual in one pass, and draw ``n_samples``
    answers at ``temperature`` (module docstring).

    ``session`` must be a ``PatchSession(model, logits=False)`` whose last update was ``previous``
    (or fresh, with ``previous=None``). Returns the answer and the ids of the full sequence.
    """
    start, cpu_start = time.perf_counter(), time.process_time()
    ids = encode_prompt(model, item.text)
    new, logprobs, entropies, prompt = greedy_continuation(model, ids, max_new_tokens=max_new_tokens,
                                                           session=session, previous=previous, keep_prompt=True)
    samples = ()
    if n_samples:
        generator = torch.Generator().manual_seed(sample_seed(item.text, seed))
        drawn = sample_continuations(model, prompt, n=n_samples, temperature=temperature,
                                     max_new_tokens=max_new_tokens, generator=generator)
        samples = tuple("".join(str_tokens(model, torch.tensor(row, dtype=ids.dtype))) for row in drawn)
    del prompt
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
        item=item, completion=text, correct=is_correct_answer(item, text),
        prompt_length=int(ids.numel()), n_answer=max(1, n_answer),
        norms=patches.norms().double().cpu().numpy(),
        correction_norms=patches.correction_norms().double().cpu().numpy(),
        informative=informative_positions(patches).numpy(),
        logprobs=logprobs, entropies=entropies, hidden=rows[-keep:].numpy(),
        seconds=time.perf_counter() - start, generated_ids=new.cpu().numpy().astype(np.int64), samples=samples,
        cpu_seconds=time.process_time() - cpu_start,
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


def cache_matches(saved: AnswerSet, model_name: str, max_new_tokens: int, n_samples: int,
                  temperature: float) -> bool:
    """Whether saved answers were generated by this model after the current few-shot preamble, with this
    ``max_new_tokens`` and the same sampling (count and temperature)."""
    return (saved.model_name == model_name and saved.preamble == FEW_SHOT and saved.max_new_tokens == max_new_tokens
            and saved.n_samples == n_samples and saved.temperature == temperature)


CACHE_FORMAT = "icl_lens.spikes.answers/3"
_ARRAYS = ("norms", "correction_norms", "informative", "logprobs", "entropies", "hidden", "generated_ids")
_ROW = ("completion", "correct", "prompt_length", "n_answer", "seconds", "cpu_seconds", "samples")


class AnswerCacheError(ValueError):
    """A file given as the answer cache is not one written by :func:`save_answers`."""


def save_answers(answer_set: AnswerSet, path: Path | str) -> Path:
    """Write ``answer_set`` as one safetensors file (arrays) with a JSON header (everything else)."""
    path = Path(path)
    tensors, rows = {}, []
    for i, a in enumerate(answer_set.answers):
        for name in _ARRAYS:
            tensors[f"{i}.{name}"] = np.ascontiguousarray(getattr(a, name))
        rows.append({"item": asdict(a.item), **{n: getattr(a, n) for n in _ROW}})
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
                     **{n: (tuple(r[n]) if n == "samples" else r[n]) for n in _ROW},
                     **{n: arrays[f"{i}.{n}"] for n in _ARRAYS})
            for i, r in enumerate(rows))
        return AnswerSet(answers=answers, **head)
    except AnswerCacheError:
        raise
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as err:
        raise AnswerCacheError(f"{path} is not a readable answer cache ({type(err).__name__}: {err}); "
                               "remove it to regenerate") from None


def cached_answers(folder: Path, model_name: str, max_new_tokens: int, n_samples: int,
                   temperature: float) -> dict[str, Answered]:
    """Input text → answer, from every file of the model's cache folder generated with these settings
    (files made with other settings are left alone; a file that is not a cache raises :class:`AnswerCacheError`)."""
    found: dict[str, Answered] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        saved = load_answers(path)
        if cache_matches(saved, model_name, max_new_tokens, n_samples, temperature):
            found.update({a.item.text: a for a in saved.answers})
    return found


def answer_all(model, items: list[FactualPrompt], *, max_new_tokens: int, cache: Path | str | None = None,
               n_samples: int = N_SAMPLES, temperature: float = TEMPERATURE, seed: int = 0, chunk: int = 25,
               progress: bool = True) -> AnswerSet:
    """Answer ``items`` in order with one shared session (its cached preamble is reused).

    ``cache``: a folder; the model's answers live in ``cache/<model name>/`` (module docstring).
    Questions already answered there with the same settings are read back (their labels and
    aliases taken from ``items``, so a changed answer key costs no generation); the others are
    answered and saved ``chunk`` at a time, so an interrupted run loses at most ``chunk``
    answers. ``seconds``/``cpu_seconds`` of the result add up every answer's own time,
    including those read from the cache.
    """
    name = model.cfg.model_name
    folder = None if cache is None else Path(cache) / name
    done = {} if folder is None else cached_answers(folder, name, max_new_tokens, n_samples, temperature)
    todo = [item for item in items if item.text not in done]
    layer = probe_layer(int(model.cfg.n_layers))
    head = dict(model_name=name, n_layers=int(model.cfg.n_layers), probe_layer=layer, preamble=FEW_SHOT,
                max_new_tokens=max_new_tokens, n_samples=n_samples, temperature=temperature)
    session, previous, fresh = PatchSession(model, logits=False) if todo else None, None, []

    def flush() -> None:
        if folder is not None and fresh:
            part = AnswerSet(answers=tuple(fresh), seconds=sum(a.seconds for a in fresh),
                             cpu_seconds=sum(a.cpu_seconds for a in fresh), **head)
            save_answers(part, folder / f"part-{time.strftime('%Y%m%d-%H%M%S')}-{len(done):05d}.safetensors")
            fresh.clear()

    bar = tqdm(todo, desc=f"{name}: answering ({len(done)} of {len(items)} cached)", unit="question",
               disable=not progress, mininterval=5.0)
    for i, item in enumerate(bar):
        answer, previous = answer_one(model, item, session, max_new_tokens=max_new_tokens, layer=layer,
                                      previous=previous, n_samples=n_samples, temperature=temperature, seed=seed)
        done[item.text] = answer
        fresh.append(answer)
        if len(fresh) >= chunk:
            flush()
        if i % 10 == 9:
            release_freed_memory()
    flush()
    answers = tuple(replace(done[item.text], item=item, correct=is_correct_answer(item, done[item.text].completion))
                    for item in items)
    return AnswerSet(answers=answers, seconds=sum(a.seconds for a in answers),
                     cpu_seconds=sum(a.cpu_seconds for a in answers), **head)
