"""The locality set nobody tuned on (issue 38): built by its command, disjoint from the preserve set and its
templates, never opened by a selection stage or a fit, and measured per format and per task beside random controls and
the instruction itself (the anchor)."""
from __future__ import annotations

import builtins
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.build_locality import LOCALITY_SET, build
from icl_lens.thought import load_locality_set, locality_set_probe, thought_patch
from icl_lens.thought._instruction_batches import text_ids, with_bos
from icl_lens.thought._divergence import mean_kl
from icl_lens.thought._locality import LOCALITY_FILE
from icl_lens.thought._preserve import PRESERVE_DIR, few_shot_texts
from icl_lens.thought.tasks import TaskFormatError

ROOT = Path(__file__).resolve().parents[1]
# The preserve prompts' templates: a header "Each X is followed by …" and one-line demonstrations "x: y", "x -> y",
# "x = y", "Q: …", "A: …", "Input: …", "Output: …".
TEMPLATES = [re.compile(p) for p in (r"is followed by", r"^[A-Za-z][\w ]*: \S", r"^[\w ]+ -> ", r"^[\w ]+ = \S",
                                     r"^(Q|A|Input|Output):")]


def _lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if len(line.strip()) > 12}


def test_the_committed_file_is_what_the_command_writes(tmp_path):
    data = json.loads(LOCALITY_SET.read_text(encoding="utf-8"))
    assert data == json.loads(json.dumps(build(), ensure_ascii=False))  # deterministic: the same on every run
    assert set(data["formats"]) == {"prose", "code", "dialogue", "table_or_list"} and len(data["tasks"]) >= 3
    assert all(len(t["prompts"]) >= 12 for t in data["tasks"])
    loaded = load_locality_set(LOCALITY_SET)
    assert list(loaded.formats) == list(data["formats"]) and len(loaded.tasks) == len(data["tasks"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"formats": {"prose": []}, "tasks": []}))
    with pytest.raises(TaskFormatError, match="every format needs texts"):
        load_locality_set(bad)
    with pytest.raises(TaskFormatError, match="not a locality set"):
        load_locality_set(tmp_path / "missing.json")


def test_no_text_overlaps_the_preserve_set_or_uses_its_templates():
    data = load_locality_set(LOCALITY_SET)
    preserve = [*few_shot_texts()]
    for path in PRESERVE_DIR.glob("*.json"):  # the models' shipped samples from BOS
        if path.name != "few_shot.json":
            preserve += json.loads(path.read_text(encoding="utf-8"))["texts"]
    old = json.loads(LOCALITY_FILE.read_text(encoding="utf-8"))  # the library's own locality file
    preserve += [*old["texts"], *old.get("preserve_texts", []), old["other_task"]["instruction"]]
    kept = set().union(*(_lines(t) for t in preserve))
    ours = [t for ts in data.formats.values() for t in ts] + [s for i, ps in data.tasks.values() for s in (i, *ps)]
    assert not set().union(*(_lines(t) for t in ours)) & kept
    assert not any(t.strip() in p or p.strip() in t for t in ours for p in preserve if len(p.strip()) > 12)
    for name, (instruction, prompts) in data.tasks.items():
        for line in (instruction + "\n".join(prompts)).splitlines():
            assert not any(p.search(line) for p in TEMPLATES), (name, line)
    assert any(p.search(line) for t in few_shot_texts() for line in t.splitlines() for p in TEMPLATES[1:])


def test_selection_and_preserve_paths_never_open_it(load, tmp_path, monkeypatch, one_thread):
    """Every selection stage and a default fit (preserve=None: the shipped preserve texts) run with every way of
    reading a file watched; none opens the locality set. The probe of the locality rows does (the guard is real)."""
    from experiments.thought.jobs import ModelJobs
    from experiments.thought.method import NULL_SPACE_GRID
    from icl_lens.thought import load_task

    opened = []
    real_open, real_read = builtins.open, Path.read_text

    def watch(path):
        if Path(str(path)).name == LOCALITY_SET.name:
            opened.append(str(path))

    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (watch(f), real_open(f, *a, **k))[1])
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: (watch(self), real_read(self, *a, **k))[1])
    jobs = ModelJobs("tiny-llama", tmp_path / "eval_thought.md", "test", n_train=4, select_fit=3, select_validate=2,
                     null_space_grid=NULL_SPACE_GRID[:2])
    task = load_task("capitals")
    jobs.select(task, 0)
    jobs.answers(task, 0)
    jobs.strength(task, 1.0)
    jobs.null_space(task, 1)
    thought_patch(jobs.model, task.instruction, [q for q, _ in task.train[:3]], answer_tokens=1)
    assert opened == []
    jobs.set_probe()  # what the untouched and equal-terms distillation rows read
    assert opened and all(Path(p).name == LOCALITY_SET.name for p in opened)
    # Statically: only the command that writes it and the rows that read it name the file.
    named = subprocess.run(["git", "grep", "--untracked", "-l", "-e", "locality_untouched", "-e", "LOCALITY_SET", "--", "*.py"],
                           cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert set(named) <= {"experiments/build_locality.py", "experiments/thought/method.py",
                          "tests/test_thought_locality_set.py"}, named


def test_the_set_probe_measures_edits_and_the_instruction(load, one_thread):
    model = load("tiny-llama", torch.float64)
    probe = locality_set_probe(model, load_locality_set(LOCALITY_SET))
    none = probe.measure()
    assert none.kl_all == 0.0 and all(v == 0.0 for v in none.kl.values()) and all(v == 1.0 for v in none.kept.values())
    instruction = "Capitals:\nFrance: Paris\n"  # short: the tiny models read 256 byte tokens
    patch = thought_patch(model, instruction, ["Spain:", "Peru:"], answer_tokens=1)
    got = probe.measure(patch)
    assert got.kl_all > 0 and set(got.kl) == set(probe.texts) and set(got.kept) == set(probe.prompts)
    n = {f: sum(map(len, ids)) for f, ids in probe.texts.items()}
    assert got.kl_all == pytest.approx(sum(got.kl[f] * n[f] for f in n) / sum(n.values()), rel=1e-12)
    # The anchor, against a hand count: plain rows against the prompted rows that predict the same next token.
    anchor = probe.anchor(instruction)
    instr = text_ids(model, instruction)
    total = 0.0
    with torch.no_grad():
        for ids in map(list, probe.texts["prose"]):
            plain = model(torch.tensor([ids]))[0]
            prompted = model(torch.tensor([with_bos(model, instr + ids[1:])]))[0][-len(ids):]
            total += mean_kl(plain, prompted) * len(ids)
    assert anchor.kl["prose"] == pytest.approx(total / n["prose"], rel=1e-9)
    assert anchor.kl["prose"] > 0 and all(0 <= v <= 1 for v in anchor.kept.values())
    with pytest.raises(ValueError, match="max_new_tokens"):
        locality_set_probe(model, load_locality_set(LOCALITY_SET), max_new_tokens=0)
