"""The CLI: JSON output, safetensors export, the tolerance's exit status, input checked before loading."""
import json
import subprocess
import sys

import torch

from icl_lens import TokenPatches


def _run(*args):
    return subprocess.run([sys.executable, "-m", "icl_lens.cli", *args], capture_output=True, text=True, timeout=300)


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
