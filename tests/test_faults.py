"""Fault injection on tiny models: sweeps killed mid-write and resumed, two sweeps into one folder, resumes
with other settings, edited prompts, poison rows, ids changing type or batch sizes changing between runs,
and malformed token-patch files. The promise: nothing lost, nothing written twice, nothing mixed, and every
bad input one clear error (or one bad row with its line number)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from icl_lens import TokenPatches, token_patches
from icl_lens.patches._patch_set import PatchFileError
from icl_lens.sweep import SweepLockedError, SweepRow, SweepSettingsError, read_rows, run_sweep
from icl_lens.sweep._encode import char_limit, encode_row
from icl_lens.sweep._parts import Part, check_settings

ROOT = Path(__file__).parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
KEYS = ["id", "layer", "position"]


def _write(path: Path, rows: dict) -> Path:
    path.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in rows.items()))
    return path


def _prompts(n: int) -> dict:
    return {i: f"Row {i}: the cat sat on the mat{' and purred' * (i % 3)}." for i in range(n)}


def _sweep(prompts, out, **kw):
    return run_sweep(prompts, **{"model": "tiny-llama", "out": out, "device": "cpu", "progress": False, **kw})


def _norms(out: Path) -> pd.DataFrame:
    """The folder's norms, sorted; every visible part must read on its own (no half-written part)."""
    for part in sorted((out / "norms").glob("part-*.parquet")):
        pd.read_parquet(part)
    return pd.read_parquet(out / "norms").sort_values(KEYS).reset_index(drop=True)


def _assert_once(norms: pd.DataFrame, ids) -> None:
    """Every id present, each (id, layer, position) exactly once."""
    assert set(norms.id) == {str(i) for i in ids}
    assert not norms.duplicated(KEYS).any()


def _leftovers(out: Path) -> list[str]:
    """Temporaries, the lock, and the per-process bad-row reports that a finished sweep must not leave."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")
                  if p.name.endswith(".tmp") or p.name == "sweep.lock" or p.name == "bad")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "icl_lens", "sweep", *args, "--model", "tiny-llama", "--device", "cpu", "--quiet"]


def _wait_for_parts(out: Path, proc: subprocess.Popen, n: int = 1, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(list((out / "norms").glob("part-*.parquet"))) < n:
        assert proc.poll() is None, f"the sweep ended before writing {n} part(s): {proc.communicate()}"
        assert time.monotonic() < deadline, "no part written in time"
        time.sleep(0.01)


# Runs the CLI, but SIGKILLs itself the moment it starts writing the rows of its KILL_AT-th Parquet file: the
# file is open and incomplete, as under a kill -9 or a power cut in the middle of a write.
KILL_DURING_WRITE = """
import os, signal, sys
import pyarrow.parquet as pq
real, calls = pq.ParquetWriter.write_table, [0]
def write_table(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == int(os.environ["KILL_AT"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, *args, **kwargs)
pq.ParquetWriter.write_table = write_table
from icl_lens.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill9_during_a_part_write_then_resume_loses_and_repeats_nothing(tmp_path):
    rows = _prompts(8)
    prompts, out, ref = _write(tmp_path / "p.jsonl", rows), tmp_path / "run", tmp_path / "ref"
    driver = tmp_path / "driver.py"
    driver.write_text(KILL_DURING_WRITE)
    proc = subprocess.run([sys.executable, str(driver), *_cli(str(prompts), "--out", str(out), "--batch-size", "2",
                                                             "--factors")[3:]],
                          env={**ENV, "KILL_AT": "3"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    visible = _norms(out)  # every part a reader can see reads whole: a half-written one would raise here
    assert visible.id.nunique() == 4 and not visible.duplicated(KEYS).any()
    parts = sorted((out / "norms").glob("part-*.parquet"))
    assert len(parts) == 2 and not (out / "manifest.json").exists()  # killed in the middle, writing part 3
    assert (out / "sweep.lock").exists() and len(list((out / "factors").glob("part-*"))) == 3  # 3rd: orphan
    with pytest.warns(UserWarning, match="stale sweep lock"):
        again = _sweep(prompts, out, batch_size=2, factors=True)
    assert again.manifest["counts"]["done_before"] == 4 and again.manifest["counts"]["done_now"] == 4
    assert _leftovers(out) == []
    _sweep(prompts, ref, batch_size=2, factors=True)
    resumed = _norms(out)
    _assert_once(resumed, rows)
    pd.testing.assert_frame_equal(resumed, _norms(ref))  # same batches, same numbers, bit for bit
    shards = [TokenPatches.load_many(p) for p in sorted((out / "factors").glob("part-*.safetensors"))]
    keys = [k for shard in shards for k in shard]
    assert sorted(keys) == sorted(str(i) for i in rows)  # no orphan shard left beside its rewrite


def test_a_second_sweep_into_a_busy_folder_is_refused(tmp_path):
    import accelerate  # noqa: F401 — imported before the first sweep starts, so the second tries its lock at once

    rows = {i: p * 4 for i, p in _prompts(48).items()}  # enough work that the first is still running
    prompts, out = _write(tmp_path / "p.jsonl", rows), tmp_path / "run"
    first = subprocess.Popen(_cli(str(prompts), "--out", str(out), "--batch-size", "1"), env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_parts(out, first)
        with pytest.raises(SweepLockedError, match=f"in use by another sweep \\(pid {first.pid} "):
            _sweep(prompts, out, batch_size=1)
        stdout, stderr = first.communicate(timeout=600)
    finally:
        first.kill()
    assert first.returncode == 0, stderr[-2000:]
    assert "48 of 48 prompts done (48 now" in stdout  # the refused sweep wrote nothing, took nothing away
    _assert_once(_norms(out), rows)
    assert _leftovers(out) == []


def test_resume_with_other_settings_or_an_edited_prompt_is_refused(tmp_path):
    rows = _prompts(3)
    prompts, out = _write(tmp_path / "p.jsonl", rows), tmp_path / "run"
    _sweep(prompts, out, layers=[0, 2])
    before = sorted(p.name for p in (out / "norms").iterdir())
    for change, name in [({"model": "tiny-gpt2"}, "model"), ({"dtype": "float64"}, "dtype"),
                         ({"layers": [0, 1]}, "layers"), ({"layers": None}, "layers"), ({"factors": True}, "factors")]:
        with pytest.raises(SweepSettingsError, match=f"computed with {name} .*new --out folder"):
            _sweep(prompts, out, **{"layers": [0, 2], **change})
    edited = _write(tmp_path / "edited.jsonl", {**rows, 1: "An edited prompt."})
    with pytest.raises(SweepSettingsError, match=r"id '1' \(line 2\).*new --out folder"):
        _sweep(edited, out, layers=[0, 2])
    assert sorted(p.name for p in (out / "norms").iterdir()) == before and _leftovers(out) == []
    again = _sweep(prompts, out, layers=[2, 0])  # the same settings, in another order: resumes
    assert again.manifest["counts"]["done_now"] == 0 and again.manifest["layers"] == [0, 2]
    assert set(again.manifest["done_prompts"]) == {"0", "1", "2"}
    with pytest.raises(ValueError, match="layers must be in 0..2"):
        _sweep(prompts, tmp_path / "fresh", layers=[999], factors=True)  # factors once kept no row, silently
    assert not list((tmp_path / "fresh" / "norms").glob("part-*"))
    # The revision (known for hub and embedded models) is compared when both sides know it.
    part = Part(Path("x"), {"model": "m", "revision": "abc", "dtype": "float32", "layers": None, "factors": False}, {},
                {})
    with pytest.raises(SweepSettingsError, match="revision 'abc', not 'def'"):
        check_settings([part], {**part.settings, "revision": "def"}, tmp_path)
    check_settings([part], {**part.settings, "revision": None}, tmp_path)


def test_poison_rows_become_bad_rows_with_their_line_numbers(tmp_path):
    lines = [json.dumps({"id": 0, "prompt": "A fine prompt."}).encode(),
             b'{"id": 1, "prompt": "a lone surrogate \\ud800 here"}',
             '{"id": 2, "prompt": "caf\u00e9"}'.encode("latin-1"),  # one invalid UTF-8 byte
             json.dumps({"id": 2 ** 70, "prompt": "An id beyond int64 is text like any id."}).encode(),
             b'{"id": ' + b"9" * 5000 + b', "prompt": "an integer too long for Python to parse"}',
             b"[" * 100_000 + b"]" * 100_000,
             b'{"id": "\\udc80", "prompt": "a surrogate id"}',
             json.dumps({"id": 7, "prompt": "x" * 400}).encode(),  # fits the bound, not the 256-token context
             json.dumps({"id": 8.5, "prompt": "a float id"}).encode(),
             json.dumps({"id": "last", "prompt": "The last fine prompt."}).encode()]
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(b"\n".join(lines) + b"\n")
    result = _sweep(prompts, tmp_path / "run", batch_size=4)
    reasons = {b["line"]: b["reason"] for b in result.manifest["bad_rows"]}
    assert sorted(reasons) == [2, 3, 5, 6, 7, 8, 9]
    assert "lone surrogate U+D800" in reasons[2] and "not valid UTF-8 (byte 0xe9" in reasons[3]
    assert reasons[5].startswith("not valid JSON") and reasons[6].startswith("not valid JSON")
    assert "id is not valid Unicode" in reasons[7] and "401 tokens" in reasons[8] and "id is a float" in reasons[9]
    norms = _norms(tmp_path / "run")
    _assert_once(norms, [0, 2 ** 70, "last"])
    assert result.manifest["counts"] == {**result.manifest["counts"], "good": 3, "bad": 7, "done": 3, "left": 0}


def test_a_50_mb_prompt_is_a_bad_row_without_tokenizing_and_a_tokenizer_error_a_bad_row(load, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "huge", "prompt": "word " * 10_000_000}) + "\n")
    model = load("tiny-llama")
    start = time.perf_counter()
    (row,), _ = read_rows(prompts)
    bad = encode_row(model, row)
    seconds = time.perf_counter() - start
    assert bad.line == 1 and "50000000 characters" in bad.reason and f"at most {char_limit(model)}" in bad.reason
    assert seconds < 3, seconds  # tokenizing it would take minutes and gigabytes
    under = encode_row(model, SweepRow(2, "ok", "x" * (char_limit(model) - 1), ""))
    assert "tokens but" in under.reason  # under the bound, the token count decides
    failed = encode_row(model, SweepRow(3, "s", "a \ud800 b", ""))  # read_rows refuses it first; if not:
    assert failed.line == 3 and failed.reason.startswith("the tokenizer failed: TypeError")


def test_ids_that_change_type_between_runs_share_one_text_column(tmp_path):
    rows = _prompts(4)
    out = tmp_path / "run"
    _sweep(_write(tmp_path / "a.jsonl", rows), out, batch_size=2)
    texts = {("two" if i == 2 else str(i)): p for i, p in rows.items()}  # text ids now, one of them new
    again = _sweep(_write(tmp_path / "b.jsonl", texts), out, batch_size=2)
    assert again.manifest["counts"]["done_before"] == 3 and again.manifest["counts"]["done_now"] == 1
    norms = pd.read_parquet(out / "norms")  # the folder reads as one table
    assert pd.api.types.is_string_dtype(norms.id) and set(norms.id) == {"0", "1", "2", "3", "two"}
    assert not norms.duplicated(KEYS).any()


def test_resume_with_another_batch_size(tmp_path):
    rows = _prompts(9)
    out, ref = tmp_path / "run", tmp_path / "ref"
    _sweep(_write(tmp_path / "first.jsonl", dict(list(rows.items())[:5])), out, batch_size=2)
    again = _sweep(_write(tmp_path / "all.jsonl", rows), out, batch_size=3)
    assert again.manifest["counts"]["done_before"] == 5 and again.manifest["counts"]["done_now"] == 4
    _sweep(tmp_path / "all.jsonl", ref, batch_size=1)
    got, want = _norms(out), _norms(ref)
    _assert_once(got, rows)
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-5, atol=1e-6)


def test_factor_shards_hold_the_chosen_layers_only(tmp_path):
    """``--layers`` with ``--factors``: the shards and the norms table hold the same layers, with true indices."""
    out = tmp_path / "run"
    _sweep(_write(tmp_path / "a.jsonl", _prompts(2)), out, layers=[1], factors=True)
    shards = TokenPatches.load_many(next((out / "factors").glob("*.safetensors")))
    assert shards and all(p.layers == (1,) and p.n_layers == 1 for p in shards.values())
    assert set(_norms(out).layer) == {1}


@pytest.fixture(scope="module")
def patch_file(tmp_path_factory):
    from icl_lens import load_model

    path = tmp_path_factory.mktemp("patches") / "p.safetensors"
    token_patches(load_model("tiny-llama"), "The cat sat.").save(path)
    return path


def _contents(path: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        header = json.loads(f.metadata()["icl_lens"])
    return load_file(str(path)), header


def _entry(**change) -> callable:
    return lambda t, h: (t, {**h, "entries": [{**h["entries"][0], **change}]})


def _tensor(name: str, fn) -> callable:
    return lambda t, h: ({**t, f"0.{name}": fn(t[f"0.{name}"])}, h)


MALFORMED = {
    "no header": (lambda t, h: (t, None), "no icl_lens header"),
    "header not JSON": (lambda t, h: (t, "{oops"), "not valid JSON"),
    "header nested 100k deep": (lambda t, h: (t, "[" * 100_000 + "]" * 100_000), "not valid JSON"),
    "header a list": (lambda t, h: (t, [h]), "not a JSON object"),
    "other version": (lambda t, h: (t, {**h, "version": 3}), "unsupported format"),
    "version true": (lambda t, h: (t, {**h, "version": True}), "unsupported format"),
    "no entries": (lambda t, h: (t, {k: v for k, v in h.items() if k != "entries"}), "entries are not a list"),
    "entries an object": (lambda t, h: (t, {**h, "entries": {"0": 1}}), "entries are not a list"),
    "entry a number": (lambda t, h: (t, {**h, "entries": [3]}), "entry 0 is not a JSON object"),
    "entry without tokens": (lambda t, h: (t, {**h, "entries": [{k: v for k, v in h["entries"][0].items()
                                                                  if k != "tokens"}]}), "'tokens' is missing"),
    "tokens a string": (_entry(tokens="abc"), "'tokens' is missing or not a list"),
    "a token not text": (_entry(tokens=[1, 2, 3, 4, 5]), "non-text token"),
    "kept_bos not a bool": (_entry(kept_bos="yes"), "'kept_bos' is missing or not a bool"),
    "key not text": (_entry(key=5), "'key' is missing or not a str"),
    "positions not indices": (_entry(positions="all"), "'positions' is not a list of indices"),
    "layers a negative index": (_entry(layers=[-1]), "'layers' is not a list of indices"),
    "one layer fewer than v": (lambda t, h: _entry(layers=list(range(len(h["entries"][0].get("layers")
                                                    or [0, 1]) - 1)))(t, h), "layers in the header but"),
    "a position past the tokens": (lambda t, h: _entry(positions=[0] * (len(h["entries"][0]["tokens"]) - 1)
                                                      + [999])(t, h), "tokens in the header but position 999"),
    "tokens fewer than positions": (lambda t, h: _entry(tokens=h["entries"][0]["tokens"][:-1])(t, h),
                                    "tokens in the header but"),
    "v one position short": (_tensor("v", lambda x: x[:, :-1]), "has shape"),
    "delta of another width than v": (_tensor("delta", lambda x: x[..., :-1]), "delta has shape"),
    "u_norm one position short": (_tensor("u_norm", lambda x: x[:, :-1]), "u_norm has shape"),
    "correction 2-D": (_tensor("correction", lambda x: x[0]), "correction has shape"),
    "token_ids float": (_tensor("token_ids", lambda x: x.double()), "token_ids must be integers"),
    "delta integer": (_tensor("delta", lambda x: x.int()), "one floating dtype"),
    "v float64 beside float32": (_tensor("v", lambda x: x.double()), "one floating dtype"),
    "zero_input float": (_tensor("zero_input", lambda x: x.float()), "zero_input must be bool"),
    "a tensor missing": (lambda t, h: ({k: v for k, v in t.items() if k != "0.correction"}, h),
                         "missing tensor\\(s\\) correction"),
    "kept missing": (_entry(default_kept=False), "missing tensor\\(s\\) kept"),
    "delta missing": (lambda t, h: ({k: v for k, v in t.items() if k != "0.delta"}, h), "missing tensor\\(s\\) delta"),
    "gated not a bool": (_entry(gated="yes"), "'gated' is missing or not a bool"),
    "weights_checksum not a list": (_entry(weights_checksum=3), "'weights_checksum' is not a list"),
    "a tensor no entry describes": (lambda t, h: ({**t, "1.v": t["0.v"]}, h), "no header entry describes: 1.v"),
    "a repeated key": (lambda t, h: ({**t, **{k.replace("0.", "1.", 1): v for k, v in t.items()}},
                                     {**h, "entries": h["entries"] * 2}), "repeats the key"),
    # issue 43: indices that are not increasing or out of range, non-finite or negative norms
    "layers repeated": (lambda t, h: _entry(layers=[0] * len(h["entries"][0]["layers"]))(t, h), "'layers' is not increasing"),
    "layers unsorted": (lambda t, h: _entry(layers=h["entries"][0]["layers"][::-1])(t, h), "'layers' is not increasing"),
    "a layer past the model's": (lambda t, h: _entry(layers=h["entries"][0]["layers"][:-1] + [2 ** 70])(t, h),
                                 r"layer 1180591620717411303424 in the header is out of range \(the model has 3 layers\)"),
    "a huge layer, no checksum": (lambda t, h: _entry(weights_checksum=None, layers=h["entries"][0]["layers"][:-1]
                                                      + [10 ** 30])(t, h), r"out of range \(at most 10000 layers\)"),
    "positions repeated": (lambda t, h: _entry(positions=[0] * len(h["entries"][0]["tokens"]))(t, h),
                           "'positions' is not increasing"),
    "positions unsorted": (lambda t, h: _entry(positions=list(range(len(h["entries"][0]["tokens"])))[::-1])(t, h),
                           "'positions' is not increasing"),
    "u_norm NaN": (_tensor("u_norm", lambda x: torch.where(x == x.max(), torch.nan, x)), "u_norm holds non-finite"),
    "u_norm inf": (_tensor("u_norm", lambda x: torch.where(x == x.max(), torch.inf, x)), "u_norm holds non-finite"),
    "u_norm negative": (_tensor("u_norm", lambda x: -x), "u_norm holds negative norms"),
    "v with an inf": (_tensor("v", lambda x: torch.where(x == x.max(), -torch.inf, x)), "v holds non-finite"),
    "delta NaN": (_tensor("delta", lambda x: torch.full_like(x, torch.nan)), "delta holds non-finite"),
    "a negative token id": (_tensor("token_ids", lambda x: x - 1000), "token_ids holds a negative id"),
    "no positions": (lambda t, h: ({k: (v[:, :0] if k.split(".")[1] in ("v", "delta", "correction", "u_norm", "zero_input")
                                        else v) for k, v in t.items()}, h), "holds 3 layers and 0 positions"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_patch_file_is_one_clear_error(patch_file, tmp_path, case):
    from safetensors.torch import save_file

    change, message = MALFORMED[case]
    tensors, header = change(*_contents(patch_file))
    path = tmp_path / "bad.safetensors"
    meta = None if header is None else {"icl_lens": header if isinstance(header, str) else json.dumps(header)}
    save_file({k: v.clone().contiguous() for k, v in tensors.items()}, str(path), metadata=meta)
    with pytest.raises(PatchFileError, match=message):
        TokenPatches.load(path)
    with pytest.raises(PatchFileError, match=message):
        TokenPatches.load_many(path)


def test_the_unmodified_patch_file_loads(patch_file):
    tensors, header = _contents(patch_file)
    loaded = TokenPatches.load(patch_file)
    assert torch.equal(loaded.delta, tensors["0.delta"]) and list(loaded.tokens) == header["entries"][0]["tokens"]
    assert header["version"] == 2 and "0.u_in" not in tensors  # δ stored, u formed on demand


def test_a_truncated_patch_file_is_one_clear_error(patch_file, tmp_path):
    data = patch_file.read_bytes()
    for cut in (len(data) // 2, len(data) - 1, 7):
        path = tmp_path / f"cut{cut}.safetensors"
        path.write_bytes(data[:cut])
        with pytest.raises(PatchFileError, match="is not a safetensors file"):
            TokenPatches.load(path)


BOMB = """
import json, resource, sys, time
import torch
from safetensors.torch import save_file
from icl_lens import TokenPatches
from icl_lens.patches._patch_set import PatchFileError
n, path, all_positions = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "all"
pos = n if all_positions else 1
d = 1 if all_positions else 4
tensors = {"0.delta": torch.zeros(1, pos, d, dtype=torch.float16), "0.v": torch.zeros(1, pos, d, dtype=torch.float16),
           "0.correction": torch.zeros(1, pos, d, dtype=torch.float16), "0.u_norm": torch.zeros(1, pos),
           "0.zero_input": torch.zeros(1, pos, dtype=torch.bool), "0.token_ids": torch.zeros(n, dtype=torch.uint8)}
entry = {"key": "0", "model": "m", "tokens": [""] * n, "kept_bos": True, "default_kept": True, "gated": False,
         "weights_checksum": None, "layers": [0], "positions": list(range(n)) if all_positions else [n - 1]}
save_file(tensors, path, metadata={"icl_lens": json.dumps({"format": "icl_lens.token_patches", "version": 2,
                                                            "entries": [entry]})})
del tensors
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
try:
    p = TokenPatches.load(path)
    outcome = f"loaded {p.kept.shape[0]}x{p.kept.shape[1]}"
except PatchFileError as err:
    outcome = f"PatchFileError: {err}"
print(json.dumps({"outcome": outcome, "grew": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before,
                  "seconds": time.perf_counter() - start}))
"""


@pytest.mark.parametrize("positions", ["one", "all"])
def test_a_header_of_120000_tokens_cannot_bomb_a_load(tmp_path, positions):
    """Issue 43: 120,000 empty tokens in a sub-MB file once made the load build a 14 GB kept mask (torch.eye(n)).

    One position held: loads, its kept mask one row; every position held (with one-float tensors): refused
    before the 120,000 × 120,000 mask is built. Either way the process grows by well under 100 MB."""
    path = tmp_path / "bomb.safetensors"
    done = subprocess.run([sys.executable, "-c", BOMB, "120000", str(path), positions], env=ENV, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert path.stat().st_size < 5_000_000
    if positions == "one":
        assert result["outcome"] == "loaded 1x120000"
    else:
        assert result["outcome"].startswith("PatchFileError") and "default kept mask of 120000 positions" in result["outcome"]
    assert result["grew"] < 100 * 2**20, result
