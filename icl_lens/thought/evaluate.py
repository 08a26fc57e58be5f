"""Evaluate a thought patch on a task: does the patched model answer without the prompt?

Conditions on the task's held-out test queries (greedy decoding; an answer is correct
when the continuation, leading spaces stripped, starts with it):

- ``none``: the query alone, ``[BOS] + prefix + query`` (``prefix``: the patch's query
  prefix, the same in every query-alone condition);
- ``full``: the instruction in context, ``[BOS] + instruction + query``;
- ``patched``: the query alone, model patched with the thought patch fitted on the
  task's train queries (Mazzawi, Dherin et al. 2025, arXiv 2510.08734);
- ``control``: the query alone, with a patch of the same per-layer ``‖ΔW‖_F``, vector
  and ``‖ΔW_out‖_F`` norms but random directions (:meth:`ThoughtPatch.random_control`);
- ``steering``: the query alone, with the steering vector of the same train queries
  added at its best layer (:mod:`icl_lens.thought.steering`).

The result keeps every test query's outcome (front ends turn them into intervals with
:mod:`icl_lens.stats.intervals` and :mod:`icl_lens.stats.bootstrap`) and answer, so that a
condition can be compared with ``full`` answer by answer (``agreement_with_full``: the
share of queries answered as the instruction answers them, wrong answers included; the
thought patch imitates the contextual model, so this, not accuracy alone, says how much
of the instruction it carries), and for every edit (patched, control, steering) its
locality (:mod:`icl_lens.thought.locality`): the mean next-token KL on fixed unrelated
texts and the share of the unpatched model's own answers on another task that the
edited model keeps.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from icl_lens.model.greedy import greedy_continuations
from icl_lens.model.prompts import PromptError
from icl_lens.thought.instruction_batches import prefix_ids, text_ids, with_bos
from icl_lens.thought.defaults import DEFAULT_ANSWER_TOKENS, DEFAULT_KIND, DEFAULT_QUERY_PREFIX, DEFAULT_RIDGE
from icl_lens.thought.fit import thought_patch
from icl_lens.thought.locality import LocalityProbe, locality_probe
from icl_lens.thought.steering import steering_vector
from icl_lens.thought.tasks import Task

if TYPE_CHECKING:
    from icl_lens.model.types import Model

CONDITIONS = ("none", "full", "patched", "control", "steering")
EDITS = ("patched", "control", "steering")  # conditions that edit the model: locality is measured for these


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
    seconds: float
    kind: str
    eta: float
    ridge: float
    query_prefix: str
    answer_tokens: int = 0
    extra: dict = field(default_factory=dict)

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

    def to_dict(self, *, outcomes: bool = False) -> dict:
        out = {"task": self.task, "model": self.model, "kind": self.kind, "eta": self.eta, "ridge": self.ridge,
               "query_prefix": self.query_prefix, "answer_tokens": self.answer_tokens, "n_train": self.n_train,
               "n_test": self.n_test,
               "accuracy": self.accuracy, "correct": {c: sum(o) for c, o in self.outcomes.items()},
               "locality_kl": {c: v["kl"] for c, v in self.locality.items()},
               "locality_accuracy": {c: v["accuracy"] for c, v in self.locality.items()},
               "agreement_with_full": self.agreement_with_full,
               "steering_layer": self.steering_layer, "seconds": round(self.seconds, 3), **self.extra}
        if outcomes:
            out["outcomes"] = {c: [int(x) for x in o] for c, o in self.outcomes.items()}
            out["answers"] = {c: list(a) for c, a in self.answers.items()}
        return out

    def to_frame(self) -> pd.DataFrame:
        acc = self.accuracy
        return pd.DataFrame([{"task": self.task, "model": self.model, "n_train": self.n_train, "n_test": self.n_test,
                              "condition": c, "accuracy": acc[c], "correct": sum(self.outcomes[c]),
                              "locality_kl": self.locality.get(c, {}).get("kl"),
                              "locality_accuracy": self.locality.get(c, {}).get("accuracy")}
                             for c in CONDITIONS if c in acc])


def answer_correct(continuation: str, answer: str) -> bool:
    """The task's rule: the continuation, leading spaces stripped, starts with the answer."""
    return continuation.lstrip(" ").startswith(answer.strip())


def _check_answers(model, task: Task) -> int:
    """Tokens to generate: the longest answer (as it follows a space) plus one."""
    longest = 1
    for split, items in (("train", task.train), ("test", task.test)):
        for i, (_, answer) in enumerate(items):
            try:
                n = len(text_ids(model, " " + answer.strip(), what=f"{split}[{i}] answer"))
            except PromptError as err:
                raise PromptError(f"task {task.name!r}: {err}") from None
            longest = max(longest, n)
    return longest + 1


def graded(model, prompts: list[list[int]], answers: list[str], max_new_tokens: int
           ) -> tuple[tuple[bool, ...], tuple[str, ...]]:
    """Per prompt: does its greedy continuation start with its answer, and that continuation up to the token
    where right or wrong is settled (leading spaces stripped: what two conditions are compared by)."""
    def decided(i: int, new_ids: list[int]) -> bool:  # right or wrong is settled already
        text, want = model.tokenizer.decode(new_ids).lstrip(" "), answers[i].strip()
        return len(text) >= len(want) or not want.startswith(text)

    outs = greedy_continuations(model, prompts, max_new_tokens, finished=decided)
    settled = [next((k for k in range(1, len(o)) if decided(i, o[:k])), len(o)) for i, o in enumerate(outs)]
    return (tuple(answer_correct(model.tokenizer.decode(o), a) for o, a in zip(outs, answers)),
            tuple(model.tokenizer.decode(o[:k]).lstrip(" ") for o, k in zip(outs, settled)))


def agreement(a: Sequence[str], b: Sequence[str]) -> float:
    """Share of queries on which two conditions give the same answer (as :func:`graded` settles it)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"agreement needs two equally long, non-empty answer lists, got {len(a)} and {len(b)}")
    return sum(x == y for x, y in zip(a, b)) / len(a)


def evaluate_thought(
    model: Model, task: Task, *, kind: str = DEFAULT_KIND, eta: float = 1.0, ridge: float = DEFAULT_RIDGE,
    query_prefix: str = DEFAULT_QUERY_PREFIX, answer_tokens: int = DEFAULT_ANSWER_TOKENS, n_train: int | None = None,
    conditions: tuple[str, ...] = CONDITIONS,
    seed: int = 0, locality: LocalityProbe | bool = True, preserve: tuple[str, ...] = (),
) -> ThoughtEval:
    """Fit on the first ``n_train`` train queries (default all), score the test queries.

    ``preserve``: texts the fit keeps unchanged (:func:`~icl_lens.thought.fit.thought_patch`).
    ``locality``: a probe built once per model (:func:`~icl_lens.thought.locality.locality_probe`),
    ``True`` to build one here, ``False`` to skip the locality measures.
    """
    start = time.perf_counter()
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        raise ValueError(f"unknown condition(s) {unknown}; known: {CONDITIONS}")
    max_new = _check_answers(model, task)
    n = len(task.train) if n_train is None else int(n_train)
    if not 1 <= n <= len(task.train):
        raise ValueError(f"n_train must be in 1..{len(task.train)} for task {task.name!r}, got {n_train}")
    instr = text_ids(model, task.instruction, what="instruction")
    q_ids = [text_ids(model, q, what=f"test query {i}") for i, (q, _) in enumerate(task.test)]
    answers = [a for _, a in task.test]
    pre = prefix_ids(model, query_prefix)
    plain = [with_bos(model, pre + q) for q in q_ids]
    calibration = [q for q, _ in task.train[:n]]
    if locality is True and any(c in EDITS for c in conditions):
        locality = locality_probe(model)
    res: dict[str, tuple[bool, ...]] = {}
    given: dict[str, tuple[str, ...]] = {}
    loc: dict[str, dict] = {}

    def score(condition: str, edit=None) -> None:
        if edit is None:
            res[condition], given[condition] = graded(model, plain, answers, max_new)
        else:
            with edit.applied():
                res[condition], given[condition] = graded(model, plain, answers, max_new)
            if locality:
                loc[condition] = locality.measure(edit).to_dict()

    if "none" in conditions:
        score("none")
    if "full" in conditions:
        res["full"], given["full"] = graded(model, [with_bos(model, instr + q) for q in q_ids], answers, max_new)
    if "patched" in conditions or "control" in conditions:
        patch = thought_patch(model, task.instruction, calibration, kind=kind, eta=eta, ridge=ridge,
                              query_prefix=query_prefix, answer_tokens=answer_tokens, preserve=preserve)
        if "patched" in conditions:
            score("patched", patch)
        if "control" in conditions:
            score("control", patch.random_control(seed))
    steer_layer = None
    if "steering" in conditions:
        steer = steering_vector(model, task.instruction, calibration, query_prefix=query_prefix)
        steer_layer = steer.layer
        score("steering", steer)
    return ThoughtEval(task=task.name, model=model.cfg.model_name, n_train=n,
                       n_test=len(task.test), outcomes=res, answers=given, locality=loc, steering_layer=steer_layer,
                       seconds=time.perf_counter() - start, kind=kind, eta=float(eta), ridge=float(ridge),
                       query_prefix=query_prefix, answer_tokens=answer_tokens,
                       extra={"preserve": len(preserve)} if preserve else {})
