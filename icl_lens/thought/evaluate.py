"""Evaluate a thought patch on a task: does the patched model answer without the prompt?

Four conditions on the task's held-out test queries (greedy decoding; an answer is
correct when the continuation, leading spaces stripped, starts with it):

- ``none``: the query alone, ``[BOS] + query``;
- ``full``: the instruction in context, ``[BOS] + instruction + query``;
- ``patched``: the query alone, model patched with the thought patch fitted on the
  task's train queries (Mazzawi, Dherin et al. 2025, arXiv 2510.08734);
- ``control``: the query alone, with a patch of the same per-layer ``‖ΔW‖_F`` and
  vector norms but random directions (:meth:`ThoughtPatch.random_control`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from icl_lens.model.greedy import greedy_continuations
from icl_lens.model.prompts import PromptError
from icl_lens.thought.batches import text_ids, with_bos
from icl_lens.thought.fit import thought_patch
from icl_lens.thought.tasks import Task

CONDITIONS = ("none", "full", "patched", "control")


@dataclass(frozen=True, eq=False)
class ThoughtEval:
    """Test accuracies of one task under the four conditions."""

    task: str
    model: str
    n_train: int
    n_test: int
    accuracy: dict[str, float]
    seconds: float
    kind: str
    eta: float
    ridge: float

    def to_dict(self) -> dict:
        return {"task": self.task, "model": self.model, "n_train": self.n_train, "n_test": self.n_test,
                "accuracy": dict(self.accuracy), "seconds": round(self.seconds, 3)}

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{"task": self.task, "model": self.model, "n_train": self.n_train,
                              "n_test": self.n_test, "condition": c, "accuracy": self.accuracy[c]}
                             for c in CONDITIONS if c in self.accuracy])


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


def accuracy(model, prompts: list[list[int]], answers: list[str], max_new_tokens: int) -> float:
    """Share of prompts whose greedy continuation starts with their answer."""
    def decided(i: int, new_ids: list[int]) -> bool:  # right or wrong is settled already
        text, want = model.tokenizer.decode(new_ids).lstrip(" "), answers[i].strip()
        return len(text) >= len(want) or not want.startswith(text)

    outs = greedy_continuations(model, prompts, max_new_tokens, finished=decided)
    texts = [model.tokenizer.decode(o) for o in outs]
    return sum(answer_correct(t, a) for t, a in zip(texts, answers)) / len(answers)


def evaluate_thought(
    model, task: Task, *, kind: str = "both", eta: float = 1.0, ridge: float = 0.0,
    n_train: int | None = None, conditions: tuple[str, ...] = CONDITIONS, seed: int = 0,
) -> ThoughtEval:
    """Fit on the first ``n_train`` train queries (default all), score the test queries."""
    start = time.perf_counter()
    max_new = _check_answers(model, task)
    n = len(task.train) if n_train is None else int(n_train)
    if not 1 <= n <= len(task.train):
        raise ValueError(f"n_train must be in 1..{len(task.train)} for task {task.name!r}, got {n_train}")
    instr = text_ids(model, task.instruction, what="instruction")
    q_ids = [text_ids(model, q, what=f"test query {i}") for i, (q, _) in enumerate(task.test)]
    answers = [a for _, a in task.test]
    plain = [with_bos(model, q) for q in q_ids]
    acc: dict[str, float] = {}
    if "none" in conditions:
        acc["none"] = accuracy(model, plain, answers, max_new)
    if "full" in conditions:
        acc["full"] = accuracy(model, [with_bos(model, instr + q) for q in q_ids], answers, max_new)
    if "patched" in conditions or "control" in conditions:
        patch = thought_patch(model, task.instruction, [q for q, _ in task.train[:n]], kind=kind, eta=eta, ridge=ridge)
        if "patched" in conditions:
            with patch.applied():
                acc["patched"] = accuracy(model, plain, answers, max_new)
        if "control" in conditions:
            with patch.random_control(seed).applied():
                acc["control"] = accuracy(model, plain, answers, max_new)
    return ThoughtEval(task=task.name, model=getattr(model, "icl_lens_name", model.cfg.model_name), n_train=n,
                       n_test=len(task.test), accuracy=acc, seconds=time.perf_counter() - start,
                       kind=kind, eta=float(eta), ridge=float(ridge))
