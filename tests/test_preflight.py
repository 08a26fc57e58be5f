"""notebooks/workshop/preflight.py: one PASS/FAIL line per item with what to do, exit status 1 on any failure, a real
(tiny) model for the model item, and the whole check well under two minutes."""
import importlib.util
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).parents[1]
SCRIPT = ROOT / "notebooks" / "workshop" / "preflight.py"
spec = importlib.util.spec_from_file_location("preflight", SCRIPT)
preflight = importlib.util.module_from_spec(spec)
sys.modules["preflight"] = preflight  # dataclasses look their module up
spec.loader.exec_module(preflight)


def test_each_item_passes_or_says_what_to_do():
    assert preflight.check_python((3, 10)).ok
    old = preflight.check_python((99, 0))
    assert not old.ok and "need ≥ 99.0" in old.found and "PY=" in old.fix and old.line().startswith("FAIL  python")
    assert preflight.check_ram(0.0).ok
    ram = preflight.check_ram(1e9)
    assert not ram.ok and "Binder" in ram.line()
    assert preflight.check_disk(0.0).ok
    disk = preflight.check_disk(1e9)
    assert not disk.ok and "→" in disk.line()
    assert preflight.check_widget().ok


def test_model_item_loads_a_real_model_and_names_the_fix():
    ok = preflight.check_model("tiny-llama")
    assert ok.ok and "identity error" in ok.found and ok.line().startswith("PASS  model")
    missing = preflight.check_model("no-such-model-anywhere")
    assert not missing.ok and "make models" in missing.fix


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


def test_script_prints_one_line_per_item_and_fails_with_status_1():
    start = time.perf_counter()
    done = _run("--model", "tiny-gpt2", "--min-ram-gb", "0.1", "--min-disk-gb", "0.1")
    assert time.perf_counter() - start < 120
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split()[1] for line in lines[:-1]] == ["python", "ram", "disk", "model", "widget"]
    assert all(line.startswith("PASS") for line in lines[:-1]) and lines[-1] == "preflight: all 5 passed"
    short = _run("--stage", "system", "--min-ram-gb", "1e9")
    assert short.returncode == 1
    assert [line.split()[0] for line in short.stdout.splitlines()[:3]] == ["PASS", "FAIL", "PASS"]
    assert short.stdout.strip().endswith("FAILED: ram")
