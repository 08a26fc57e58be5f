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

A :class:`LocalitySet` (several formats of text, several other tasks; :func:`load_locality_set` from a file the
caller names, :func:`locality_set_probe`) is measured the same way, per format and per task, and beside an edit
:meth:`LocalitySetProbe.anchor` gives what the instruction itself does to the same inputs when prepended.

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

from icl_lens.model._greedy import greedy_continuations, tail_logits
from icl_lens.thought._instruction_batches import text_ids, with_bos
from icl_lens.thought._divergence import mean_kl, text_kl
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


# ---- A locality set of several formats and tasks (issue 38: the set nobody tuned on)


@dataclass(frozen=True)
class LocalitySet:
    """Unrelated texts grouped by format, and several other few-shot tasks (``name -> (instruction, prompts)``)."""

    formats: dict[str, tuple[str, ...]]
    tasks: dict[str, tuple[str, tuple[str, ...]]]


def load_locality_set(path: str | Path) -> LocalitySet:
    """Read ``{"formats": {name: [texts]}, "tasks": [{"name", "instruction", "prompts": [...]}]}`` (no default path:
    the caller names the file); a clear error when malformed."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        formats = {str(k): tuple(v) for k, v in raw["formats"].items()}
        tasks = {str(t["name"]): (t["instruction"], tuple(t["prompts"])) for t in raw["tasks"]}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
        raise TaskFormatError(f"{path}: not a locality set ({type(err).__name__}: {err})") from None
    strings = [t for v in formats.values() for t in v] + [s for i, p in tasks.values() for s in (i, *p)]
    if not formats or not tasks or any(not v for v in formats.values()) or any(not p for _, p in tasks.values()) \
            or not all(isinstance(s, str) and s.strip() for s in strings):
        raise TaskFormatError(f"{path}: every format needs texts and every task an instruction and prompts, all "
                              "non-empty strings")
    return LocalitySet(formats, tasks)


@dataclass(frozen=True)
class SetLocality:
    """One edit (or the instruction prepended: the anchor) on a :class:`LocalitySet`: the mean next-token KL per
    format and over all texts (weighted by positions), and the share of each task's answers kept."""

    kl: dict[str, float]
    kl_all: float
    kept: dict[str, float]

    def to_dict(self) -> dict:
        return {"kl": dict(self.kl), "kl_all": self.kl_all, "kept": dict(self.kept)}

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{**{f"kl/{k}": v for k, v in self.kl.items()}, "kl_all": self.kl_all,
                              **{f"kept/{k}": v for k, v in self.kept.items()}}])


@dataclass(frozen=True, eq=False)
class LocalitySetProbe:
    """A :class:`LocalitySet` tokenised for one model, with the unpatched model's own answers on every task."""

    texts: dict[str, tuple[tuple[int, ...], ...]]  # format -> [BOS] + text ids
    prompts: dict[str, tuple[tuple[int, ...], ...]]  # task -> instruction + prompt ids (no BOS)
    reference: dict[str, tuple[str, ...]]
    max_new_tokens: int
    model: object = field(repr=False)

    @torch.no_grad()
    def measure(self, edit=None) -> SetLocality:
        """Locality of ``edit`` (anything with ``.applied(model)``; None: no edit): :func:`text_kl` per format and the
        answers kept per task, as :class:`LocalityProbe` measures them."""
        model = self.model
        kl = {f: text_kl(model, ids, edit) for f, ids in self.texts.items()}
        with (nullcontext() if edit is None else edit.applied(model)):
            kept = {t: self._kept(t, self._answers(t, ())) for t in self.prompts}
        return SetLocality(kl, self._pooled(kl), kept)

    @torch.no_grad()
    def anchor(self, instruction: str) -> SetLocality:
        """What the instruction itself does to the same inputs when prepended (after BOS), unedited: the next-token
        ``KL(plain ‖ with the instruction)`` at every position of each text (each row predicts the same next token
        in both), and the share of each task's answers kept with the instruction before the task's own prompt."""
        model = self.model
        instr = text_ids(model, instruction, what="instruction")
        kl = {}
        for f, texts in self.texts.items():
            total = 0.0
            for ids in texts:
                plain = tail_logits(model, [list(ids)], [len(ids)])[0]
                body = list(ids[len(with_bos(model, [])):])  # the text after its BOS
                prompted = tail_logits(model, [with_bos(model, instr + body)], [len(ids)])[0]
                total += mean_kl(plain, prompted) * len(ids)
            kl[f] = total / sum(len(ids) for ids in texts)
        kept = {t: self._kept(t, self._answers(t, instr)) for t in self.prompts}
        return SetLocality(kl, self._pooled(kl), kept)

    def _answers(self, task: str, before) -> list[str]:
        return _task_answers(self.model, self.prompts[task], before, self.max_new_tokens)

    def _kept(self, task: str, answers: list[str]) -> float:
        return sum(a == r for a, r in zip(answers, self.reference[task])) / len(answers)

    def _pooled(self, kl: dict[str, float]) -> float:
        n = {f: sum(len(ids) for ids in self.texts[f]) for f in kl}
        return sum(kl[f] * n[f] for f in kl) / sum(n.values())


def locality_set_probe(model, data: LocalitySet, *, max_new_tokens: int = 4) -> LocalitySetProbe:
    """Tokenise a :class:`LocalitySet` for ``model`` and record its own (unpatched) answers on every task."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    texts = {f: tuple(tuple(with_bos(model, text_ids(model, t, what=f"{f} text"))) for t in ts)
             for f, ts in data.formats.items()}
    prompts = {name: tuple(tuple(text_ids(model, instruction, what=f"{name} instruction")
                                 + text_ids(model, p, what=f"{name} prompt")) for p in ps)
               for name, (instruction, ps) in data.tasks.items()}
    reference = {t: tuple(_task_answers(model, ps, (), max_new_tokens)) for t, ps in prompts.items()}
    return LocalitySetProbe(texts, prompts, reference, max_new_tokens, model)


def _task_answers(model, prompts, before, max_new_tokens: int) -> list[str]:
    """:func:`_answers` of ``[BOS] + before + prompt`` for every prompt."""
    return _answers(model, [with_bos(model, list(before) + list(p)) for p in prompts], max_new_tokens)
