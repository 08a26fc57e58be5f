"""Sweeps: Parquet parts equal to patch_norms, bad rows reported, resume after a crash, factor shards,
and accelerate's 2-process CPU launch writing the same union as one process."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from icl_lens import TokenPatches, dense_weights, patch_norms, token_patches
from icl_lens.sweep import read_rows, run_sweep

ROOT = Path(__file__).parents[1]
GOOD = {i: f"Prompt {i}: the cat sat on the mat{' again' * (i % 4)}." for i in range(7)}


def _write_prompts(path: Path) -> Path:
    lines = [json.dumps({"id": i, "prompt": p}) for i, p in GOOD.items()]
    lines += [json.dumps({"id": 100}), json.dumps({"id": 101, "prompt": "   "}),
              json.dumps({"id": 102, "prompt": "x" * 400}), json.dumps({"id": 3, "prompt": "again"}), "{oops"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["id", "layer", "position"]).reset_index(drop=True)


@pytest.fixture()
def prompts(tmp_path):
    return _write_prompts(tmp_path / "prompts.jsonl")


def test_read_rows_reports_each_bad_row(prompts):
    rows, bad = read_rows(prompts)
    assert [r.id for r in rows] == [str(i) for i in GOOD] + ["102"]  # ids are text; over-long is found later
    reasons = {b.line: b.reason for b in bad}
    assert reasons == {8: "missing prompt", 9: "empty prompt", 11: "duplicate id (first on line 4)",
                       12: reasons[12]} and reasons[12].startswith("not valid JSON")


def test_sweep_writes_parts_equal_to_patch_norms(load, prompts, tmp_path):
    out = tmp_path / "run"
    result = run_sweep(prompts, model="tiny-llama", out=out, batch_size=3, device="cpu", progress=False)
    norms = pd.read_parquet(out / "norms")
    assert list(norms.columns) == ["id", "layer", "position", "token", "norm", "correction_norm"]
    assert sorted(norms.id.unique()) == sorted(str(i) for i in GOOD)
    model = load("tiny-llama")
    expected = patch_norms(model, list(GOOD.values()), progress=False).rename(columns={"prompt": "id"})
    expected["id"] = expected["id"].astype(str)
    got = _sorted(norms)
    expected = _sorted(expected)
    assert (got[["id", "layer", "position", "token"]] == expected[["id", "layer", "position", "token"]]).all().all()
    assert np.allclose(got.norm, expected.norm, rtol=1e-5, atol=0)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest == result.manifest
    assert manifest["model"] == "tiny-llama" and manifest["dtype"] == "float32" and manifest["device"] == "cpu"
    assert manifest["counts"]["done"] == len(GOOD) and manifest["counts"]["bad"] == 5
    assert {b["id"]: b["reason"] for b in manifest["bad_rows"]}["102"].startswith("The prompt has 401 tokens")
    assert {"torch", "transformer-lens", "accelerate", "pyarrow"} <= set(manifest["versions"])
    assert manifest["seconds"] > 0


def test_rerun_resumes_after_a_crash(prompts, tmp_path):
    out = tmp_path / "run"
    run_sweep(prompts, model="tiny-llama", out=out, batch_size=2, device="cpu", progress=False)
    first = _sorted(pd.read_parquet(out / "norms"))
    parts = sorted((out / "norms").glob("part-*.parquet"))
    lost = parts[0]
    lost_ids = set(pd.read_parquet(lost).id)
    lost.rename(lost.with_name(f".{lost.name}.tmp"))  # as if the process died while writing this part
    again = run_sweep(prompts, model="tiny-llama", out=out, batch_size=2, device="cpu", progress=False)
    assert again.manifest["counts"]["done_now"] == len(lost_ids)
    assert again.manifest["counts"]["done_before"] == len(GOOD) - len(lost_ids)
    assert not list((out / "norms").glob(".*.tmp"))
    second = _sorted(pd.read_parquet(out / "norms"))
    assert len(second) == len(first) and (second.drop(columns=["norm", "correction_norm"]) ==
                                          first.drop(columns=["norm", "correction_norm"])).all().all()
    assert np.allclose(second.norm, first.norm, rtol=1e-5)
    third = run_sweep(prompts, model="tiny-llama", out=out, batch_size=2, device="cpu", progress=False)
    assert third.manifest["counts"]["done_now"] == 0 and len(pd.read_parquet(out / "norms")) == len(first)


def test_factor_shards_load_as_token_patches(load, prompts, tmp_path):
    out = tmp_path / "run"
    run_sweep(prompts, model="tiny-gemma3", out=out, batch_size=4, device="cpu", factors=True, progress=False)
    shards = sorted((out / "factors").glob("part-*.safetensors"))
    loaded = {}
    for shard in shards:
        loaded.update(TokenPatches.load_many(shard, weights=dense_weights(load("tiny-gemma3"))))
    assert set(loaded) == {str(i) for i in GOOD}
    model = load("tiny-gemma3")
    single = token_patches(model, GOOD[5])
    assert torch.allclose(loaded["5"].u_in, single.u_in, rtol=1e-5, atol=1e-6)
    assert loaded["5"].tokens == single.tokens
    norms = pd.read_parquet(out / "norms")
    assert np.allclose(_sorted(norms[norms.id == "5"]).norm, single.to_frame().norm, rtol=1e-5)


def test_cli_sweep(prompts, tmp_path):
    out = tmp_path / "cli"
    proc = subprocess.run([sys.executable, "-m", "icl_lens", "sweep", str(prompts), "--model", "tiny-llama", "--out",
                           str(out), "--batch-size", "4", "--layers", "0", "2", "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "7 of 7 prompts done" in proc.stdout and "bad row line 8 (id 100): missing prompt" in proc.stdout
    assert sorted(pd.read_parquet(out / "norms").layer.unique()) == [0, 2]
    missing = subprocess.run([sys.executable, "-m", "icl_lens", "sweep", str(tmp_path / "nope.jsonl"), "--out",
                              str(out)], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_accelerate_two_cpu_processes_write_the_same_union(prompts, tmp_path):
    single, double = tmp_path / "one", tmp_path / "two"
    run_sweep(prompts, model="tiny-llama", out=single, batch_size=2, device="cpu", progress=False)
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "icl_lens", "sweep", str(prompts),
                           "--model", "tiny-llama", "--out", str(double), "--batch-size", "2", "--device", "cpu",
                           "--quiet"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((double / "manifest.json").read_text())
    assert manifest["processes"] == 2
    ranks = {p.name.split("-")[1] for p in (double / "norms").glob("part-*.parquet")}
    assert ranks == {"r000", "r001"}  # each process wrote its own parts
    a, b = _sorted(pd.read_parquet(single / "norms")), _sorted(pd.read_parquet(double / "norms"))
    pd.testing.assert_frame_equal(a, b)
    assert manifest["counts"]["bad"] == 5


def test_a_damaged_part_is_quarantined_and_redone(prompts, tmp_path):
    out = tmp_path / "run"
    run_sweep(prompts, model="tiny-llama", out=out, batch_size=3, device="cpu", progress=False)
    first = _sorted(pd.read_parquet(out / "norms"))
    part = sorted((out / "norms").glob("part-*.parquet"))[0]
    redo = set(pd.read_parquet(part).id)
    part.write_bytes(part.read_bytes()[:100])  # damaged outside the sweep (a disk fault, a bad copy)
    with pytest.warns(UserWarning, match="does not match its checksum"):
        again = run_sweep(prompts, model="tiny-llama", out=out, batch_size=3, device="cpu", progress=False)
    assert again.manifest["counts"]["done_now"] == len(redo) and (out / "quarantine" / part.name).exists()
    pd.testing.assert_frame_equal(_sorted(pd.read_parquet(out / "norms")), first)


def test_cli_refuses_a_resume_with_other_settings_in_one_line(prompts, tmp_path, capsys):
    from icl_lens.cli import main

    out = tmp_path / "run"
    args = ["sweep", str(prompts), "--model", "tiny-llama", "--out", str(out), "--device", "cpu", "--quiet"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args + ["--dtype", "float64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "computed with dtype 'float32', not 'float64'" in err and "new --out" in err


def test_authors_column_holds_each_rows_top_patch_shares(load, prompts, tmp_path, capsys, monkeypatch):
    """``--authors K``: each row's K largest patch shares (head, source offset, share), as patch_attribution gives
    them, from the ids the row was encoded to (each good row tokenised and checked once); a folder swept without
    the column refuses to resume with it."""
    from icl_lens import patch_attribution
    from icl_lens.cli import main
    from icl_lens.model import _prompts

    checked, remember = [], _prompts._remember
    monkeypatch.setattr(_prompts, "_remember", lambda model, ids: checked.append(len(ids)) or remember(model, ids))
    out = tmp_path / "run"
    run_sweep(prompts, model="tiny-llama", out=out, batch_size=3, device="cpu", progress=False, authors=2,
              layers=[1, 2])
    assert len(checked) == len(GOOD)  # one check per good row, the attribution included
    monkeypatch.setattr(_prompts, "_remember", remember)
    norms = pd.read_parquet(out / "norms")
    assert list(norms.columns) == ["id", "layer", "position", "token", "norm", "correction_norm", "patch_authors"]
    model = load("tiny-llama")
    at = patch_attribution(model, GOOD[5], 9, layers=[2])
    row = norms[(norms.id == "5") & (norms.layer == 2) & (norms.position == 9)].patch_authors.item()
    top = at.top(2, layer=2)
    assert [a["head"] for a in row] == list(top["head"]) and [a["offset"] for a in row] == list(top["offset"])
    assert np.allclose([a["share"] for a in row], top.share, rtol=1e-4, atol=1e-6)
    first = norms[norms.position <= 1].patch_authors  # BOS and the first token: nothing removed, zero patch
    assert first.map(len).eq(0).all()
    plain = tmp_path / "plain"
    args = ["sweep", str(prompts), "--model", "tiny-llama", "--out", str(plain), "--device", "cpu", "--quiet"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args + ["--authors", "3"]) == 2
    assert "computed with authors None, not 3" in capsys.readouterr().err
