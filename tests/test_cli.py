"""The CLI: JSON output and safetensors export."""
import json
import subprocess
import sys

from safetensors import safe_open


def _run(*args):
    return subprocess.run([sys.executable, "-m", "icl_lens.cli", *args], capture_output=True, text=True, timeout=300)


def test_patches_json_and_safetensors(tmp_path):
    out = tmp_path / "p.safetensors"
    proc = _run("patches", "abc abc", "--model", "tiny-llama", "--dtype", "float64", "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"model", "tokens", "token_ids", "kept_bos", "norms", "correction_norms",
                         "equivalence_max_abs_err", "max_abs_logit"}
    n = len(data["tokens"])
    assert n == 8 and data["kept_bos"] and len(data["norms"]) == 3 and len(data["norms"][0]) == n
    assert data["equivalence_max_abs_err"] <= 1e-9 * data["max_abs_logit"]
    with safe_open(str(out), "pt") as f:
        assert set(f.keys()) == {"u_in", "u_gate", "v", "correction", "tokens"}
        assert f.get_tensor("u_in").shape == (3, n, 160)
        assert f.get_tensor("v").shape == (3, n, 64)
        assert f.get_tensor("tokens").tolist() == data["token_ids"]


def test_plain_mlp_has_no_gate_and_errors_are_clean(tmp_path):
    out = tmp_path / "g.safetensors"
    assert _run("patches", "hi there", "--model", "tiny-gpt2", "--out", str(out)).returncode == 0
    with safe_open(str(out), "pt") as f:
        assert "u_gate" not in f.keys()
    proc = _run("patches", "   ", "--model", "tiny-gpt2")
    assert proc.returncode == 2 and "empty" in proc.stderr and "Traceback" not in proc.stderr
