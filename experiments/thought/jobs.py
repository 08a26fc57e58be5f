"""What a run computes: the jobs of one model (table, paper, curve, preserve, tuned, selection stages,
diagnosis), each stored in the cache as soon as it is done."""
from __future__ import annotations

import json
import time
from pathlib import Path

from tqdm import tqdm

from experiments.thought.cache import cache_path, cached
from experiments.thought.settings import (
    DISTILL_LRS,
    DISTILL_TASKS,
    PAPER,
    COMPOSE_GROUPS,
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
    default_setting,
    is_current,
    setting_name,
    target_verdict,
)
from experiments.thought.targets import SPLITS, per_task_key
from icl_lens.thought.tasks import Task, load_task


def selection_split(task: Task, n_fit: int, n_validate: int) -> tuple[list[str], list[str]]:
    """The queries every selection stage reads: fit on the first ``n_fit`` train queries, score the next
    ``n_validate`` (never ``test``, never ``fresh``)."""
    return [q for q, _ in task.train[:n_fit]], [q for q, _ in task.train[n_fit:n_fit + n_validate]]


def strength_key(default: dict, strength: float, task: str) -> str:
    """The cache key of one third-stage result: the preserve set, the default at ``strength``, the task."""
    from icl_lens.thought import PRESERVE_SET

    setting = default | {"preserve_strength": strength, "preserve_set": PRESERVE_SET}
    return f"strength/{PRESERVE_SET}/{setting_name(setting)}/{task}"


def run_model(model_name: str, tasks: list[str], curve_tasks: list[str], out: Path, run: str, *,
              paper_tasks: list[str] | None = None, compose_groups=COMPOSE_GROUPS, strengths=PRESERVE_STRENGTHS,
              n_train: int | None = None, sizes=SIZES, select: bool = False, select_tasks=SELECT_TASKS,
              select_grid=SELECT_GRID, select_extra=SELECT_EXTRA, select_answer_grid=SELECT_ANSWER_GRID,
              select_fit: int = SELECT_FIT, select_validate: int = SELECT_VALIDATE,
              diagnose_task: str | None = None, table: bool = True, tune_tasks: list[str] | None = None,
              distill_tasks=DISTILL_TASKS, distill_lrs=DISTILL_LRS, distill_steps: int | None = None,
              distill_on: list[str] | None = None) -> None:
    """Evaluate what the cache lacks; ``run`` (command and machine) is recorded with the keys it computed.

    ``distill_on``: the tasks whose table row also runs context distillation (None: every task); the others' rows
    have every condition but ``distilled`` (the report shows them as not measured)."""
    from icl_lens.model import load_model
    from icl_lens.thought import text_ids, with_bos
    from icl_lens.thought import diagnose
    from icl_lens.thought import answer_kl, text_kl
    from icl_lens.thought import evaluate_thought
    from icl_lens.thought import CONDITIONS, DEFAULT_QUERY_PREFIX
    from icl_lens.thought import distill_patch
    from icl_lens.thought import evaluate_edit
    from icl_lens.thought import thought_patch, thought_patch_joint
    from icl_lens.thought import locality_probe
    from icl_lens.thought import PRESERVE_SET, preserve_texts
    from icl_lens.thought import ThoughtPatch

    default = default_setting()
    fit_default = {k: v for k, v in default.items() if k != "preserve_set"}  # thought_patch's keyword arguments
    stage_one = {**STAGE_ONE, "answer_tokens": 0}
    cache, results = cache_path(out, model_name), cached(out, model_name)
    model = load_model(model_name)
    probe = None

    def store(key, value):
        results[key] = value
        runs = results.setdefault("runs", {})
        runs[run] = runs.get(run, []) + [key]
        cache.write_text(json.dumps(results, indent=1))

    jobs = []
    if table:  # composed patches first (the cheapest), the main table (with the paper's settings beside each task), curves
        jobs += [("compose", None, group) for group in compose_groups]
        for name in tasks:  # each task's paper row right after its table row
            jobs += [("table", name, None)] + ([("paper", name, None)] if paper_tasks is None or name in paper_tasks
                                               else [])
        jobs += [("curve", name, n) for name in tasks if name in curve_tasks for n in sizes]
        jobs += [("tuned", name, None) for name in tasks]
    if select:
        jobs += [("select", name, i) for name in select_tasks for i in range(len(select_grid))]
        jobs += [("select", select_tasks[0], len(select_grid) + i) for i in range(len(select_extra))]
        jobs += [("answers", name, i) for name in select_tasks for i in range(len(select_answer_grid))]
        jobs += [("strength", name, strength) for name in select_tasks for strength in strengths]
        jobs += [("distill", name, lr) for name in distill_tasks for lr in distill_lrs]
    if diagnose_task:
        jobs += [("diagnose", diagnose_task, None)]

    score = {"query_prefix": DEFAULT_QUERY_PREFIX, "answer_tokens": SCORE_ANSWER_TOKENS}  # at the answer's positions
    held_out: list = []  # the held-out preserve texts' ids, read once (the strength and distillation stages)

    def held_out_ids() -> list:
        if not held_out:
            held_out.extend(with_bos(model, text_ids(model, t)) for t in preserve_texts(model, "held_out"))
        return held_out

    def current(key: str) -> bool:  # cached, and computed with the current default settings (distillation's too)
        return is_current(results.get(key), default)

    def answer_selection(task, setting: dict) -> dict:
        """Fit on the first train queries, score the next ones at the answer's positions (cached); without the
        preserve term unless ``setting`` names it (the stages before the preserve stage, as they were run)."""
        key = f"answers/{setting_name(setting)}/{task.name}"
        if key not in results:
            fit, val = selection_split(task, select_fit, select_validate)
            t0 = time.perf_counter()
            patch = thought_patch(model, task.instruction, fit, **{"preserve_strength": 0.0, **setting})
            store(key, {
                **setting, "task": task.name, "n_fit": len(fit), "n_validate": len(val),
                "validation_kl": answer_kl(model, task.instruction, val, patch, **score),
                "calibration_kl": answer_kl(model, task.instruction, fit, patch, **score),
                "validation_last_token_kl": answer_kl(model, task.instruction, val, patch,
                                                      query_prefix=DEFAULT_QUERY_PREFIX),
                "seconds": time.perf_counter() - t0})
        return results[key]

    def tune(name: str) -> bool:  # tasks tuned on their own: the given ones, else the missed targets
        if tune_tasks is not None:
            return name in tune_tasks
        r = results.get(f"table/{name}")
        return r is not None and target_verdict(r, r["correct"]["patched"]) == "missed"

    start = time.perf_counter()
    for job, name, arg in tqdm(jobs, desc=model_name):
        task = load_task(name) if name is not None else None
        if job == "table" and not (current(f"table/{name}") and f"fresh/{name}" in results):
            # Every condition, in one run with the default, on the test queries and the fresh ones (scored once).
            probe = probe or locality_probe(model)
            old = results.get(f"table/{name}")
            conditions = tuple(c for c in CONDITIONS
                               if c != "distilled" or distill_on is None or name in distill_on)
            new = evaluate_thought(model, task, n_train=n_train, locality=probe, fresh=True, conditions=conditions)
            if old is not None:  # keep the earlier default's row
                store(f"earlier/{setting_name(old)}/{name}", old)
            store(f"table/{name}", new.to_dict(outcomes=True))
            store(f"fresh/{name}", new.fresh.to_dict(outcomes=True))
        elif job == "paper" and f"paper/{name}" not in results:
            probe = probe or locality_probe(model)
            res = evaluate_thought(model, task, n_train=n_train, locality=probe, conditions=("none", "patched"), **PAPER)
            store(f"paper/{name}", res.to_dict(outcomes=True))
        elif job == "compose" and not (current(key := f"compose/{'+'.join(arg)}") and "joint" in results[key]):
            # Two ways to apply several tasks at once, both always run and reported side by side: the single
            # patches' edits added, and one joint fit over all their calibration rows.
            probe = probe or locality_probe(model)
            group = [load_task(t) for t in arg]
            fit = fit_default  # preserve=None: the model's preserve texts, as every default fit reads them
            prefix = default["query_prefix"]
            calibration = [(t.instruction, [q for q, _ in t.train[:n_train]]) for t in group]
            if not current(key):
                t0 = time.perf_counter()
                singles = [thought_patch(model, instruction, queries, **fit) for instruction, queries in calibration]
                patch = ThoughtPatch.composed(singles)
                seconds = time.perf_counter() - t0
                store(key, {
                    **default, "tasks": list(arg), "seconds": {"patched": seconds},
                    "locality": probe.measure(patch).to_dict(),
                    **{per_task_key(split): {
                        t.name: {**evaluate_edit(model, t, patch, query_prefix=prefix, split=split),
                                 "single": {**evaluate_edit(model, t, p, query_prefix=prefix, split=split),
                                            "locality": probe.measure(p).to_dict()}}
                        for t, p in zip(group, singles)} for split in SPLITS}})
            t0 = time.perf_counter()
            joint = thought_patch_joint(model, calibration, **fit)
            seconds = time.perf_counter() - t0
            store(key, {**results[key], "joint": {
                "seconds": {"patched": seconds}, "locality": probe.measure(joint).to_dict(),
                **{per_task_key(split): {t.name: evaluate_edit(model, t, joint, query_prefix=prefix, split=split)
                                         for t in group} for split in SPLITS}}})
        elif job == "curve" and arg <= len(task.train) and not current(f"curve/{name}/{arg}"):
            res = evaluate_thought(model, task, n_train=arg, conditions=("patched",), locality=False)
            store(f"curve/{name}/{arg}", res.to_dict(outcomes=True))
        elif job == "select":
            setting = (*select_grid, *select_extra)[arg]
            key = f"select/{setting_name(setting)}/{name}"
            if key not in results:
                fit, val = selection_split(task, select_fit, select_validate)
                t0 = time.perf_counter()
                patch = thought_patch(model, task.instruction, fit,
                                      **{"answer_tokens": 0, "preserve_strength": 0.0, **setting})
                store(key, {**setting, "task": name, "n_fit": len(fit), "n_validate": len(val),
                            "validation_kl": answer_kl(model, task.instruction, val, patch,
                                                       query_prefix=setting["query_prefix"]),
                            "calibration_kl": answer_kl(model, task.instruction, fit, patch,
                                                        query_prefix=setting["query_prefix"]),
                            "seconds": time.perf_counter() - t0})
        elif job == "answers":
            answer_selection(task, stage_one | select_answer_grid[arg])
        elif job == "strength" and (key := strength_key(default, arg, name)) not in results:
            fit, val = selection_split(task, select_fit, select_validate)
            setting = fit_default | {"preserve_strength": arg}
            t0 = time.perf_counter()
            patch = thought_patch(model, task.instruction, fit, **setting,
                                  preserve=preserve_texts(model, "fit") if arg else ())
            seconds = time.perf_counter() - t0
            store(key, {
                **setting, "preserve_set": PRESERVE_SET, "task": name, "n_fit": len(fit), "n_validate": len(val),
                "n_texts_scored": len(held_out_ids()),
                "validation_kl": answer_kl(model, task.instruction, val, patch, **score),
                "text_kl": text_kl(model, held_out_ids(), patch), "seconds": seconds})
        elif job == "distill" and (key := f"distill/{arg:g}/{name}") not in results:
            fit, val = selection_split(task, select_fit, select_validate)
            steps = {} if distill_steps is None else {"steps": distill_steps}
            t0 = time.perf_counter()
            patch = distill_patch(model, task.instruction, fit, lr=arg, progress=False, **steps)
            seconds = time.perf_counter() - t0
            store(key, {"lr": arg, **patch.settings, "task": name, "n_fit": len(fit), "n_validate": len(val),
                        "validation_kl": answer_kl(model, task.instruction, val, patch, **score),
                        "calibration_kl": answer_kl(model, task.instruction, fit, patch, **score),
                        "text_kl": text_kl(model, held_out_ids(), patch), "seconds": seconds})
        elif job == "tuned" and tune(name):
            if not current(f"tuned/{name}"):
                candidates = [(default, fit_default), *((stage_one | g,) * 2 for g in select_answer_grid)]
                scores = {setting_name(named): (fit, answer_selection(task, fit)["validation_kl"])
                          for named, fit in candidates}
                chosen_name, (chosen, _) = min(scores.items(), key=lambda item: item[1][1])
                t0 = time.perf_counter()
                probe = probe or locality_probe(model)
                res = (evaluate_thought(model, task, n_train=n_train, locality=probe, conditions=("patched",),
                                        **chosen).to_dict(outcomes=True)
                       if chosen is not fit_default else {})  # the default is this task's lowest
                store(f"tuned/{name}", {**default, "task": name, "chosen": chosen, "chosen_name": chosen_name,
                                        "result": res,
                                        "validation_kl": {k: kl for k, (_, kl) in scores.items()},
                                        "seconds": time.perf_counter() - t0})
            if f"train/{name}" not in results:  # the instruction on the calibration queries themselves
                on_train = Task(task.name, task.instruction, task.train, task.train)
                store(f"train/{name}", evaluate_thought(model, on_train, conditions=("none", "full"),
                                                        locality=False).to_dict(outcomes=True))
        elif job == "diagnose" and f"diagnose/{name}" not in results:
            queries = {"train": [q for q, _ in task.train], "test": [q for q, _ in task.test]}
            frames = {}
            settings = (("unpatched, no prefix", None, ""), ("unpatched, default prefix", None, None),
                        ("paper patch", PAPER, ""), ("default patch", {}, None))
            for label, setting, prefix in settings:
                patch = None if setting is None else thought_patch(model, task.instruction, queries["train"], **setting)
                prefix = patch.query_prefix if patch is not None else (DEFAULT_QUERY_PREFIX if prefix is None else prefix)
                for split, qs in queries.items():
                    frames[f"{label}/{split}"] = diagnose(model, task.instruction, qs, patch,
                                                          query_prefix=prefix).to_frame().to_dict(orient="list")
            store(f"diagnose/{name}", frames)
    if jobs:
        store(f"seconds/{time.strftime('%Y-%m-%dT%H:%M:%S')}", {"jobs": len(jobs), "seconds": time.perf_counter() - start})
