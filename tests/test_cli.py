"""The CLI: JSON output, safetensors export, the tolerance's exit status, input checked before
loading, and the error contract (one line on stderr, status 2, no traceback, nothing heavy
imported before an argument error; memory estimated and checked before a prompt runs)."""
import json
import os
import resource
import subprocess
import sys

import pytest
import torch

from icl_lens import TokenPatches
from icl_lens.cli import estimate_patches_memory, parse_size


def _run(*args, env=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "icl_lens.cli", *args], capture_output=True, text=True, timeout=300,
                          env=None if env is None else {**os.environ, **env}, **kwargs)


def _one_line_error(proc, *words):
    """Status 2 and exactly one line on stderr, holding ``words``."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[0].startswith("icl-lens") and all(w in lines[0] for w in words), lines[0]


def test_patches_json_and_safetensors(tmp_path):
    out = tmp_path / "p.safetensors"
    proc = _run("patches", "abc abc", "--model", "tiny-llama", "--dtype", "float64", "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"model", "tokens", "token_ids", "kept_bos", "norms", "correction_norms",
                         "equivalence_max_abs_err", "max_abs_logit", "relative_error", "tolerance", "noise_floor",
                         "exact"}
    n = len(data["tokens"])
    assert n == 8 and data["kept_bos"] and len(data["norms"]) == 3 and len(data["norms"][0]) == n
    assert data["tolerance"] == 1e-9 and data["exact"] is True
    assert data["relative_error"] == data["equivalence_max_abs_err"] / data["max_abs_logit"] <= 1e-9
    assert data["noise_floor"] is None  # float64: a fixed tolerance, no half-precision floor
    saved = TokenPatches.load(out)  # --out writes TokenPatches.save's format
    assert saved.u_in.shape == (3, n, 160) and saved.v.shape == (3, n, 64) and saved.u_in.dtype == torch.float64
    assert saved.token_ids.tolist() == data["token_ids"] and saved.kept_bos
    assert torch.allclose(saved.norms().double(), torch.tensor(data["norms"], dtype=torch.float64), rtol=1e-12)


def test_plain_mlp_has_no_gate_and_errors_are_clean(tmp_path):
    out = tmp_path / "g.safetensors"
    assert _run("patches", "hi there", "--model", "tiny-gpt2", "--out", str(out)).returncode == 0
    assert TokenPatches.load(out).u_gate is None
    proc = _run("patches", "   ", "--model", "tiny-gpt2")
    assert proc.returncode == 2 and "empty" in proc.stderr and "Traceback" not in proc.stderr


def test_equivalence_above_tolerance_exits_nonzero():
    """float32 errors are ~1e-7 relative: a 1e-12 tolerance must fail, with status 1 and a message."""
    proc = _run("patches", "abc abc", "--model", "tiny-llama", "--json", "--tolerance", "1e-12")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["exact"] is False and data["relative_error"] > 1e-12
    assert "exceeds the tolerance" in proc.stderr
    assert _run("patches", "abc abc", "--model", "tiny-llama", "--tolerance", "0").returncode == 2


def test_input_is_checked_before_any_model_loads():
    """An empty prompt with a model that does not exist: the prompt error wins, so nothing was loaded."""
    proc = _run("patches", "  ", "--model", "no-such-model-anywhere")
    assert proc.returncode == 2 and "prompt is empty" in proc.stderr
    proc = _run("thought-eval", "missing-task.jsonl", "--model", "no-such-model-anywhere")
    assert proc.returncode == 2 and "not found" in proc.stderr


HEAVY = ("torch", "transformer_lens", "transformers")


@pytest.mark.parametrize("args,words", [
    (["--help"], ()),
    (["patches", ""], ("empty",)),
    (["patches", "   "], ("empty",)),
    (["patches", "hi", "--dtype", "float8"], ("--dtype", "float8")),
    (["patches", "hi", "--device", "tpu"], ("unknown device", "tpu")),
    (["patches", "hi", "--max-memory", "lots"], ("--max-memory", "lots")),
    (["patches", "hi", "--out", "/"], ("is a directory",)),
    (["sweep", "no-such-prompts.jsonl", "--out", "x"], ("no-such-prompts.jsonl", "does not exist")),
    (["thought-eval", "no-such-task.jsonl"], ("not found",)),
    (["prepare", "no-such-model"], ("not embedded",)),
    (["no-such-command"], ("no-such-command",)),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_arguments_are_checked_before_torch_is_imported(args, words):
    """``python -m icl_lens`` (the console script's import chain) answers ``--help`` and every argument
    error without importing torch, TransformerLens or transformers: ``-X importtime`` lists every module."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "icl_lens", *args], capture_output=True,
                          text=True, timeout=60)
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "icl_lens.cli" in imported
    heavy = [m for m in imported if m.split(".")[0] in HEAVY]
    assert not heavy, f"imported before answering: {heavy[:5]}"
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    if args == ["--help"]:
        assert proc.returncode == 0 and "patches" in proc.stdout and "Exit status" in proc.stdout and not errors
    else:
        _one_line_error(subprocess.CompletedProcess(args, proc.returncode, "", "\n".join(errors)), *words)


def test_out_is_checked_before_the_model_loads(tmp_path):
    """A folder, a missing folder, a read-only place, a device file: one line each, before any model
    work (the model name does not exist, so a later check would fail on the model instead)."""
    folder = tmp_path / "folder"
    folder.mkdir()
    cases = {
        str(folder): "is a directory",
        str(tmp_path / "missing" / "p.safetensors"): "does not exist",
        "/sys/icl-lens-test.safetensors": "not writable",  # sysfs: no new files, even for root
        "/dev/null": "not a regular file",  # never replaced by the atomic rename of the save
    }
    for out, words in cases.items():
        _one_line_error(_run("patches", "hi", "--model", "no-such-model-anywhere", "--out", out), words)
    assert list(folder.iterdir()) == []
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": 1, "prompt": "hi"}\n')
    for out, words in {str(prompts): "not a folder", "/sys/icl-lens-test/sweep": "not writable"}.items():
        _one_line_error(_run("sweep", str(prompts), "--model", "no-such-model-anywhere", "--out", out), words)


def test_a_failed_write_is_one_line_and_leaves_no_file(tmp_path):
    """The disk fills up while the factors are written (a 4 kB file-size limit: writes fail with EFBIG,
    as with ENOSPC): status 2, one line, and neither the file nor its temporary copy is left."""
    out = tmp_path / "p.safetensors"

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    proc = _run("patches", "abc abc", "--model", "tiny-llama", "--out", str(out), preexec_fn=small_files,
                env={"PYTHONDONTWRITEBYTECODE": "1"})
    _one_line_error(proc, "File too large")
    assert list(tmp_path.iterdir()) == []


def test_binary_prompt_unknown_model_and_long_prompt_are_one_line(tmp_path):
    garbage = os.fsdecode(bytes(range(128, 256)) + b"abc")  # not UTF-8: arrives as lone surrogates
    _one_line_error(_run("patches", garbage, "--model", "no-such-model-anywhere"), "not UTF-8", "0x80")
    proc = _run("patches", "hi", "--model", "no-such-org/no-such-model", env={"HF_HUB_OFFLINE": "1"})
    _one_line_error(proc, "no-such-org/no-such-model", "gemma-3-270m")
    traced = _run("patches", "hi", "--model", "no-such-org/no-such-model",
                  env={"HF_HUB_OFFLINE": "1", "ICL_LENS_TRACEBACK": "1"})
    assert "Traceback" in traced.stderr and "ModelNotFoundError" in traced.stderr
    _one_line_error(_run("patches", "x" * 300, "--model", "tiny-llama"), "301 tokens", "at most 256")


def test_memory_estimate_refuses_before_any_work_and_force_overrides(load):
    model = load("tiny-llama")
    need = estimate_patches_memory(model, 8)  # "abc abc" is 8 tokens with BOS
    assert need.total == need.to_frame().set_index("part").loc["total", "bytes"]
    budget = need.total - 1
    proc = _run("patches", "abc abc", "--model", "tiny-llama", "--json", "--max-memory", str(budget))
    _one_line_error(proc, need.describe(), "--force")
    assert proc.stdout == ""
    forced = _run("patches", "abc abc", "--model", "tiny-llama", "--json", "--max-memory", str(budget), "--force")
    assert forced.returncode == 0 and json.loads(forced.stdout)["exact"]
    assert _run("patches", "abc abc", "--model", "tiny-llama", "--max-memory", str(need.total)).returncode == 0
    # grows with the prompt: linearly in the factors and logits, quadratically in the attention scores
    longer = estimate_patches_memory(model, 80)
    assert longer.factors == 10 * need.factors and longer.equivalence == 10 * need.equivalence
    assert longer.weights == need.weights and longer.activations > 10 * need.activations
    assert parse_size("4GB") == 4 * 10**9 and parse_size("1.5GiB") == 3 * 2**29 and parse_size("512") == 512


MEASURE = """
import json, sys, threading, time
import psutil, torch
from icl_lens import load_model, token_patches, verify_equivalence
from icl_lens.cli import estimate_patches_memory

torch.set_num_threads(1)
model = load_model("smollm2-135m")
prompt = " ".join(f"word{i}" for i in range(int(sys.argv[1])))
n = model.to_tokens(prompt).shape[1]
proc, peak, done = psutil.Process(), [0], []

def sample():
    while not done:
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.002)

start = proc.memory_info().rss
thread = threading.Thread(target=sample)
thread.start()
verify_equivalence(model, prompt, token_patches(model, prompt))
done.append(1)
thread.join()
print(json.dumps({"tokens": n, "measured": peak[0] - start, "estimate": estimate_patches_memory(model, n).total}))
"""


def test_memory_estimate_matches_a_real_run():
    """Peak RSS of token patches + the equivalence check on SmolLM2-135M (~300 tokens, ~0.8 GB)
    against the estimate: the same order of magnitude (within a factor of 2 either way)."""
    proc = subprocess.run([sys.executable, "-c", MEASURE, "120"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["tokens"] > 200
    assert 0.5 <= got["measured"] / got["estimate"] <= 2, got


LONG_PROMPT = r"""
import json, sys, torch
from icl_lens import load_model, token_patches
torch.set_num_threads(1)
model = load_model("smollm2-135m")
ids = model.to_tokens(" ".join(f"word{i}" for i in range(1500)), truncate=False)[0][:2048]
chunk = {} if sys.argv[1] == "default" else {"query_chunk": None}
token_patches(model, ids[:64], layers=[0], **chunk)
def kib(field):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field + ":"))
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
start = kib("VmRSS")
token_patches(model, ids, layers=[0], **chunk)
print(json.dumps({"tokens": int(ids.numel()), "growth_mib": (kib("VmHWM") - start) / 1024}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="reads and resets Linux's VmHWM")
def test_a_long_prompt_holds_the_attention_scores_of_one_chunk():
    """2,048 tokens of SmolLM2, layer 0 only (the forward stops after it, so its attention scores are most of what
    the call holds), each in a fresh process with glibc's own heap settings (``ICL_LENS_TOP_PAD_MB=0``: every freed
    block goes back, so the peak is what was live at once): run by default in chunks of 512 queries, the peak grows by
    well under half of what one forward's 2,048 × 2,048 scores take (measured 84-139 MiB against 340-357 MiB)."""
    def growth(mode: str) -> dict:
        proc = subprocess.run([sys.executable, "-c", LONG_PROMPT, mode], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                                   "ICL_LENS_TOP_PAD_MB": "0"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    chunked, whole = growth("default"), growth("whole")
    assert chunked["tokens"] == whole["tokens"] == 2048
    assert chunked["growth_mib"] <= 0.5 * whole["growth_mib"], (chunked, whole)


def test_version_names_the_package_and_what_it_runs_on():
    """Issue 43: ``icl-lens --version`` (it did not exist): the package's version (pyproject's), torch's,
    TransformerLens's and transformers', status 0, without importing torch."""
    import re
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    pinned = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["version"]
    proc = _run("--version")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    line = proc.stdout.strip()
    assert line.startswith(f"icl-lens {pinned} (") and f"torch {version('torch')}" in line, line
    assert f"transformer-lens {version('transformer-lens')}" in line and re.search(r"Python 3\.\d+", line), line
    light = subprocess.run([sys.executable, "-c", "import sys\nfrom icl_lens.cli import main\ntry:\n    main(['--version'])\n"
                            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)"],
                           capture_output=True, text=True, timeout=120)
    assert light.stdout.strip().splitlines()[-1] == "0 False", light.stdout + light.stderr
