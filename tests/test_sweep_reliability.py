"""A sweep no row can stop (issue 43): rows over the memory budget and rows that give non-finite values are bad
rows and the others finish; the budget reads the cgroup's limit; resumes after kills are bit-identical with
too-long rows present; damaged, truncated and copied parts are caught by their checksums and redone; the lock
never follows a link; the command line answers a busy folder, an empty --out, a folder or a pipe clearly."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from icl_lens import TokenPatches
from icl_lens.patches import available_memory, cgroup_memory_available, estimate_patches_memory, memory_limits
from icl_lens.sweep import SweepLockedError
from icl_lens.sweep._run import row_failure
from test_faults import ENV, KEYS, _norms, _sweep, _write  # the sweep fault-injection helpers


def _rows(n: int, too_long: tuple[int, ...] = ()) -> dict:
    """Prompts of many lengths (so batches pad), and rows over the tiny models' 256-token context."""
    rows = {i: f"Row {i}: the cat sat on the mat" + " and purred" * (i % 7) for i in range(n)}
    rows.update({i: "y" * 300 for i in too_long})
    return rows


# -- the budget ---------------------------------------------------------------------------------------------------

def _cgroup_v2(root: Path, limit: int, usage: int, parent_limit: str = "max") -> Path:
    """A cgroup v2 tree as the kernel mounts it: the process in /job/step, the limit set on /job."""
    (root / "job" / "step").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("memory\n")
    (root / "job" / "memory.max").write_text(f"{limit}\n")
    (root / "job" / "memory.current").write_text(f"{usage}\n")
    (root / "job" / "step" / "memory.max").write_text(f"{parent_limit}\n")
    (root / "job" / "step" / "memory.current").write_text(f"{usage // 2}\n")
    proc = root.parent / f"{root.name}-proc-cgroup"
    proc.write_text("0::/job/step\n")
    return proc


def test_the_cgroup_limit_bounds_the_budget(tmp_path):
    gb = 10 ** 9
    proc = _cgroup_v2(tmp_path / "v2", limit=int(1.5 * gb), usage=int(0.5 * gb))
    assert cgroup_memory_available(tmp_path / "v2", proc) == gb  # the ancestor's limit minus its usage
    # cgroup v1, inside a container: the host path in /proc/self/cgroup is not mounted; the mount is the cgroup
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{2 * gb}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{int(0.25 * gb)}\n")
    (tmp_path / "v1-proc").write_text("4:memory:/docker/abc\n0::/\n")
    assert cgroup_memory_available(tmp_path / "v1", tmp_path / "v1-proc") == int(1.75 * gb)
    # no limit anywhere ("max", v1's huge "unlimited", no files): no bound
    unlimited = _cgroup_v2(tmp_path / "open", limit=0, usage=0)
    (tmp_path / "open" / "job" / "memory.max").write_text("max\n")
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_memory_available(tmp_path / "open", unlimited) is None
    assert cgroup_memory_available(tmp_path / "v1", tmp_path / "v1-proc") is None
    assert cgroup_memory_available(tmp_path / "nothing", tmp_path / "no-proc") is None
    # the budget is the smallest bound: host RAM, the cgroup's room, --max-memory
    import icl_lens.patches._memory as memory

    memory.CGROUP_ROOT, memory.PROC_CGROUP, saved = tmp_path / "v2", proc, (memory.CGROUP_ROOT, memory.PROC_CGROUP)
    try:
        bounds = memory_limits(torch.device("cpu"), 3 * gb)
        assert bounds["cgroup limit"] == gb and bounds["--max-memory"] == 3 * gb
        assert available_memory(torch.device("cpu"), 3 * gb) == min(gb, bounds["available RAM"])
        assert available_memory(torch.device("cpu"), 1000) == 1000
    finally:
        memory.CGROUP_ROOT, memory.PROC_CGROUP = saved


def test_row_failures_are_told_from_bugs():
    with pytest.raises(RuntimeError) as alloc:  # a real failed allocation, as under a memory limit
        torch.empty(1 << 62, dtype=torch.uint8)
    assert row_failure(alloc.value).startswith("out of memory when computed alone")
    assert row_failure(MemoryError()).startswith("out of memory")
    assert row_failure(FloatingPointError("non-finite MLP input at layer 1")).startswith("non-finite values")
    assert row_failure(KeyError("bug")) is None and row_failure(RuntimeError("shape mismatch")) is None


def _poison(folder: Path, name: str) -> str:
    """The tiny model ``name`` saved as a local model whose embedding of "~" overflows: any prompt with a "~" gives
    non-finite activations (finite weights, as a float16 overflow on a real model), every other prompt is fine."""
    from icl_lens.model._byte_tokenizer import save_byte_tokenizer
    from icl_lens.model._tiny_models import build_tiny_model

    model, tok = build_tiny_model(name), save_byte_tokenizer(folder / "tokenizer")
    with torch.no_grad():
        model.get_input_embeddings().weight[tok("~")["input_ids"][-1]] = 3e38
    model.save_pretrained(folder / name)
    tok.save_pretrained(folder / name)
    return str(folder / name)


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    return _poison(tmp_path_factory.mktemp("poisoned"), "tiny-gpt2")


def test_a_row_over_the_cgroup_budget_and_a_non_finite_row_are_bad_rows_and_the_rest_finish(poisoned, tmp_path,
                                                                                            monkeypatch):
    import icl_lens.patches._memory as memory
    from icl_lens import load_model
    from icl_lens.model._prompts import encode_prompt

    rows = {i: f"Row {i}: the cat sat" + " on the mat" * (i % 2) for i in range(40)}
    rows[7] = "Row 7 holds a tilde ~ that overflows the model."
    rows[23] = "long " * 48  # 241 tokens: fits the context, not the budget below
    prompts = _write(tmp_path / "p.jsonl", rows)
    lm = load_model(poisoned)
    short = max(len(encode_prompt(lm, p)) for i, p in rows.items() if i != 23)
    need_short = estimate_patches_memory(lm, short, equivalence=False)
    need_long = estimate_patches_memory(lm, len(encode_prompt(lm, rows[23])), equivalence=False)
    batch = need_short.weights + 8 * (need_short.total - need_short.weights)
    assert batch < need_long.total
    room = (batch + need_long.total) // 2  # a batch of 8 short rows fits, the long row alone does not
    usage = int(1.5e9) - room  # a 1.5 GB cgroup that much of is in use
    monkeypatch.setattr(memory, "CGROUP_ROOT", tmp_path / "cg")
    monkeypatch.setattr(memory, "PROC_CGROUP", _cgroup_v2(tmp_path / "cg", limit=int(1.5e9), usage=usage))
    out = tmp_path / "run"
    first = _sweep(prompts, out, model=poisoned, batch_size=8)
    m = first.manifest
    assert m["memory"] == {"bytes": room, "limited_by": "cgroup limit"}
    bad = {b["id"]: b for b in m["bad_rows"]}
    assert sorted(bad) == ["23", "7"] and bad["7"]["line"] == 8 and bad["23"]["line"] == 24
    assert bad["7"]["reason"].startswith("non-finite values when computed alone (non-finite MLP input")
    assert "needs about" in bad["23"]["reason"] and "cgroup limit" in bad["23"]["reason"]
    assert m["counts"] == {**m["counts"], "rows": 40, "good": 38, "bad": 2, "done": 38, "done_now": 38, "left": 0}
    norms = _norms(out)
    assert set(norms.id) == {str(i) for i in rows} - {"7", "23"} and not norms.duplicated(KEYS).any()
    parts = sorted(p.name for p in (out / "norms").iterdir())
    again = _sweep(prompts, out, model=poisoned, batch_size=8)  # a rerun does nothing more
    assert again.manifest["counts"] == {**m["counts"], "done_before": 38, "done_now": 0}
    assert again.manifest["bad_rows"] == m["bad_rows"]
    assert sorted(p.name for p in (out / "norms").iterdir()) == parts


# -- deterministic batches: kills at random moments, then a resume --------------------------------------------------

@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-gpt2"])
def test_resumes_after_random_kills_are_bit_identical_with_too_long_rows_present(name, tmp_path):
    """Too-long rows and a row that fails (its batch then runs row by row) shift no batch of a resume."""
    model = _poison(tmp_path, name)
    rows = _rows(36, too_long=(3, 17, 30))
    rows[9] = "Row 9 holds a tilde ~ that overflows the model" + " and purred" * 8  # in the first batch
    prompts, out, clean = _write(tmp_path / "p.jsonl", rows), tmp_path / "run", tmp_path / "clean"
    cli = [sys.executable, "-m", "icl_lens", "sweep", str(prompts), "--model", model, "--out", str(out),
           "--batch-size", "4", "--factors", "--device", "cpu", "--quiet"]
    rng = random.Random(43)
    kills, batches = 0, -(-len(rows) // 4)
    for run in range(3):
        before = len(list((out / "norms").glob("part-*.parquet")))
        proc = subprocess.Popen(cli, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # never the last batch's part: the run must be cut short, and the last one must leave its lock behind
        target, deadline = min(before + rng.randint(1, 2), batches - 1), time.monotonic() + 300
        while len(list((out / "norms").glob("part-*.parquet"))) < target and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        if run < 2:  # somewhere in the next batch: its shard, its part, its record (the last run: at once)
            time.sleep(rng.uniform(0, 0.05))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=60)
    assert kills >= 2
    with pytest.warns(UserWarning, match="stale sweep lock"):
        resumed = _sweep(prompts, out, model=model, batch_size=4, factors=True)
    _sweep(prompts, clean, model=model, batch_size=4, factors=True)
    assert resumed.manifest["counts"]["done"] == 32 and resumed.manifest["counts"]["bad"] == 4
    assert "non-finite values" in {b["id"]: b["reason"] for b in resumed.manifest["bad_rows"]}["9"]
    pd.testing.assert_frame_equal(_norms(out), _norms(clean), check_exact=True)  # bit for bit
    got = {k: p for s in sorted((out / "factors").glob("*.safetensors")) for k, p in TokenPatches.load_many(s).items()}
    want = {k: p for s in (clean / "factors").glob("*.safetensors") for k, p in TokenPatches.load_many(s).items()}
    assert got.keys() == want.keys() == {str(i) for i in rows} - {"3", "9", "17", "30"}
    assert all(torch.equal(got[k].delta, want[k].delta) and torch.equal(got[k].v, want[k].v) for k in want)


# -- integrity ------------------------------------------------------------------------------------------------------

def test_a_truncated_shard_a_copied_part_and_a_flipped_byte_are_caught_and_redone(tmp_path):
    rows = _rows(10)
    prompts, out = _write(tmp_path / "p.jsonl", rows), tmp_path / "run"
    first = _sweep(prompts, out, batch_size=3, factors=True)
    clean = _norms(out)
    parts = sorted((out / "norms").glob("part-*.parquet"))
    assert len(parts) == 4 and set(first.manifest["parts"]) == {p.name for p in parts}
    assert all(len(r["blake2b"]) == 64 and r["factors"]["bytes"] > 0 for r in first.manifest["parts"].values())

    def ids(path):
        return set(pd.read_parquet(path).id)

    redo = ids(parts[0]) | ids(parts[1])
    shard = out / "factors" / f"{parts[0].stem}.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated (a full disk, an interrupted copy)
    flipped = bytearray(parts[1].read_bytes())
    flipped[len(flipped) // 3] ^= 0x01  # one bit inside the data: Parquet may read it without complaint
    parts[1].write_bytes(bytes(flipped))
    copy = parts[2].with_name(f"{parts[2].stem} (1).parquet")  # a sync tool's conflict copy
    copy.write_bytes(parts[2].read_bytes())
    with pytest.warns(UserWarning) as caught:
        again = _sweep(prompts, out, batch_size=3, factors=True)
    said = " ".join(str(w.message) for w in caught)
    assert "factor shard that does not match its checksum" in said and "does not match its checksum" in said
    assert "is not a part this sweep wrote" in said
    quarantined = {p.name for p in (out / "quarantine").iterdir()}
    assert {parts[0].name, shard.name, parts[1].name, copy.name} <= quarantined
    assert again.manifest["counts"]["done_now"] == len(redo) and again.manifest["counts"]["done"] == 10
    pd.testing.assert_frame_equal(_norms(out), clean, check_exact=True)
    # a copy under a name the sweep could have written, with its record: its ids repeat another part's
    part = sorted((out / "norms").glob("part-*.parquet"))[0]
    twin = "part-r000-0123456789ab"
    (out / "norms" / f"{twin}.parquet").write_bytes(part.read_bytes())
    (out / "factors" / f"{twin}.safetensors").write_bytes((out / "factors" / f"{part.stem}.safetensors").read_bytes())
    record = json.loads((out / "checksums" / f"{part.stem}.json").read_text())
    record["part"], record["factors"]["file"] = f"{twin}.parquet", f"{twin}.safetensors"
    (out / "checksums" / f"{twin}.json").write_text(json.dumps(record))
    first_name = min(part.name, f"{twin}.parquet")
    with pytest.warns(UserWarning, match=f"repeats .* of {first_name}"):
        third = _sweep(prompts, out, batch_size=3, factors=True)
    assert third.manifest["counts"]["done_now"] == 0
    pd.testing.assert_frame_equal(_norms(out), clean, check_exact=True)


def test_a_part_written_just_before_a_kill_without_its_record_is_redone(tmp_path):
    rows = _rows(6)
    prompts, out = _write(tmp_path / "p.jsonl", rows), tmp_path / "run"
    _sweep(prompts, out, batch_size=3)
    clean = _norms(out)
    record = sorted((out / "checksums").glob("part-*.json"))[0]
    record.unlink()  # the kill came between the part's rename and its record's
    again = _sweep(prompts, out, batch_size=3)
    assert again.manifest["counts"]["done_now"] == 3 and not (out / "quarantine").exists()
    pd.testing.assert_frame_equal(_norms(out), clean, check_exact=True)


# -- the lock, --out, --layers, pipes -------------------------------------------------------------------------------

def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path):
    prompts, out = _write(tmp_path / "p.jsonl", _rows(2)), tmp_path / "run"
    out.mkdir()
    precious = tmp_path / "thesis.tex"
    precious.write_text("years of work\n")
    (out / "sweep.lock").symlink_to(precious)
    with pytest.raises(SweepLockedError, match="symbolic link"):
        _sweep(prompts, out)
    assert precious.read_text() == "years of work\n" and (out / "sweep.lock").is_symlink()


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "icl_lens", *args], capture_output=True, text=True, timeout=600,
                          env=ENV, **kw)


def test_empty_out_folders_pipes_and_negative_layers(tmp_path, monkeypatch):
    prompts = _write(tmp_path / "p.jsonl", _rows(3))
    for args in (["sweep", str(prompts), "--out", ""], ["patches", "hi", "--out", ""]):
        proc = _cli(*args, cwd=tmp_path)
        assert proc.returncode == 2 and "--out is empty" in proc.stderr and proc.stderr.count("\n") == 1
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="--out is empty"):
        _sweep(prompts, "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]  # nothing written into the current folder
    proc = _cli("sweep", str(tmp_path), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "is a folder; give the JSONL file inside it" in proc.stderr
    piped = _cli("sweep", "/dev/stdin", "--out", str(tmp_path / "piped"), "--model", "tiny-llama", "--device", "cpu",
                 "--layers", "-1", "--quiet", input=prompts.read_text())
    assert piped.returncode == 0, piped.stderr[-2000:]
    assert "3 of 3 prompts done" in piped.stdout
    manifest = json.loads((tmp_path / "piped" / "manifest.json").read_text())
    assert manifest["layers"] == [2] and set(_norms(tmp_path / "piped").layer) == {2}  # tiny-llama: 3 layers
    # --layers -1 and --layers 2 name the same layer: the folder resumes
    again = _sweep(prompts, tmp_path / "piped", layers=[2])
    assert again.manifest["counts"]["done_now"] == 0 and again.manifest["counts"]["done"] == 3


CHECK_WITHOUT_TORCH = """
import sys
from icl_lens.cli import main
code = main(sys.argv[1:])
print("torch imported:", "torch" in sys.modules, "exit", code)
"""


def test_a_busy_folder_is_refused_before_torch_is_imported(tmp_path):
    from icl_lens.sweep._lock import FolderLock

    prompts, out = _write(tmp_path / "p.jsonl", _rows(2)), tmp_path / "run"
    out.mkdir()
    with FolderLock(out):
        proc = subprocess.run([sys.executable, "-c", CHECK_WITHOUT_TORCH, "sweep", str(prompts), "--out", str(out),
                               "--model", "tiny-llama"], capture_output=True, text=True, timeout=120, env=ENV)
    assert f"in use by another sweep (pid {os.getpid()} " in proc.stderr
    assert "torch imported: False exit 2" in proc.stdout
