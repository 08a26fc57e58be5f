"""Locality of an edit: what a thought patch (or a steering vector) changes outside its task.

Model-editing work reports, next to the edit's success, how little it disturbs the rest
of the model. Two measures on fixed, committed inputs (``tasks/locality.json``):

- ``kl``: the mean next-token ``KL(unpatched ‖ patched)`` over every position of a fixed
  set of unrelated texts, each read as ``[BOS] + text`` (no query prefix: this is how
  the model is used for anything else);
- ``accuracy``: on another task (a few-shot task no shipped task resembles, read with
  its instruction in context, ``[BOS] + instruction + query``), the share of queries on
  which the edited model still gives the unpatched model's own answer: the greedy
  continuation up to the end of its first line (at most ``max_new_tokens`` tokens),
  spaces stripped, must be the same text.

The same file holds ``preserve_texts``: other unrelated texts a fit may be asked to keep
unchanged (``thought_patch(preserve=...)``), disjoint from the measured texts.

A zero edit scores ``kl = 0`` and ``accuracy = 1`` exactly. Edits are applied through
their own ``.applied(model)`` context manager (:class:`~icl_lens.thought.ThoughtPatch`,
:class:`~icl_lens.thought._steering.SteeringVector`), i.e. through
:mod:`icl_lens.model._weight_edits`.
"""
from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from icl_lens.model._greedy import greedy_continuations
from icl_lens.thought._instruction_batches import text_ids, with_bos
from icl_lens.thought._divergence import text_kl
from icl_lens.thought.tasks import TASK_DIR, TaskFormatError

LOCALITY_FILE = TASK_DIR / "locality.json"


@dataclass(frozen=True)
class LocalityData:
    """The fixed inputs: unrelated texts, and the other task's name, instruction and queries."""

    texts: tuple[str, ...]
    other_task: str
    other_instruction: str
    other_prompts: tuple[str, ...]
    preserve_texts: tuple[str, ...] = ()  # for ``thought_patch(preserve=...)``: never part of the measure


def load_locality(path: str | Path = LOCALITY_FILE) -> LocalityData:
    """Read ``{"texts": [...], "other_task": {"name", "instruction", "prompts": [...]}}``; a clear error when malformed."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        texts, other = raw["texts"], raw["other_task"]
        name, instruction, prompts = other["name"], other["instruction"], other["prompts"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise TaskFormatError(f"{path}: not a locality file ({type(err).__name__}: {err})") from None
    preserve = raw.get("preserve_texts", [])
    strings = [*texts, *prompts, instruction, *preserve]
    if not texts or not prompts or not all(isinstance(t, str) and t.strip() for t in strings):
        raise TaskFormatError(f"{path}: 'texts', 'other_task.instruction', 'other_task.prompts' and 'preserve_texts' "
                              "must be non-empty strings (lists of them)")
    if set(preserve) & set(texts):
        raise TaskFormatError(f"{path}: 'preserve_texts' must not repeat the measured 'texts'")
    return LocalityData(tuple(texts), str(name), instruction, tuple(prompts), tuple(preserve))


@dataclass(frozen=True)
class Locality:
    """Locality of one edit: mean next-token KL on the texts, agreement on the other task."""

    kl: float
    accuracy: float
    correct: int
    n_prompts: int
    n_positions: int

    def to_dict(self) -> dict:
        return {"kl": self.kl, "accuracy": self.accuracy, "correct": self.correct, "n_prompts": self.n_prompts,
                "n_positions": self.n_positions}

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([self.to_dict()])


@dataclass(frozen=True, eq=False)
class LocalityProbe:
    """The fixed inputs tokenised for one model, with the unpatched model's own continuations."""

    texts: tuple[tuple[int, ...], ...]
    prompts: tuple[tuple[int, ...], ...]
    reference: tuple[str, ...]  # the unpatched model's answers on the other task
    max_new_tokens: int
    model: object = field(repr=False)

    @torch.no_grad()
    def measure(self, edit=None) -> Locality:
        """Locality of ``edit`` (anything with ``.applied(model)``; None: no edit)."""
        model = self.model
        kl = text_kl(model, self.texts, edit)
        with (nullcontext() if edit is None else edit.applied(model)):
            outs = _answers(model, self.prompts, self.max_new_tokens)
        correct = sum(o == r for o, r in zip(outs, self.reference))
        return Locality(kl=kl, accuracy=correct / len(self.prompts), correct=correct,
                        n_prompts=len(self.prompts), n_positions=sum(len(t) for t in self.texts))


def _answers(model, prompts, max_new_tokens: int) -> list[str]:
    """Greedy continuations up to the end of their first non-empty line, spaces stripped."""
    def done(i: int, new_ids: list[int]) -> bool:
        return "\n" in model.tokenizer.decode(new_ids).lstrip()

    outs = greedy_continuations(model, [list(p) for p in prompts], max_new_tokens, finished=done)
    return [model.tokenizer.decode(o).lstrip().split("\n", 1)[0].strip() for o in outs]


def locality_probe(model, data: LocalityData | None = None, *, max_new_tokens: int = 4) -> LocalityProbe:
    """Tokenise the locality inputs for ``model`` and record its own (unpatched) answers on the other task."""
    data = data or load_locality()
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    texts = tuple(tuple(with_bos(model, text_ids(model, t, what="locality text"))) for t in data.texts)
    instr = text_ids(model, data.other_instruction, what="locality instruction")
    prompts = tuple(tuple(with_bos(model, instr + text_ids(model, p, what="locality prompt"))) for p in data.other_prompts)
    reference = tuple(_answers(model, prompts, max_new_tokens))
    return LocalityProbe(texts, prompts, reference, max_new_tokens, model)
