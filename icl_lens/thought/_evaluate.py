"""Evaluate a thought patch on a task: does the patched model answer without the prompt?

Conditions on the task's held-out test queries (greedy decoding, the longest answer's
token count plus one new tokens; an answer is correct when the continuation, leading
spaces stripped, starts with it *and* the answer is followed by the end of the
continuation or a character that cannot continue a word: not a letter, digit, ``_``,
``-`` or ``'`` (:func:`answer_correct`; "six" does not accept "sixteen", "twenty" does
not accept "twenty-one"). Every continuation is kept whole (``continuations``), so the
result can be re-scored by another rule):

- ``none``: the query alone, ``[BOS] + prefix + query`` (``prefix``: the patch's query
  prefix, the same in every query-alone condition);
- ``full``: the instruction in context, ``[BOS] + instruction + query``;
- ``patched``: the query alone, model patched with the thought patch fitted on the
  task's train queries (Mazzawi, Dherin et al. 2025, arXiv 2510.08734);
- ``control``: the query alone, with a patch of the same per-layer ``‖ΔW‖_F``, vector
  and ``‖ΔW_out‖_F`` norms but random directions (:meth:`ThoughtPatch.random_control`);
- ``distilled``: the query alone, with the context-distillation baseline
  (:func:`~icl_lens.thought._distill.distill_patch`: gradient descent on the same
  parameters, calibration rows and answer positions);
- ``steering``: the query alone, with the steering vector of the same train queries
  added at its best layer (:mod:`icl_lens.thought._steering`).

``fresh=True`` also scores the task's ``fresh`` split (queries no selection stage reads, issue 22) with the very
edits fitted for the test queries, in the same run (the result's ``fresh``, with ``split="fresh"``).

``gain_recovered`` of a query-alone condition ``c``: the share of the instruction's gain it
recovers, ``(acc_c − acc_none) / (acc_full − acc_none)`` (None when full = none).
``seconds``: the wall time of each method's fit (``patched``, ``distilled``) and of the
whole evaluation (``total``).

The result keeps every test query's outcome (front ends turn them into intervals with
:mod:`icl_lens.stats._intervals` and :mod:`icl_lens.stats._bootstrap`) and answer, so that a
condition can be compared with ``full`` answer by answer (``agreement_with_full``: the
share of queries answered as the instruction answers them, wrong answers included (a correct
answer counts as the answer itself, whatever follows it); the
thought patch imitates the contextual model, so this, not accuracy alone, says how much
of the instruction it carries), and for every edit (patched, control, steering) its
locality (:mod:`icl_lens.thought._locality`): the mean next-token KL on fixed unrelated
texts and the share of the unpatched model's own answers on another task that the
edited model keeps.
"""
from __future__ import annotations

import re
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import pandas as pd

from icl_lens.model._greedy import greedy_continuations
from icl_lens.model._prompts import PromptError, context_limit
from icl_lens.thought._instruction_batches import prefix_ids, text_ids, with_bos
from icl_lens.thought._defaults import CONDITIONS, DEFAULT_QUERY_PREFIX, EDITS, PRESERVE_SET, ThoughtFit
from icl_lens.thought._fit import thought_patch
from icl_lens.thought._locality import LocalityProbe, locality_probe
from icl_lens.thought._steering import steering_vector
from icl_lens.thought.tasks import Task

if TYPE_CHECKING:
    from icl_lens.model._types import Model

WORD_CHARACTER = re.compile(r"[\w'-]")  # a character that continues a word: the answer must not be followed by one


@dataclass(frozen=True, eq=False)
class ThoughtEval:
    """Test outcomes of one task under each condition (accuracy = share correct) and the edits' locality."""

    task: str
    model: str
    n_train: int
    n_test: int
    outcomes: dict[str, tuple[bool, ...]]  # per condition, per test query: correct?
    answers: dict[str, tuple[str, ...]]  # per condition, per test query: the answer given (see graded)
    locality: dict[str, dict]  # per edit condition: Locality.to_dict()
    steering_layer: int | None
    seconds: dict[str, float]  # wall time: "patched" (the fit), "distilled", "total"
    kind: str
    eta: float
    ridge: float
    query_prefix: str
    answer_tokens: int = 0
    continuations: dict[str, tuple[str, ...]] = field(default_factory=dict)  # per condition: every new token, decoded
    extra: dict = field(default_factory=dict)
    split: str = "test"  # the queries scored: the task's "test" or "fresh" split
    fresh: ThoughtEval | None = None  # the fresh split scored with the same edits (evaluate_thought(fresh=True))
    fit: ThoughtFit | None = None  # the settings of the patch (and of the distillation's parts)

    @property
    def accuracy(self) -> dict[str, float]:
        return {c: sum(o) / len(o) for c, o in self.outcomes.items()}

    @property
    def agreement_with_full(self) -> dict[str, float]:
        """Per query-alone condition: share of test queries answered as the full instruction answers them
        (errors included): how much of the instruction's behaviour the condition carries."""
        if "full" not in self.answers:
            return {}
        return {c: agreement(a, self.answers["full"]) for c, a in self.answers.items() if c != "full"}

    @property
    def gain_recovered(self) -> dict[str, float | None]:
        """Per query-alone condition ``c``: ``(acc_c − acc_none) / (acc_full − acc_none)`` (None when full = none)."""
        return gain_recovered(self.accuracy)

    def to_dict(self, *, outcomes: bool = False) -> dict:
        out = {"task": self.task, "split": self.split, "model": self.model, "kind": self.kind, "eta": self.eta,
               "ridge": self.ridge, "query_prefix": self.query_prefix, "answer_tokens": self.answer_tokens, "n_train": self.n_train,
               "n_test": self.n_test,
               "accuracy": self.accuracy, "correct": {c: sum(o) for c, o in self.outcomes.items()},
               "locality_kl": {c: v["kl"] for c, v in self.locality.items()},
               "locality_kept": {c: v["accuracy"] for c, v in self.locality.items()},
               "gain_recovered": self.gain_recovered,
               "agreement_with_full": self.agreement_with_full,
               "steering_layer": self.steering_layer, "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
               "continuations": {c: list(t) for c, t in self.continuations.items()}, **self.extra}
        if self.fit is not None:
            out["fit"] = self.fit.to_dict()
        if outcomes:
            out["outcomes"] = {c: [int(x) for x in o] for c, o in self.outcomes.items()}
            out["answers"] = {c: list(a) for c, a in self.answers.items()}
        return out

    def to_frame(self) -> pd.DataFrame:
        acc, gain = self.accuracy, self.gain_recovered
        return pd.DataFrame([{"task": self.task, "model": self.model, "n_train": self.n_train, "n_test": self.n_test,
                              "condition": c, "accuracy": acc[c], "correct": sum(self.outcomes[c]),
                              "gain_recovered": gain.get(c),
                              "locality_kl": self.locality.get(c, {}).get("kl"),
                              "locality_kept": self.locality.get(c, {}).get("accuracy")}
                             for c in CONDITIONS if c in acc])


def gain_recovered(accuracy: dict[str, float]) -> dict[str, float | None]:
    """``(acc_c − acc_none) / (acc_full − acc_none)`` of every condition but none and full (None when full = none)."""
    if "none" not in accuracy or "full" not in accuracy:
        return {}
    gap = accuracy["full"] - accuracy["none"]
    return {c: (a - accuracy["none"]) / gap if gap else None for c, a in accuracy.items() if c not in ("none", "full")}


def answer_correct(continuation: str, answer: str) -> bool:
    """The rule: the continuation, leading spaces stripped, starts with the answer, and the answer is followed by
    the end or by a character that cannot continue a word (``WORD_CHARACTER``: "six" is not right for "sixteen")."""
    text, want = continuation.lstrip(" "), answer.strip()
    return text.startswith(want) and not WORD_CHARACTER.match(text[len(want) : len(want) + 1])


def _check_answers(model, task: Task, splits: Sequence[str] = ("test",)) -> int:
    """Tokens to generate: the longest answer of the train split and of ``splits`` (as it follows a space) plus one."""
    longest = 1
    for split, items in (("train", task.train), *((s, task_split(task, s)) for s in splits)):
        for i, (_, answer) in enumerate(items):
            try:
                n = len(text_ids(model, " " + answer.strip(), what=f"{split}[{i}] answer"))
            except PromptError as err:
                raise PromptError(f"task {task.name!r}: {err}") from None
            longest = max(longest, n)
    return longest + 1


def graded(model, prompts: list[list[int]], answers: list[str], max_new_tokens: int
           ) -> tuple[tuple[bool, ...], tuple[str, ...], tuple[str, ...]]:
    """Per prompt: is its greedy continuation right (:func:`answer_correct`), the answer it gives, and the whole
    continuation (``max_new_tokens`` new tokens, decoded). The answer given is the expected answer when right;
    when wrong, the continuation (leading spaces stripped) up to the token where it leaves the expected answer, or
    up to the token after the answer's length: what two conditions are compared by (:func:`agreement`)."""
    outs = greedy_continuations(model, prompts, max_new_tokens)
    right, given, whole = [], [], []
    for o, a in zip(outs, answers):
        text, want = model.tokenizer.decode(o), a.strip()
        ok = answer_correct(text, a)
        if not ok:  # the shortest head that shows it is wrong
            k = next((k for k in range(1, len(o) + 1)
                      if not answer_correct(model.tokenizer.decode(o[:k]), a)
                      and (len(model.tokenizer.decode(o[:k]).lstrip(" ")) > len(want)
                           or not want.startswith(model.tokenizer.decode(o[:k]).lstrip(" ")))), len(o))
            answer = model.tokenizer.decode(o[:k]).lstrip(" ")
        right.append(ok)
        given.append(want if ok else answer)
        whole.append(text)
    return tuple(right), tuple(given), tuple(whole)


def _check_context(model, task: Task, split: str, prompts: Sequence[Sequence[int]], max_new: int,
                   where: str = "") -> None:
    """Every prompt to score plus the ``max_new`` tokens generated after it within the model's context: else a
    :class:`PromptError` naming the query, before anything is fitted (past it, rotary models would read positions
    they were never trained on without a word, and GPT-2 fails inside its position embedding)."""
    limit = context_limit(model)
    for i, p in enumerate(prompts):
        if len(p) + max_new > limit:
            raise PromptError(f"task {task.name!r}: {split} query {i}{where} takes {len(p)} tokens and up to {max_new} "
                              f"more are generated ({len(p) + max_new}), past the context of {model.cfg.model_name!r} "
                              f"({limit} tokens); shorten the query or the instruction, or drop the query")


def task_split(task: Task, split: str) -> tuple[tuple[str, str], ...]:
    """The task's ``"test"`` or ``"fresh"`` queries (a clear error for another name, or an empty fresh split)."""
    if split not in ("test", "fresh"):
        raise ValueError(f"split must be 'test' or 'fresh', got {split!r}")
    items = task.test if split == "test" else task.fresh
    if not items:
        raise ValueError(f"task {task.name!r} has no {split} split to score")
    return items


def evaluate_edit(model, task: Task, edit, *, query_prefix: str = DEFAULT_QUERY_PREFIX, split: str = "test") -> dict:
    """One edit (anything with ``.applied(model)``: e.g. a composed patch) on ``task``'s ``split`` queries (test or
    fresh) read alone: ``{"accuracy", "correct", "n_test", "outcomes", "answers", "continuations"}`` (:func:`graded`)."""
    items = task_split(task, split)
    max_new = _check_answers(model, task, (split,))
    pre = prefix_ids(model, query_prefix)
    plain = [with_bos(model, pre + text_ids(model, q, what=f"{split} query {i}")) for i, (q, _) in enumerate(items)]
    _check_context(model, task, split, plain, max_new)
    with edit.applied(model):
        right, given, whole = graded(model, plain, [a for _, a in items], max_new)
    return {"accuracy": sum(right) / len(right), "correct": sum(right), "n_test": len(right),
            "outcomes": [int(x) for x in right], "answers": list(given), "continuations": list(whole)}


def agreement(a: Sequence[str], b: Sequence[str]) -> float:
    """Share of queries on which two conditions give the same answer (as :func:`graded` settles it)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"agreement needs two equally long, non-empty answer lists, got {len(a)} and {len(b)}")
    return sum(x == y for x, y in zip(a, b)) / len(a)


def evaluate_thought(
    model: Model, task: Task, fit: ThoughtFit | None = None, *, n_train: int | None = None,
    conditions: tuple[str, ...] = CONDITIONS, seed: int = 0, locality: LocalityProbe | bool = True,
    distill: dict | None = None, fresh: bool = False, progress: bool = False, **settings,
) -> ThoughtEval:
    """Fit on the first ``n_train`` train queries (default all), score the test queries.

    ``fit``, ``settings``: the thought patch's :class:`~icl_lens.thought.ThoughtFit` and keyword arguments
    replacing its fields, as :func:`~icl_lens.thought.thought_patch` takes them (the distillation uses the
    same kind, query prefix, answer tokens and layers; the steering vector the query prefix).
    ``distill``: keyword arguments of :func:`~icl_lens.thought.distill_patch` (steps, lr, ...).
    ``locality``: a probe built once per model (:func:`~icl_lens.thought._locality.locality_probe`),
    ``True`` to build one here, ``False`` to skip the locality measures.
    ``fresh``: also score the task's fresh split (``task.fresh``, which must not be empty) with the same fitted
    edits; its result is the returned evaluation's ``fresh`` (same locality and seconds, ``split="fresh"``).
    """
    from icl_lens.thought._distill import distill_patch
    from icl_lens.thought._preserve import preserve_texts

    fit = ThoughtFit.of(fit, **settings)
    start = time.perf_counter()
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        raise ValueError(f"unknown condition(s) {unknown}; known: {CONDITIONS}")
    splits = {s: task_split(task, s) for s in ("test", *(("fresh",) if fresh else ()))}
    max_new = {s: _check_answers(model, task, (s,)) for s in splits}  # per split: test reads as without fresh
    n = len(task.train) if n_train is None else int(n_train)
    if not 1 <= n <= len(task.train):
        raise ValueError(f"n_train must be in 1..{len(task.train)} for task {task.name!r}, got {n_train}")
    instr = text_ids(model, task.instruction, what="instruction")
    pre = prefix_ids(model, fit.query_prefix)
    q_ids = {s: [text_ids(model, q, what=f"{s} query {i}") for i, (q, _) in enumerate(items)]
             for s, items in splits.items()}
    answers = {s: [a for _, a in items] for s, items in splits.items()}
    plain = {s: [with_bos(model, pre + q) for q in qs] for s, qs in q_ids.items()}
    full = {s: [with_bos(model, instr + q) for q in qs] for s, qs in q_ids.items()}
    for s in splits:
        _check_context(model, task, s, plain[s], max_new[s])
        if "full" in conditions:
            _check_context(model, task, s, full[s], max_new[s], " with the instruction in context")
    calibration = [q for q, _ in task.train[:n]]
    preserve_set = PRESERVE_SET if fit.preserve is None else "given"
    n_preserve = (len(fit.preserve) if fit.preserve is not None
                  else len(preserve_texts(model)) if fit.preserve_strength else 0)
    if locality is True and any(c in EDITS for c in conditions):
        locality = locality_probe(model)
    res: dict[str, dict[str, tuple[bool, ...]]] = {s: {} for s in splits}
    given: dict[str, dict[str, tuple[str, ...]]] = {s: {} for s in splits}
    whole: dict[str, dict[str, tuple[str, ...]]] = {s: {} for s in splits}
    loc: dict[str, dict] = {}
    seconds: dict[str, float] = {}

    def score(condition: str, edit=None, prompts=plain) -> None:
        with (nullcontext() if edit is None else edit.applied()):
            for s in splits:
                res[s][condition], given[s][condition], whole[s][condition] = graded(model, prompts[s], answers[s],
                                                                                    max_new[s])
        if edit is not None and locality:
            loc[condition] = locality.measure(edit).to_dict()

    if "none" in conditions:
        score("none")
    if "full" in conditions:
        score("full", prompts=full)
    if "patched" in conditions or "control" in conditions:
        t0 = time.perf_counter()
        patch = thought_patch(model, task.instruction, calibration, fit)
        seconds["patched"] = time.perf_counter() - t0
        if "patched" in conditions:
            score("patched", patch)
    if "distilled" in conditions:
        t0 = time.perf_counter()
        distilled = distill_patch(model, task.instruction, calibration, fit, progress=progress, **(distill or {}))
        seconds["distilled"] = time.perf_counter() - t0
        score("distilled", distilled)
    steer_layer = None
    if "steering" in conditions:
        steer = steering_vector(model, task.instruction, calibration, query_prefix=fit.query_prefix)
        steer_layer = steer.layer
        score("steering", steer)
    if "control" in conditions:
        score("control", patch.random_control(seed))
    seconds["total"] = time.perf_counter() - start
    extra = {"preserve": n_preserve, "preserve_strength": fit.preserve_strength}
    if fit.preserve_strength:
        extra["preserve_set"] = preserve_set
    if "distilled" in conditions:
        extra["distill"] = distilled.settings
    common = dict(task=task.name, model=model.cfg.model_name, n_train=n, locality=loc, steering_layer=steer_layer,
                  seconds=seconds, kind=fit.kind, eta=fit.eta, ridge=fit.ridge, query_prefix=fit.query_prefix,
                  answer_tokens=fit.answer_tokens, fit=fit)
    evals = {s: ThoughtEval(n_test=len(items), outcomes=res[s], answers=given[s], continuations=whole[s],
                            split=s, extra=extra, **common) for s, items in splits.items()}
    return replace(evals["test"], fresh=evals.get("fresh"))
