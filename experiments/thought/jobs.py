"""What a run computes: the jobs of one model (table, paper, curve, compose, tuned, the selection stages, distillation,
diagnosis), one named step each (:class:`ModelJobs`), each result stored in the cache as soon as it is done under the
key of the :class:`~icl_lens.thought.ThoughtFit` it was computed with (:func:`~experiments.thought.cache.row_key`)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from tqdm import tqdm

from experiments.thought.cache import cache_path, cached, current_row, row_key
from experiments.thought.method import equal_distill_plan
from experiments.thought.settings import (
    COMPOSE_GROUPS,
    DISTILL_LRS,
    DISTILL_TASKS,
    PRESERVE_STRENGTHS,
    SCORE_ANSWER_TOKENS,
    SELECT_ANSWER_GRID,
    SELECT_EXTRA,
    SELECT_FIT,
    SELECT_GRID,
    SELECT_TASKS,
    SELECT_VALIDATE,
    SIZES,
    STAGE_ONE,
    default_fit,
    default_setting,
    paper_fit,
    setting_name,
    target_verdict,
)
from experiments.thought.targets import SPLITS, per_task_key
from icl_lens.thought import Task, load_task


def selection_split(task: Task, n_fit: int, n_validate: int) -> tuple[list[str], list[str]]:
    """The queries every selection stage reads: fit on the first ``n_fit`` train queries, score the next
    ``n_validate`` (never ``test``, never ``fresh``)."""
    return [q for q, _ in task.train[:n_fit]], [q for q, _ in task.train[n_fit:n_fit + n_validate]]


class ModelJobs:
    """The jobs of one model, each a method named after it (``table``, ``paper``, …) that computes what the cache
    lacks. ``run`` (command and machine) is recorded with the keys it computed."""

    def __init__(self, model_name: str, out: Path, run: str, *, n_train: int | None = None,
                 select_fit: int = SELECT_FIT, select_validate: int = SELECT_VALIDATE,
                 select_grid=SELECT_GRID, select_extra=SELECT_EXTRA, select_answer_grid=SELECT_ANSWER_GRID,
                 tune_tasks: list[str] | None = None, distill_steps: int | None = None,
                 distill_on: list[str] | None = None, null_space_grid=()):
        from icl_lens.model import load_model

        self.cache, self.results = cache_path(out, model_name), cached(out, model_name)
        self.model, self.run = load_model(model_name), run
        self.fit = default_fit()  # the documented default: every key of a default result hashes it
        self.default = default_setting(self.fit)  # the same, as the fields rows show
        self.n_train, self.select_fit, self.select_validate = n_train, select_fit, select_validate
        self.select_settings = (*select_grid, *select_extra)
        self.select_answer_grid, self.tune_tasks = select_answer_grid, tune_tasks
        self.distill_steps, self.distill_on = distill_steps, distill_on
        self.null_space_grid = null_space_grid
        self.stage_one = {**STAGE_ONE, "answer_tokens": 0}
        self._probe = None
        self._held_out: list = []

    # ---- shared pieces
    def store(self, key: str, value: dict) -> None:
        self.results[key] = value
        runs = self.results.setdefault("runs", {})
        runs[self.run] = runs.get(self.run, []) + [key]
        self.cache.write_text(json.dumps(self.results, indent=1))

    def probe(self):
        """The locality probe of the model, built once."""
        from icl_lens.thought import locality_probe

        self._probe = self._probe or locality_probe(self.model)
        return self._probe

    def held_out_ids(self) -> list:
        """The held-out preserve texts' ids, read once (the strength and distillation stages)."""
        from icl_lens.thought import preserve_texts, text_ids, with_bos

        if not self._held_out:
            self._held_out.extend(with_bos(self.model, text_ids(self.model, t))
                                  for t in preserve_texts(self.model, "held_out"))
        return self._held_out

    def answer_kl(self, task: Task, queries, patch, **score) -> float:
        """KL(full ‖ patched) at the answer's positions (at most ``SCORE_ANSWER_TOKENS`` tokens, teacher forced), or
        with ``score`` at the last query token."""
        from icl_lens.thought import DEFAULT_QUERY_PREFIX, answer_kl

        score = score or {"query_prefix": DEFAULT_QUERY_PREFIX, "answer_tokens": SCORE_ANSWER_TOKENS}
        return answer_kl(self.model, task.instruction, queries, patch, **score)

    def answer_selection(self, task: Task, setting: dict) -> dict:
        """Fit on the first train queries, score the next ones at the answer's positions (cached); without the
        preserve term unless ``setting`` names it (the stages before the preserve stage, as they were run)."""
        from icl_lens.thought import DEFAULT_QUERY_PREFIX, thought_patch

        fit = self.fit.replace(**{"preserve_strength": 0.0, **setting})
        key = row_key("answers", fit, task.name)
        if key not in self.results:
            queries, val = selection_split(task, self.select_fit, self.select_validate)
            t0 = time.perf_counter()
            patch = thought_patch(self.model, task.instruction, queries, fit)
            self.store(key, {
                **setting, "task": task.name, "n_fit": len(queries), "n_validate": len(val),
                "validation_kl": self.answer_kl(task, val, patch), "calibration_kl": self.answer_kl(task, queries, patch),
                "validation_last_token_kl": self.answer_kl(task, val, patch, query_prefix=DEFAULT_QUERY_PREFIX),
                "seconds": time.perf_counter() - t0, "fit": fit.to_dict()})
        return self.results[key]

    # ---- the jobs
    def table(self, task: Task) -> None:
        """Every condition, in one run with the default, on the test queries and the fresh ones (scored once)."""
        from icl_lens.thought import CONDITIONS, evaluate_thought

        key, fresh = row_key("table", self.fit, task.name), row_key("fresh", self.fit, task.name)
        if current_row(self.results, key) and fresh in self.results:
            return
        old = self.results.get(key)  # computed with this fit, its distillation at another rate
        conditions = tuple(c for c in CONDITIONS
                           if c != "distilled" or self.distill_on is None or task.name in self.distill_on)
        new = evaluate_thought(self.model, task, self.fit, n_train=self.n_train, locality=self.probe(), fresh=True,
                               conditions=conditions)
        if old is not None:  # keep the earlier row
            self.store(f"earlier/{setting_name(old)}/{task.name}", old)
        self.store(key, new.to_dict(outcomes=True))
        self.store(fresh, new.fresh.to_dict(outcomes=True))

    def paper(self, task: Task) -> None:
        """The paper's settings beside the default, same train and test queries."""
        from icl_lens.thought import evaluate_thought

        fit = paper_fit()
        if (key := row_key("paper", fit, task.name)) not in self.results:
            res = evaluate_thought(self.model, task, fit, n_train=self.n_train, locality=self.probe(),
                                   conditions=("none", "patched"))
            self.store(key, res.to_dict(outcomes=True))

    def compose(self, group: tuple[str, ...]) -> None:
        """Two ways to apply several tasks at once, both always run and reported side by side: the single patches'
        edits added, and one joint fit over all their calibration rows."""
        from icl_lens.thought import ThoughtPatch, evaluate_edit, thought_patch, thought_patch_joint

        key = row_key("compose", self.fit, "+".join(group))
        if current_row(self.results, key) and "joint" in self.results[key]:
            return
        tasks, prefix, model = [load_task(t) for t in group], self.fit.query_prefix, self.model
        calibration = [(t.instruction, [q for q, _ in t.train[:self.n_train]]) for t in tasks]
        if not current_row(self.results, key):
            t0 = time.perf_counter()
            singles = [thought_patch(model, instruction, queries, self.fit) for instruction, queries in calibration]
            patch = ThoughtPatch.composed(singles)
            seconds = time.perf_counter() - t0
            self.store(key, {
                **self.default, "tasks": list(group), "seconds": {"patched": seconds},
                "locality": self.probe().measure(patch).to_dict(),
                **{per_task_key(split): {
                    t.name: {**evaluate_edit(model, t, patch, query_prefix=prefix, split=split),
                             "single": {**evaluate_edit(model, t, p, query_prefix=prefix, split=split),
                                        "locality": self.probe().measure(p).to_dict()}}
                    for t, p in zip(tasks, singles)} for split in SPLITS},
                "fit": self.fit.to_dict()})
        t0 = time.perf_counter()
        joint = thought_patch_joint(model, calibration, self.fit)
        seconds = time.perf_counter() - t0
        self.store(key, {**self.results[key], "joint": {
            "seconds": {"patched": seconds}, "locality": self.probe().measure(joint).to_dict(),
            **{per_task_key(split): {t.name: evaluate_edit(model, t, joint, query_prefix=prefix, split=split)
                                     for t in tasks} for split in SPLITS}}})

    def curve(self, task: Task, n: int) -> None:
        """Test accuracy of the default fitted on the first ``n`` train queries."""
        from icl_lens.thought import evaluate_thought

        if n <= len(task.train) and (key := row_key("curve", self.fit, task.name, n)) not in self.results:
            res = evaluate_thought(self.model, task, self.fit, n_train=n, conditions=("patched",), locality=False)
            self.store(key, res.to_dict(outcomes=True))

    def select(self, task: Task, i: int) -> None:
        """First selection stage: setting ``i`` of the grid (then the extra settings), without answer rows or the
        preserve term, scored by the KL at the last query token."""
        from icl_lens.thought import thought_patch

        setting = self.select_settings[i]
        fit = self.fit.replace(**{"answer_tokens": 0, "preserve_strength": 0.0, **setting})
        if (key := row_key("select", fit, task.name)) not in self.results:
            queries, val = selection_split(task, self.select_fit, self.select_validate)
            t0 = time.perf_counter()
            patch = thought_patch(self.model, task.instruction, queries, fit)
            last = {"query_prefix": setting["query_prefix"]}
            self.store(key, {**setting, "task": task.name, "n_fit": len(queries), "n_validate": len(val),
                             "validation_kl": self.answer_kl(task, val, patch, **last),
                             "calibration_kl": self.answer_kl(task, queries, patch, **last),
                             "seconds": time.perf_counter() - t0, "fit": fit.to_dict()})

    def answers(self, task: Task, i: int) -> None:
        """Second stage: the first stage's winner with answer rows (``SELECT_ANSWER_GRID[i]``)."""
        self.answer_selection(task, self.stage_one | self.select_answer_grid[i])

    def strength(self, task: Task, strength: float) -> None:
        """Third stage: the default at one preserve strength (the shipped preserve texts' fit half), scored by the
        answer KL and by the KL on the held-out preserve texts."""
        self.preserve_stage("strength", task, self.fit.replace(preserve_strength=strength))

    def null_space(self, task: Task, i: int) -> None:
        """The null-space stage (issue 38): the default with ``NULL_SPACE_GRID[i]`` (the AlphaEdit projection's
        share of the preserved keys' trace, with or without the penalty), scored like the strength stage; the rule
        (:func:`~experiments.thought.method.choose_null_space`) compares it with the default's strength row."""
        setting = self.null_space_grid[i]  # {}: the default, the strength stage's row
        self.preserve_stage("null_space" if setting else "strength", task, self.fit.replace(**setting))

    def preserve_stage(self, job: str, task: Task, fit) -> None:
        """Fit ``fit`` on the selection split, score the held-out train queries' answer KL and the KL on the
        held-out preserve texts (cached under ``job``)."""
        from icl_lens.thought import PRESERVE_SET, text_kl, thought_patch

        if (key := row_key(job, fit, PRESERVE_SET, task.name)) in self.results:
            return
        queries, val = selection_split(task, self.select_fit, self.select_validate)
        t0 = time.perf_counter()
        patch = thought_patch(self.model, task.instruction, queries, fit)
        seconds = time.perf_counter() - t0
        self.store(key, {
            **default_setting(fit), "null_space": fit.null_space, "preserve_set": PRESERVE_SET, "task": task.name,
            "n_fit": len(queries), "n_validate": len(val), "n_texts_scored": len(self.held_out_ids()),
            "validation_kl": self.answer_kl(task, val, patch),
            "text_kl": text_kl(self.model, self.held_out_ids(), patch), "seconds": seconds, "fit": fit.to_dict()})

    def distill(self, task: Task, lr: float) -> None:
        """Context distillation's learning rate: distil at ``lr``, score like the selection stages."""
        from icl_lens.thought import PRESERVE_SET, distill_patch, text_kl

        if (key := row_key("distill", self.fit, PRESERVE_SET, f"{lr:g}", task.name)) in self.results:
            return
        queries, val = selection_split(task, self.select_fit, self.select_validate)
        steps = {} if self.distill_steps is None else {"steps": self.distill_steps}
        t0 = time.perf_counter()
        patch = distill_patch(self.model, task.instruction, queries, self.fit, lr=lr, progress=False, **steps)
        seconds = time.perf_counter() - t0
        self.store(key, {"lr": lr, **patch.settings, "task": task.name, "n_fit": len(queries), "n_validate": len(val),
                         "validation_kl": self.answer_kl(task, val, patch),
                         "calibration_kl": self.answer_kl(task, queries, patch),
                         "text_kl": text_kl(self.model, self.held_out_ids(), patch), "seconds": seconds,
                         "fit": self.fit.to_dict()})

    def set_probe(self):
        """The probe of the locality set nobody tuned on (``experiments.thought.method.untouched_probe``), built once;
        only the ``untouched`` and ``equal_distill`` jobs read it."""
        from experiments.thought.method import untouched_probe

        self._set_probe = getattr(self, "_set_probe", None) or untouched_probe(self.model)
        return self._set_probe

    def untouched(self, task: Task) -> None:
        """Issue 38's locality rows: the default patch (fitted on the train queries as in the table) on the untouched
        locality set, beside random controls of the same norms (``CONTROL_SEEDS``) and the instruction itself
        prepended (the anchor)."""
        from experiments.thought.method import CONTROL_SEEDS
        from icl_lens.thought import thought_patch

        if (key := row_key("untouched", self.fit, task.name)) in self.results:
            return
        queries = [q for q, _ in task.train[:self.n_train]]
        t0 = time.perf_counter()
        patch = thought_patch(self.model, task.instruction, queries, self.fit)
        seconds = time.perf_counter() - t0
        probe = self.set_probe()
        self.store(key, {**self.default, "task": task.name, "n_fit": len(queries), "seconds": seconds,
                         "patched": probe.measure(patch).to_dict(),
                         "controls": {str(s): probe.measure(patch.random_control(s)).to_dict() for s in CONTROL_SEEDS},
                         "anchor": probe.anchor(task.instruction).to_dict(), "fit": self.fit.to_dict()})

    def equal_distill(self, task: Task) -> None:
        """Distillation on equal terms with the patch (issue 38): the same preserve texts as a KL term in its loss,
        its weight chosen by the patch's strength rule (``choose_strength``: answer KL within ``PRESERVE_SLACK`` of
        weight 0's, then the lowest held-out text KL) over ``DISTILL_PRESERVE_WEIGHTS`` on the selection split, each
        run early-stopped on the held-out objective; then distilled on all train queries at the chosen weight for
        the chosen number of steps and scored like the patch: accuracy on test and fresh queries, the untouched
        locality set, wall time."""
        from experiments.thought.method import DISTILL_PRESERVE_WEIGHTS, EVAL_EVERY
        from experiments.thought.settings import choose_strength
        from icl_lens.thought import PRESERVE_SET, distill_patch, evaluate_edit, text_kl

        if (key := row_key("equal_distill", self.fit, PRESERVE_SET, task.name)) in self.results:
            return
        queries, val = selection_split(task, self.select_fit, self.select_validate)
        steps = {} if self.distill_steps is None else {"steps": self.distill_steps}
        stage = {}
        for weight in DISTILL_PRESERVE_WEIGHTS:
            wkey = row_key("equal_distill_weight", self.fit, PRESERVE_SET, f"{weight:g}", task.name)
            if wkey not in self.results:
                t0 = time.perf_counter()
                patch = distill_patch(self.model, task.instruction, queries, self.fit, preserve_weight=weight,
                                      validation=val, held_out=self.held_out_ids(), eval_every=EVAL_EVERY,
                                      progress=False, **steps)
                seconds = time.perf_counter() - t0
                self.store(wkey, {**patch.settings, "task": task.name, "n_fit": len(queries), "n_validate": len(val),
                                  "validation_kl": self.answer_kl(task, val, patch),
                                  "text_kl": text_kl(self.model, self.held_out_ids(), patch), "seconds": seconds,
                                  "fit": self.fit.to_dict()})
            stage[weight] = self.results[wkey]
        weight = choose_strength({w: (r["validation_kl"], r["text_kl"]) for w, r in stage.items()})
        chosen_steps = stage[weight]["chosen_step"]
        train = [q for q, _ in task.train[:self.n_train]]
        t0 = time.perf_counter()
        patch = distill_patch(self.model, task.instruction, train, self.fit, preserve_weight=weight,
                              steps=chosen_steps, progress=False)
        seconds = time.perf_counter() - t0
        prefix = self.fit.query_prefix
        self.store(key, {
            **self.default, "task": task.name, "weight": weight, "steps": chosen_steps, "n_fit": len(train),
            "seconds": {"distilled": seconds, "selection": sum(r["seconds"] for r in stage.values())},
            "stage": {f"{w:g}": {k: r[k] for k in ("validation_kl", "text_kl", "chosen_step", "steps_run")}
                      for w, r in stage.items()},
            **{per_task_key(split): evaluate_edit(self.model, task, patch, query_prefix=prefix, split=split)
               for split in SPLITS},
            "untouched": self.set_probe().measure(patch).to_dict(), "settings": patch.settings,
            "fit": self.fit.to_dict()})

    def tuned(self, task: Task) -> None:
        """Where the default misses (or for the tasks asked for): the second-stage setting with the lowest held-out
        train answer KL on this task alone, evaluated on the test queries; and the instruction on the calibration
        queries themselves."""
        from icl_lens.thought import evaluate_thought

        name = task.name
        if self.tune_tasks is not None:
            tune = name in self.tune_tasks
        else:
            r = current_row(self.results, row_key("table", self.fit, name))
            tune = r is not None and target_verdict(r, r["correct"]["patched"]) == "missed"
        if not tune:
            return
        fit_default = {k: v for k, v in self.default.items() if k != "preserve_set"}
        if (key := row_key("tuned", self.fit, name)) not in self.results:
            candidates = [(self.default, fit_default), *((self.stage_one | g,) * 2 for g in self.select_answer_grid)]
            scores = {setting_name(named): (setting, self.answer_selection(task, setting)["validation_kl"])
                      for named, setting in candidates}
            chosen_name, (chosen, _) = min(scores.items(), key=lambda item: item[1][1])
            t0 = time.perf_counter()
            res = (evaluate_thought(self.model, task, n_train=self.n_train, locality=self.probe(),
                                    conditions=("patched",), **chosen).to_dict(outcomes=True)
                   if chosen is not fit_default else {})  # the default is this task's lowest
            self.store(key, {**self.default, "task": name, "chosen": chosen, "chosen_name": chosen_name,
                             "result": res, "validation_kl": {k: kl for k, (_, kl) in scores.items()},
                             "seconds": time.perf_counter() - t0, "fit": self.fit.to_dict()})
        if (key := row_key("train", None, name)) not in self.results:  # the instruction on the calibration queries
            on_train = Task(task.name, task.instruction, task.train, task.train)
            self.store(key, evaluate_thought(self.model, on_train, conditions=("none", "full"),
                                             locality=False).to_dict(outcomes=True))

    def diagnose(self, task: Task) -> None:
        """Per-layer divergence and attention to BOS / position 1: unpatched, paper patch, default patch."""
        from icl_lens.thought import DEFAULT_QUERY_PREFIX, diagnose, thought_patch

        if (key := row_key("diagnose", self.fit, task.name)) in self.results:
            return
        queries = {"train": [q for q, _ in task.train], "test": [q for q, _ in task.test]}
        frames = {}
        settings = (("unpatched, no prefix", None, ""), ("unpatched, default prefix", None, None),
                    ("paper patch", paper_fit(), ""), ("default patch", self.fit, None))
        for label, fit, prefix in settings:
            patch = None if fit is None else thought_patch(self.model, task.instruction, queries["train"], fit)
            prefix = patch.query_prefix if patch is not None else (DEFAULT_QUERY_PREFIX if prefix is None else prefix)
            for split, qs in queries.items():
                frames[f"{label}/{split}"] = diagnose(self.model, task.instruction, qs, patch,
                                                      query_prefix=prefix).to_frame().to_dict(orient="list")
        self.store(key, frames)


def job_list(tasks: list[str], curve_tasks: list[str], *, paper_tasks: list[str] | None = None,
             compose_groups=COMPOSE_GROUPS, strengths=PRESERVE_STRENGTHS, sizes=SIZES, select: bool = False,
             select_tasks=SELECT_TASKS, n_select: int = len(SELECT_GRID), n_extra: int = len(SELECT_EXTRA),
             n_answers: int = len(SELECT_ANSWER_GRID), diagnose_task: str | None = None, table: bool = True,
             distill_tasks=DISTILL_TASKS, distill_lrs=DISTILL_LRS, n_null_space: int = 0,
             method_tasks=(), equal_distill_tasks=None) -> list[tuple[str, str | None, object]]:
    """``(job, task, argument)`` in the order a run takes them: composed patches first (the cheapest), each task's
    table row with its paper row right after, the curves, the tunings; then the selection stages; the diagnosis.
    ``equal_distill_tasks``: where distillation on equal terms runs (None: ``method_tasks``)."""
    jobs: list[tuple[str, str | None, object]] = []
    if table:
        jobs += [("compose", None, group) for group in compose_groups]
        for name in tasks:
            jobs += [("table", name, None)] + ([("paper", name, None)] if paper_tasks is None or name in paper_tasks
                                               else [])
        jobs += [("curve", name, n) for name in tasks if name in curve_tasks for n in sizes]
        jobs += [("tuned", name, None) for name in tasks]
    if select:
        jobs += [("select", name, i) for name in select_tasks for i in range(n_select)]
        jobs += [("select", select_tasks[0], n_select + i) for i in range(n_extra)]
        jobs += [("answers", name, i) for name in select_tasks for i in range(n_answers)]
        jobs += [("strength", name, strength) for name in select_tasks for strength in strengths]
        jobs += [("distill", name, lr) for name in distill_tasks for lr in distill_lrs]
        jobs += [("null_space", name, i) for name in select_tasks for i in range(n_null_space)]
    # Issue 38's method rows (--method): the untouched locality set, then distillation on equal terms.
    jobs += [("untouched", name, None) for name in method_tasks]
    jobs += [("equal_distill", name, None)
             for name in (method_tasks if equal_distill_tasks is None else equal_distill_tasks)]
    if diagnose_task:
        jobs += [("diagnose", diagnose_task, None)]
    return jobs


def run_model(model_name: str, tasks: list[str], curve_tasks: list[str], out: Path, run: str, *,
              paper_tasks: list[str] | None = None, compose_groups=COMPOSE_GROUPS, strengths=PRESERVE_STRENGTHS,
              n_train: int | None = None, sizes=SIZES, select: bool = False, select_tasks=SELECT_TASKS,
              select_grid=SELECT_GRID, select_extra=SELECT_EXTRA, select_answer_grid=SELECT_ANSWER_GRID,
              select_fit: int = SELECT_FIT, select_validate: int = SELECT_VALIDATE,
              diagnose_task: str | None = None, table: bool = True, tune_tasks: list[str] | None = None,
              distill_tasks=DISTILL_TASKS, distill_lrs=DISTILL_LRS, distill_steps: int | None = None,
              distill_on: list[str] | None = None, null_space_grid=(), method_tasks=(),
              plan_distill: bool = False) -> None:
    """Evaluate what the cache lacks; ``run`` (command and machine) is recorded with the keys it computed.

    ``plan_distill``: distillation on equal terms runs on the tasks of ``method_tasks`` that
    :func:`~experiments.thought.method.equal_distill_plan` picks from the cached rows, in its order (else on every
    one of ``method_tasks``).

    ``distill_on``: the tasks whose table row also runs context distillation (None: every task); the others' rows
    have every condition but ``distilled`` (the report shows them as not measured)."""
    steps = ModelJobs(model_name, out, run, n_train=n_train, select_fit=select_fit, select_validate=select_validate,
                      select_grid=select_grid, select_extra=select_extra, select_answer_grid=select_answer_grid,
                      tune_tasks=tune_tasks, distill_steps=distill_steps, distill_on=distill_on,
                      null_space_grid=null_space_grid)
    jobs = job_list(tasks, curve_tasks, paper_tasks=paper_tasks, compose_groups=compose_groups, strengths=strengths,
                    sizes=sizes, select=select, select_tasks=select_tasks, n_select=len(select_grid),
                    n_extra=len(select_extra), n_answers=len(select_answer_grid), diagnose_task=diagnose_task,
                    table=table, distill_tasks=distill_tasks, distill_lrs=distill_lrs,
                    n_null_space=len(null_space_grid), method_tasks=method_tasks,
                    equal_distill_tasks=equal_distill_plan({model_name: steps.results}, model_name,
                                                           list(method_tasks)) if plan_distill else None)
    start = time.perf_counter()
    for job, name, arg in tqdm(jobs, desc=model_name):
        step = getattr(steps, job)
        task = load_task(name) if name is not None else None
        step(*(x for x in (task, arg) if x is not None))
    if jobs:
        steps.store(f"seconds/{time.strftime('%Y-%m-%dT%H:%M:%S')}", {"jobs": len(jobs), "seconds": time.perf_counter() - start})
