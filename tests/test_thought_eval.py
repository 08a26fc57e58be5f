"""Thought-patch evaluation pieces: task builder, down-projection edit, steering vector, locality,
intervals, and the eval command in --quick mode."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from icl_lens import thought_patch
from icl_lens.model._block_family import block_family, down_weight
from icl_lens.model._weight_edits import MLPEdit, edits_applied
from icl_lens.thought._instruction_batches import prefix_ids, text_ids, with_bos
from icl_lens.thought._locality import load_locality
from icl_lens.thought.tasks import SHIPPED_TASKS, TASK_DIR, load_task

INSTRUCTION = "Remember: the secret word is banana, and 7 follows 3.\n"


# --- task suite --------------------------------------------------------------------------------

def test_task_builder_is_deterministic_and_matches_the_committed_files():
    from experiments.build_tasks import extra_tasks, task_line, tasks

    first, second = tasks(), tasks()
    assert json.dumps(first) == json.dumps(second)
    assert [t["name"] for t in first] == list(SHIPPED_TASKS)
    for t in first + extra_tasks():  # the committed .jsonl files are what the builder writes
        committed = (TASK_DIR / f"{t['name']}.jsonl").read_text(encoding="utf-8")
        assert committed == task_line(t), t["name"]
        assert json.loads(committed)["generated_by"] == "python -m experiments.build_tasks"


def test_add_prompt_does_not_teach_a_first_digit():
    """Issue 22: half of add's demonstrations are two-digit sums (starting with "1"), half are not; no first addend
    repeats, no answer repeats, and no second addend appears more than twice."""
    from collections import Counter

    demos = load_task("add").instruction.splitlines()[1:]
    assert len(demos) == 8 and sum(line.rsplit(" ", 1)[1].startswith("1") for line in demos) == 4
    sums = [tuple(int(x) for x in line.replace("=", "+").split(" + ")) for line in demos]
    assert all(a + b == c for a, b, c in sums)
    assert len({a for a, _, _ in sums}) == 8 and len({c for _, _, c in sums}) == 8
    assert max(Counter(b for _, b, _ in sums).values()) <= 2


def test_shipped_suite_has_ten_tasks_of_several_kinds_with_disjoint_splits():
    loaded = [load_task(name) for name in SHIPPED_TASKS]
    assert len(loaded) >= 10
    assert {t.kind for t in loaded} >= {"arithmetic", "word transformation", "translation", "factual lookup", "format"}
    for t in loaded:
        assert len(t.test) >= 24 and len(t.train) == 32, t.name
        queries = [q for q, _ in t.train + t.test]
        assert len(set(queries)) == len(queries), t.name  # no query in two splits
        demos = {line.rsplit(" ", 1)[0] for line in t.instruction.splitlines()[1:]}
        assert not demos & set(queries), t.name  # no demonstration is a train or test query
        for q, a in t.test:
            assert f"{q} {a}\n" not in t.instruction


# Digests of each shipped task's instruction, train and test as they were when the fresh split came (issue 22):
# the reports were computed on them, so a rebuild must leave them as they are. add's instruction changed once since
# (its demonstrations, build_tasks.ADD_DEMOS; train and test as they were: ADD_SPLITS_DIGEST).
SPLIT_DIGESTS = {
    "add": "9aae58262faa1018", "plus_one": "b0e81a45be75bbff", "antonyms": "060b30bd79ef4cb0",
    "plural": "819ce5af19715079", "past_tense": "f9c55511e83487d2", "en_fr": "ba46669346cc14db",
    "en_es": "96293a20455e77d6", "en_de": "85f96d96eb7b0541", "capitals": "22393b6fc86a3968",
    "languages": "78cf6df2f3d53478", "uppercase": "8860534f9d85c822", "number_words": "8ce99bc914cc6a3b",
}


ADD_SPLITS_DIGEST = "41bc67c5e13de745"  # add's train and test, the same before and after its new demonstrations


def _split_digest(task: dict) -> str:
    import hashlib

    parts = [task["instruction"], task["train"], task["test"]]
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()[:16]


def _number_from_words(words: str) -> int:
    """An independent reading of number words (to check the builder's): "twenty-one thousand" -> 21000."""
    units = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
             "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
    tens = {w: 10 * i for i, w in enumerate(["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty",
                                             "ninety"], 2)}
    total = 0
    for word in words.split():
        if word == "hundred":
            total *= 100
        elif word == "thousand":
            total *= 1000
        else:
            total += sum(units.index(w) if w in units else tens[w] for w in word.split("-"))
    return total


def test_fresh_splits_leave_the_other_splits_and_are_disjoint_and_right():
    """Issue 22: every shipped task has a fresh split of N_FRESH pairs (FEWER_FRESH names the tasks where fewer
    clean pairs exist), built without touching instruction, train or test; no fresh query (for word
    transformations no word, for capitals no capital) is in another part; generated answers are right."""
    from experiments.build_tasks import FEWER_FRESH, N_FRESH, tasks

    built = {t["name"]: t for t in tasks()}
    assert {name: _split_digest(built[name]) for name in SHIPPED_TASKS} == SPLIT_DIGESTS
    import hashlib

    add = json.dumps([built["add"]["train"], built["add"]["test"]], ensure_ascii=False).encode()
    assert hashlib.sha256(add).hexdigest()[:16] == ADD_SPLITS_DIGEST
    assert set(FEWER_FRESH) <= set(SHIPPED_TASKS)
    for name in SHIPPED_TASKS:
        t = load_task(name)
        assert t.fresh == tuple((d["query"], d["answer"]) for d in built[name]["fresh"])
        n = len(t.fresh)
        assert (n == N_FRESH) if name not in FEWER_FRESH else (0 < n < N_FRESH), (name, n)
        lines = t.instruction.splitlines()[1:]  # "query: answer" (answers of several words) or "a + b = c"
        demos = [(line.split(": ", 1)[0] + ":", line.split(": ", 1)[1]) if ": " in line
                 else tuple(line.rsplit(" ", 1)) for line in lines]
        others = demos + list(t.train) + list(t.test)
        fresh_queries = [q for q, _ in t.fresh]
        assert len(set(fresh_queries)) == n, name
        assert not set(fresh_queries) & {q for q, _ in others}, name
        ending = t.train[0][0][-1]  # ":" or "=": fresh queries are written as the others are
        assert all(q.endswith(ending) and a == a.strip() and a for q, a in t.fresh), name
        if t.kind == "word transformation":
            words = lambda pairs: {w for q, a in pairs for w in (q.rstrip(":") + " " + a).split()}  # noqa: E731
            assert not words(t.fresh) & words(others), name
        if name == "capitals":
            assert not {a for _, a in t.fresh} & {a for _, a in others}
        for q, a in t.fresh:
            key = q.rstrip(":=").strip()
            if name == "add":
                x, y = (int(v) for v in key.split(" + "))
                assert a == str(x + y) and min(x, y) <= 9
            elif name == "plus_one":
                assert a == str(int(key) + 1)
            elif name == "uppercase":
                assert a == key.upper() and key.islower()
            elif name == "number_words":
                assert _number_from_words(a) == int(key), (q, a)


def test_selection_reads_neither_test_nor_fresh():
    """Every selection stage (--select's grids, answer tokens, preserve strength; per-task tuning) reads its
    queries through selection_split: the same with or without a fresh split, and none of test or fresh."""
    from dataclasses import replace

    from experiments.thought.jobs import selection_split
    from experiments.thought.settings import SELECT_FIT, SELECT_VALIDATE

    for name in SHIPPED_TASKS:
        task = load_task(name)
        bare = replace(task, fresh=(), test=task.test[:1])
        fit, val = selection_split(task, SELECT_FIT, SELECT_VALIDATE)
        assert (fit, val) == selection_split(bare, SELECT_FIT, SELECT_VALIDATE), name
        assert len(fit) == SELECT_FIT and val
        assert not set(fit + val) & {q for q, _ in task.test + task.fresh}, name


def test_fresh_split_is_scored_with_the_same_edits(load):
    """evaluate_thought(fresh=True) scores the fresh queries with the very edits it scored the test queries with:
    its test result is the one without fresh, and its fresh patched answers are those of the same patch refitted and
    applied to the fresh queries (evaluate_edit, split="fresh"); a task without a fresh split is refused."""
    from dataclasses import replace

    from icl_lens.thought._evaluate import evaluate_edit, evaluate_thought

    model = load("tiny-llama")
    task = replace(load_task("capitals"), test=load_task("capitals").test[:6], fresh=load_task("capitals").fresh[:5])
    settings = dict(n_train=2, conditions=("none", "full", "patched"), locality=False)
    both = evaluate_thought(model, task, fresh=True, **settings)
    alone = evaluate_thought(model, task, **settings)
    assert alone.fresh is None and both.split == "test" and both.fresh.split == "fresh"
    assert both.outcomes == alone.outcomes and both.continuations == alone.continuations
    assert both.fresh.n_test == 5 and both.fresh.seconds is both.seconds
    from icl_lens.thought._preserve import preserve_texts

    patch = thought_patch(model, task.instruction, [q for q, _ in task.train[:2]], preserve=preserve_texts(model))
    again = evaluate_edit(model, task, patch, split="fresh")
    assert list(both.fresh.continuations["patched"]) == again["continuations"]
    assert both.fresh.to_dict()["split"] == "fresh" and both.fresh.to_dict()["n_test"] == 5
    with pytest.raises(ValueError, match="no fresh split"):
        evaluate_thought(model, replace(task, fresh=()), fresh=True, **settings)
    with pytest.raises(ValueError, match="split must be"):
        evaluate_edit(model, task, patch, split="train")


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_a_query_past_the_context_is_refused_before_any_fit(load, name):
    """Issue 43: a test query whose prompt plus answer passes the context ran silently past the trained positions
    (rotary: tiny-llama) or failed inside GPT-2's position embedding; now a PromptError names the query first."""
    import time
    from dataclasses import replace

    from icl_lens.model import PromptError
    from icl_lens.model._greedy import greedy_continuations
    from icl_lens.thought._evaluate import evaluate_edit, evaluate_thought
    from icl_lens.thought.tasks import Task

    model = load(name)
    n_ctx = model.cfg.n_ctx  # 256 (byte tokens)
    task = Task("long", "a: 1\n", (("a:", "1"),), (("b:", "2"), ("x" * (n_ctx - 4) + ":", "3")))
    start = time.perf_counter()
    with pytest.raises(PromptError, match=rf"task 'long': test query 1 takes {n_ctx - 1} tokens and up to 3 more are "
                                          rf"generated \({n_ctx + 2}\), past the context of '{name}' \({n_ctx} tokens\)"):
        evaluate_thought(model, task, locality=False)
    assert time.perf_counter() - start < 2  # before the fit
    fits = replace(task, test=(("b:", "2"), ("x" * (n_ctx - 9) + ":", "3")))  # fits alone, not after the instruction
    with pytest.raises(PromptError, match="test query 1 with the instruction in context takes"):
        evaluate_thought(model, fits, conditions=("none", "full"), locality=False)
    assert evaluate_thought(model, fits, conditions=("none",), locality=False, preserve=()).n_test == 2
    with pytest.raises(PromptError, match="test query 1 takes"):
        evaluate_edit(model, task, thought_patch(model, task.instruction, ["a:"], preserve=()))
    with pytest.raises(PromptError, match=rf"prompt 0 has {n_ctx} tokens and up to 1 more"):
        greedy_continuations(model, [[1] * n_ctx], 1)


# --- the down-projection edit --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-gemma3"])
def test_down_projection_edit_equals_editing_the_weight(load, name):
    """ΔW_out = uᵀ v applied through hooks gives the logits of the model whose W_out was changed in place."""
    model = load(name, torch.float64)
    gen = torch.Generator().manual_seed(0)
    d_model, d_mlp = model.cfg.d_model, model.cfg.d_mlp
    u = torch.randn(3, d_model, generator=gen, dtype=torch.float64) * 0.05
    v = torch.randn(3, d_mlp, generator=gen, dtype=torch.float64) * 0.05
    ids = torch.tensor([with_bos(model, text_ids(model, "some words here"))])
    with torch.no_grad():
        base = model(ids)[0]
        with edits_applied(model, {1: MLPEdit(out_u=u, out_v=v)}):
            hooked = model(ids)[0]
        w = down_weight(model, 1)
        saved = w.detach().clone()
        try:
            w.add_(u.T @ v)
            edited = model(ids)[0]
        finally:
            w.copy_(saved)
    assert float((hooked - edited).abs().max() / edited.abs().max()) <= 1e-10
    assert float((hooked - base).abs().max()) > 1e-3
    with pytest.raises(ValueError):
        MLPEdit(out_u=u)


def test_factored_least_squares_is_ridge_regression():
    from icl_lens.core._least_squares import factored_least_squares, relative_ridge

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 11, generator=gen, dtype=torch.float64)
    t = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    lam = relative_ridge(x, 0.3)
    assert lam == pytest.approx(0.3 * float((x * x).sum()) / 11)
    u, v = factored_least_squares(t, x, ridge=lam)
    dense = t.T @ x @ torch.linalg.inv(x.T @ x + lam * torch.eye(11, dtype=torch.float64))  # [5, 11]
    assert torch.allclose(u.T @ v, dense, atol=1e-10)
    u0, v0 = factored_least_squares(t, x)
    assert torch.allclose(x @ (u0.T @ v0).T, t, atol=1e-10)  # n < d: interpolates


# --- steering vector -----------------------------------------------------------------------------

def test_steering_vector_is_the_mean_residual_difference_by_hand(load):
    from icl_lens.thought._steering import steering_vector

    model = load("tiny-llama", torch.float64)
    queries = ["ab:", "xyz:"]
    steer = steering_vector(model, INSTRUCTION, queries, query_prefix="\n")
    family = block_family(model)
    instr, pre = text_ids(model, INSTRUCTION), prefix_ids(model, "\n")
    diffs = {l: [] for l in range(model.cfg.n_layers)}
    for q in queries:  # one sequence at a time, no batching, no padding
        qi = text_ids(model, q)
        _, with_i = model.run_with_cache(torch.tensor([with_bos(model, instr + qi)]))
        _, alone = model.run_with_cache(torch.tensor([with_bos(model, pre + qi)]))
        for l in diffs:
            name = family.resid_post(l)
            diffs[l].append(with_i[name][0, -len(qi):] - alone[name][0, -len(qi):])
    for l, d in diffs.items():
        assert torch.allclose(steer.vectors[l], torch.cat(d).mean(0), atol=1e-10)
    # applied: the chosen block's output moves by exactly s at every position, nothing before it
    ids = torch.tensor([steer.prompt_ids("cd:")])
    name, before = family.resid_post(steer.layer), family.resid_pre(steer.layer)
    _, plain = model.run_with_cache(ids)
    with steer.applied():
        _, steered = model.run_with_cache(ids)
    assert torch.allclose(steered[name][0] - plain[name][0], steer.vectors[steer.layer].expand(ids.shape[1], -1), atol=1e-10)
    assert torch.equal(steered[before], plain[before])
    assert steer.layer == int(np.nanargmin(steer.train_kl.numpy()))
    assert list(steer.to_frame()["chosen"]).count(True) == 1


# --- locality --------------------------------------------------------------------------------------

def test_locality_is_zero_for_a_zero_patch_and_positive_for_a_real_one(load):
    from dataclasses import replace

    from icl_lens.thought._locality import locality_probe

    model = load("tiny-llama")
    data = load_locality()
    assert len(data.texts) >= 10 and len(data.other_prompts) >= 24
    probe = locality_probe(model)
    patch = thought_patch(model, INSTRUCTION, ["ab", "cd"])
    zero = replace(patch, maps=torch.zeros_like(patch.maps), vectors=torch.zeros_like(patch.vectors),
                   down_u=torch.zeros_like(patch.down_u), down_v=torch.zeros_like(patch.down_v))
    nothing = probe.measure(zero)
    assert nothing.kl == 0.0 and nothing.accuracy == 1.0 and nothing.n_prompts == len(data.other_prompts)
    assert probe.measure(None).kl == 0.0
    real = probe.measure(patch)
    assert real.kl > 1e-4 and real.n_positions == sum(len(t) for t in probe.texts)


def test_locality_file_is_validated(tmp_path):
    from icl_lens.thought.tasks import TaskFormatError

    bad = tmp_path / "loc.json"
    bad.write_text(json.dumps({"texts": ["a"], "other_task": {"name": "x", "instruction": "i\n", "prompts": []}}))
    with pytest.raises(TaskFormatError, match="non-empty"):
        load_locality(bad)
    bad.write_text("{")
    with pytest.raises(TaskFormatError, match="not a locality file"):
        load_locality(bad)
    other = {"name": "x", "instruction": "i\n", "prompts": ["p:"]}
    bad.write_text(json.dumps({"texts": ["a", "b"], "other_task": other, "preserve_texts": ["b"]}))
    with pytest.raises(TaskFormatError, match="must not repeat"):
        load_locality(bad)
    shipped = load_locality()
    assert len(shipped.preserve_texts) >= 10 and not set(shipped.preserve_texts) & set(shipped.texts)


# --- the eval command ---------------------------------------------------------------------------------

def test_eval_quick_writes_a_report_from_its_cache(tmp_path):
    from experiments.thought import run as ev
    from experiments.thought.cache import row_key
    from experiments.thought.settings import default_fit

    fit = default_fit()

    out = tmp_path / "eval_thought.md"
    assert ev.main(["--quick", "--out", str(out)]) == 0
    text = out.read_text()
    cache = json.loads((tmp_path / "eval_thought.tiny-llama.json").read_text())
    r = cache[row_key("table", fit, "capitals")]
    assert set(r["accuracy"]) == {"none", "full", "patched", "distilled", "control", "steering"}
    assert len(r["outcomes"]["patched"]) == r["n_test"] == 32 == len(r["continuations"]["distilled"])
    assert "| tiny-llama | capitals |" in text and "Before / after" in text and "locality KL" in text
    assert f"{r['locality_kl']['patched']:.3f}" in text
    assert row_key("curve", fit, "capitals", 2) in cache
    opening = text.split("**Issue 22's targets**", 1)[1].split("\n\n", 2)[1]  # the first table of the section
    assert text.index("**Issue 22's targets**") < text.index("Method (")
    assert opening.count("| tiny-llama | fresh (scored once) |") == 5 == opening.count("| tiny-llama | test |")
    assert "against distillation" in opening and "two tasks" in opening
    fresh = cache[row_key("fresh", fit, "capitals")]  # the fresh split, scored by the same run with the same edits
    assert fresh["split"] == "fresh" and fresh["n_test"] == len(load_task("capitals").fresh) == len(
        fresh["outcomes"]["patched"]) and fresh["locality_kl"] == r["locality_kl"] and fresh["seconds"] == r["seconds"]
    assert "**Fresh queries, scored once**" in text and f"| tiny-llama | capitals (selection) | in range | {fresh['n_test']} |" in text
    assert "two tasks at once (edits added)" in opening and "two tasks at once (one joint fit)" in opening
    assert "**Against context distillation**" in text and f"{r['seconds']['distilled']:.0f} |" in text
    both = cache[row_key("compose", fit, "capitals+capitals")]
    assert both["per_task"]["capitals"]["n_test"] == 32 and "**Composed patches** (fresh" in text
    assert both["per_task_fresh"]["capitals"]["n_test"] == fresh["n_test"] == both["joint"]["per_task_fresh"][
        "capitals"]["n_test"]
    assert both["joint"]["per_task"]["capitals"]["n_test"] == 32 and both["joint"]["locality"]["n_prompts"] == 32
    same = sum(p == f for p, f in zip(r["answers"]["patched"], r["answers"]["full"]))
    assert r["agreement_with_full"]["patched"] == same / 32
    assert "**Answer by answer against the full instruction**" in text and f"| tiny-llama | capitals | " \
        f"{100 * r['accuracy']['full']:.0f}% [" in text and f"| {same}/32 |" in text

    assert ev.main(["--quick", "--select-only", "--out", str(out)]) == 0  # with the second stage: answer tokens
    cache = json.loads((tmp_path / "eval_thought.tiny-llama.json").read_text())
    text = out.read_text()
    assert {0, 2} <= {v["answer_tokens"] for k, v in cache.items() if k.startswith("answers/")}
    tuned = cache[row_key("tuned", fit, "capitals")]  # --quick tunes its one task whatever the table says
    assert len(tuned["validation_kl"]) == 3 and tuned["chosen_name"] == min(tuned["validation_kl"],
                                                                           key=tuned["validation_kl"].get)
    assert "**Tuned per task**" in text
    on_train = cache["train/capitals"]  # the instruction on the calibration queries themselves
    assert on_train["n_test"] == len(load_task("capitals").train) and set(on_train["accuracy"]) == {"none", "full"}
    third = {v["preserve_strength"]: v for k, v in cache.items() if k.startswith("strength/")}  # third stage
    assert set(third) == {0.0, 1.0} and third[1.0]["text_kl"] < third[0.0]["text_kl"]  # the penalty keeps the samples
    null = [v for k, v in cache.items() if k.startswith("null_space/")]  # issue 38: the null-space stage, in --select
    assert [v["null_space"] for v in null] == [0.01] and null[0]["fit"]["null_space"] == 0.01
    assert {v["preserve_set"] for v in third.values()} == {"samples+few-shot"}
    lrs = {v["lr"]: v for k, v in cache.items() if k.startswith("distill/")}  # distillation's learning rate
    assert set(lrs) == {1e-4, 1e-3} and all(v["steps"] == 2 and v["validation_kl"] > 0 for v in lrs.values())
    assert "**Distillation's learning rate**" in text and f"By the rule: **{min(lrs, key=lambda k: lrs[k]['validation_kl']):g}**" in text
    assert "**Preserve strength** (third stage" in text and f"| {third[1.0]['text_kl']:.4f} | 1 |" in text
    assert "By the rule: strength **" in text
    assert "**Answer-token rows**" in text and "| both+down, ridge 2, prefix '\\n', answer tokens 2 |" in text


def test_a_changed_default_is_recomputed_not_read(tmp_path, monkeypatch):
    """Every cached row is keyed by the ThoughtFit it was computed with and carries it: a run with another default
    computes its own rows (the first default's stay as they were, under their own keys) instead of reading them.
    (The selection stage: the cheapest job whose fit inherits the default's other settings.)"""
    from experiments.thought import jobs
    from experiments.thought.cache import cached, row_key
    from experiments.thought.settings import SELECT_GRID
    from icl_lens.thought import ThoughtFit

    out, fit = tmp_path / "eval_thought.md", ThoughtFit()
    common = dict(table=False, select=True, select_tasks=["capitals"], select_grid=SELECT_GRID[:1], select_extra=(),
                  select_answer_grid=(), strengths=(), distill_lrs=(), select_fit=3, select_validate=2)

    def computed(run: str) -> tuple[dict, list[str]]:
        results = cached(out, "tiny-llama")
        return results, [k for k in results["runs"].get(run, []) if not k.startswith("seconds/")]

    def select_key(default: ThoughtFit) -> str:
        return row_key("select", default.replace(answer_tokens=0, preserve_strength=0.0, **SELECT_GRID[0]), "capitals")

    jobs.run_model("tiny-llama", [], [], out, "first", **common)
    first, keys = computed("first")
    assert keys == [select_key(fit)] and first[keys[0]]["fit"]["eta"] == 1.0
    jobs.run_model("tiny-llama", [], [], out, "again", **common)
    assert computed("again")[1] == []  # the same default: its row is read back
    changed = fit.replace(eta=0.5)
    monkeypatch.setattr(jobs, "default_fit", lambda: changed)  # a new documented default
    jobs.run_model("tiny-llama", [], [], out, "second", **common)
    second, new = computed("second")
    assert new == [select_key(changed)] != keys and second[new[0]]["fit"]["eta"] == 0.5
    assert second[keys[0]] == first[keys[0]]  # the earlier default's row is kept, not overwritten


# --- diagnosis ------------------------------------------------------------------------------------

def test_diagnosis_divergence_vanishes_for_the_exact_patch(load):
    """One single-token query fitted exactly: the patched query-alone pass matches the contextual one at every
    layer (divergence ≈ 0); unpatched it does not; attention rows are probabilities."""
    from icl_lens.thought._diagnose import diagnose

    model = load("tiny-llama", torch.float64)
    patch = thought_patch(model, INSTRUCTION, ["q"], kind="both+down", ridge=0.0, query_prefix="\n", preserve=())
    exact = diagnose(model, INSTRUCTION, ["q"], patch, query_prefix="\n")
    assert float(exact.divergence.max()) <= 1e-9
    plain = diagnose(model, INSTRUCTION, ["q"], None, query_prefix="\n")
    assert float(plain.divergence.max()) > 1e-2
    total = plain.attn_bos + plain.attn_pos1 + plain.attn_qfirst  # [BOS, "\n", q]: every key
    assert torch.allclose(total, torch.ones_like(total))
    frame = exact.to_frame()
    assert len(frame) == model.cfg.n_layers and "norm_qfirst_context" in frame


# --- greedy decoding with the key/value cache -----------------------------------------------------

def _greedy_without_cache(model, prompt: list[int], n: int) -> list[int]:
    """Reference: the whole sequence re-run at every step, no cache."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1)[:, None]], dim=1)
    return ids[0, len(prompt):].tolist()


def test_greedy_steps_unembed_their_last_rows_once(load, monkeypatch):
    """Issue 41: each greedy step's forward stops at the unembedding's input and its last rows go through
    ``unembedded`` together (a batch of few rows: one read of the unembedding's weights, not one a row), the same
    tokens as the logits of a forward without a cache. ``feed_last``'s extra forward (read by hooks only) stops
    before the unembedding."""
    import icl_lens.model._greedy as greedy

    model = load("tiny-gemma2", torch.float64)  # soft-capped logits
    prompts = [[1, 40, 41], [1, 50, 51], [1, 60, 61, 62]]
    rows, unembedded = [], greedy.unembedded
    monkeypatch.setattr(greedy, "unembedded", lambda m, h: rows.append(h.shape[0]) or unembedded(m, h))
    head, seen = model.unembed.original_component, []
    head.forward = lambda x, forward=head.forward: seen.append(x.shape) or forward(x)
    try:
        out = greedy.greedy_continuations(model, prompts, 4)
        assert rows == [2] * 4 + [1] * 4 and seen == []  # per step, the batch's rows at once; the module never ran
        rows.clear()
        fed = greedy.greedy_continuations(model, prompts, 4, feed_last=True)  # one more forward, for its reads only
        assert fed == out and rows == [2] * 4 + [1] * 4 and seen == []  # it stops before the unembedding
    finally:
        del head.forward
    assert out == [_greedy_without_cache(model, p, 4) for p in prompts]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_greedy_with_cache_equals_decoding_without_it_under_a_thought_patch(load, name):
    """Token for token, prompts of two lengths batched, with a thought patch (matrix, vector, down edit) applied:
    the cached keys/values were computed under the patch, so the cache changes nothing."""
    from icl_lens.model._greedy import greedy_continuations

    model = load(name, torch.float64)
    patch = thought_patch(model, INSTRUCTION, ["ab", "cd ef"])
    prompts = [patch.prompt_ids(q) for q in ("ab", "xyz", "cd ef", "gh")]
    n = 6
    with patch.applied():
        cached = greedy_continuations(model, prompts, n, batch_size=2)
        plain = [_greedy_without_cache(model, p, n) for p in prompts]
    assert cached == plain
    assert all(len(c) == n for c in cached)
    unpatched = [_greedy_without_cache(model, p, n) for p in prompts]
    assert unpatched != plain  # the patch changes what is generated, so the comparison above can fail


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_greedy_runs_the_tokens_all_prompts_start_with_once(load, name, monkeypatch):
    """Issue 41: the instruction every prompt starts with goes through the model once, in a forward of its own,
    and each batch starts from its keys and values; the same tokens as decoding without a cache, with a thought
    patch applied too (its edits act on the shared forward), and the same reads at the query and answer tokens
    as with every prompt run whole, though two queries start alike (the query is never shared)."""
    import icl_lens.model._greedy as greedy
    from icl_lens.model._block_family import block_family as family_of
    from icl_lens.thought._instruction_batches import continuations_read

    model = load(name, torch.float64)
    instr = text_ids(model, INSTRUCTION)
    queries = [text_ids(model, q) for q in ("ab", "ab cd", "axyz", "agh", "aq")]  # all start alike
    prompts = [with_bos(model, instr + q) for q in queries]
    run = []
    point = family_of(model).resid_pre(0)

    def tokens(x, hook):
        run.append(x.shape[0] * x.shape[1])

    def counted(**kwargs):
        run.clear()
        with model.hooks(fwd_hooks=[(point, tokens)]):
            out = greedy.greedy_continuations(model, prompts, 3, batch_size=2, **kwargs)
        return out, list(run)

    shared = len(prompts[0]) - len(queries[0]) + 1  # BOS, the instruction and the "a" all queries start with
    assert greedy.shared_length(prompts) == shared and greedy.shared_length(prompts, shared - 1) == shared - 1
    lengths = sorted({len(p) for p in prompts})  # one batch per length ("ab" and "aq": one of two rows)
    rows = [sum(len(p) == n for p in prompts) for n in lengths]
    assert max(rows) == 2
    out, run_shared = counted()  # once, then each batch from the first token not shared, then a token a step
    assert run_shared == [shared] + [t for n, k in zip(lengths, rows) for t in (k * (n - shared), k, k)]
    assert out == [_greedy_without_cache(model, p, 3) for p in prompts]
    monkeypatch.setattr(greedy, "SHARED_MIN", 10 ** 6)
    assert counted() == (out, [t for n, k in zip(lengths, rows) for t in (k * n, k, k)])  # nothing shared
    monkeypatch.undo()

    patch = thought_patch(model, INSTRUCTION, ["ab", "cd ef"])
    with patch.applied():
        assert greedy.greedy_continuations(model, prompts, 3) == [_greedy_without_cache(model, p, 3) for p in prompts]

    reads = {"a": family_of(model).mlp_input(1), "o": family_of(model).resid_post(1)}
    answers, got = continuations_read(model, instr, queries, 3, reads)
    monkeypatch.setattr(greedy, "SHARED_MIN", 10 ** 6)
    whole_answers, whole = continuations_read(model, instr, queries, 3, reads)
    assert answers == whole_answers
    for key in reads:
        assert got[key].shape == whole[key].shape == (sum(len(q) + len(a) for q, a in zip(queries, answers)),
                                                       model.cfg.d_model)
        torch.testing.assert_close(got[key], whole[key], rtol=1e-10, atol=1e-10)


# --- what the down-projection fit targets ----------------------------------------------------------

def _query_block_outputs(model, prompt: list[int], n_query: int) -> torch.Tensor:
    """Every block's output (residual stream after the block) at the last ``n_query`` positions."""
    family = block_family(model)
    names = [family.resid_post(l) for l in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([prompt]), names_filter=lambda n: n in names)
    return torch.stack([cache[n][0, -n_query:] for n in names])


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_down_fit_removes_the_block_output_residual_of_the_calibration_tokens(load, name):
    """Several calibration queries (more tokens than one vector can match): the paper's kind ``both`` leaves a
    per-token block-output residual (query alone, patched, against in context); ``both+down`` (λ = 0) removes it
    at every layer where the vector is a bias (Llama) and shrinks it where the fit goes through Gemma's post-FFN
    norm to first order; with a moderate ridge (2) it still shrinks it (the default ridge, 8, is chosen on the
    embedded models' held-out queries, not for this tiny fit). A down map dropped from the patch fails."""
    from dataclasses import replace

    model = load(name, torch.float64)
    queries = ["ab:", "xyz uv:", "cd ef gh:", "q:"]
    instr = text_ids(model, INSTRUCTION)

    def residual(patch) -> float:
        num = den = 0.0
        for q in queries:
            qi = text_ids(model, q)
            context = _query_block_outputs(model, with_bos(model, instr + qi), len(qi))
            with patch.applied():
                alone = _query_block_outputs(model, patch.prompt_ids(q), len(qi))
            num += float(((alone - context) ** 2).sum())
            den += float((context ** 2).sum())
        return (num / den) ** 0.5

    paper = residual(thought_patch(model, INSTRUCTION, queries, kind="both", ridge=0.0, query_prefix="\n",
                                   answer_tokens=0, preserve=()))
    exact = thought_patch(model, INSTRUCTION, queries, kind="both+down", ridge=0.0, query_prefix="\n", answer_tokens=0,
                          preserve=())
    ridged = residual(thought_patch(model, INSTRUCTION, queries, ridge=2.0, answer_tokens=0,
                                    preserve=()))  # query rows, as the others
    assert paper > 1e-3
    if exact.vector_site == "bias":  # exact interpolation: fewer calibration tokens than d_mlp
        assert residual(exact) <= 1e-8 * max(paper, 1.0)
    else:  # linearised through the post-FFN RMSNorm (icl_lens.thought._fit)
        assert residual(exact) < 0.6 * paper
    assert float(exact.down_residual.max()) <= 1e-8  # its own (linearised) target: met exactly
    assert ridged < paper
    broken = replace(exact, down_v=torch.zeros_like(exact.down_v))  # the fit's down map left out
    assert residual(broken) > 0.1 * paper


# --- the steering baseline leaves the model as it found it --------------------------------------------

def test_steering_edit_is_removed_after_use_also_after_an_error(load):
    from icl_lens.thought._steering import steering_vector

    model = load("tiny-llama", torch.float64)
    steer = steering_vector(model, INSTRUCTION, ["ab:", "xyz:"], query_prefix="\n")
    ids = torch.tensor([steer.prompt_ids("cd:")])
    with torch.no_grad():
        before = model(ids)
        with steer.applied():
            steered = model(ids)
        after = model(ids)
        with pytest.raises(RuntimeError, match="inside"):
            with steer.applied():
                raise RuntimeError("inside the steered block")
        after_error = model(ids)
    assert not torch.allclose(steered, before)  # the edit acted while applied
    assert torch.equal(after, before) and torch.equal(after_error, before)
    assert not any(hp.fwd_hooks for hp in model.hook_dict.values())
