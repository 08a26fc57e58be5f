"""The prepared GPU check runs end to end in its quick CPU mode and writes its fragment to the report path and $OUT."""
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[1]


def test_gpu_check_quick_cpu_mode(tmp_path):
    report, out = tmp_path / "reports" / "bench_gpu.md", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "DEVICE": "cpu", "ICL_LENS_GPU_CHECK_QUICK": "1", "ICL_LENS_GPU_CHECK_REPORT": str(report),
           "OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[gpu_check" in proc.stdout  # progress is printed
    text = report.read_text()
    assert text == (out / "bench_gpu.md").read_text()
    assert "Command: `DEVICE=cpu ICL_LENS_GPU_CHECK_QUICK=1 bash benchmarks/gpu_check.sh`" in text
    for heading in ("### Equivalence on the device", "### Long contexts", "### Batched throughput"):
        assert heading in text
    assert "Error in" not in text and "| NO |" not in text and "NOT within" not in text
    results = json.loads((out / "bench_gpu.json").read_text())
    models = {r["model"] for r in results["equivalence"]}
    assert {"tiny-gpt2", "tiny-llama", "tiny-gemma3", "random Gemma 3 270M shape", "random SmolLM2-135M shape"} <= models
    assert all(r["fp32_exact"] and r["bf16_exact"] for r in results["equivalence"])
    assert {(r["dtype"], r["tokens"]) for r in results["long_context"]} == {
        (d, n) for d in ("float32", "bfloat16") for n in (64, 256)}
    assert len(results["throughput"]) == 2
