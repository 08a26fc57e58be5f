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


VM_STAT = """Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                                5000.
Pages active:                            200000.
Pages inactive:                          100000.
Pages speculative:                         3000.
Pages throttled:                              0.
Pages wired down:                         90000.
Pages purgeable:                           2000.
"Translation faults":                 123456789.
Pages copy-on-write:                    4567890.
Pages stored in compressor:              300000.
Pages occupied by compressor:             80000.
"""
MAC_AVAILABLE = (5000 + 100000 + 3000 + 2000) * 16384  # free + inactive + speculative + purgeable pages


def test_vm_stat_is_read_as_macos_reports_it():
    assert preflight.vm_stat_available(VM_STAT) == MAC_AVAILABLE
    assert preflight.vm_stat_available("vm_stat: command not understood") is None


def _run_without_proc_or_psutil(tmp_path, path_dirs, *args):
    """The script as on a Mac's system Python: no /proc/meminfo, psutil not importable, PATH = ``path_dirs``."""
    code = ("import sys, pathlib, importlib.util; sys.modules['psutil'] = None\n"
            f"spec = importlib.util.spec_from_file_location('preflight', {str(SCRIPT)!r})\n"
            "p = importlib.util.module_from_spec(spec); sys.modules['preflight'] = p; spec.loader.exec_module(p)\n"
            "p.MEMINFO = pathlib.Path('/no/proc/meminfo')\n"
            "sys.exit(p.main(sys.argv[1:]))")
    env = {"PATH": ":".join(map(str, path_dirs)), "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=env)


def test_system_stage_on_macos_reads_sysctl_and_vm_stat_without_psutil(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vm_stat").write_text("#!/bin/sh\ncat <<'END'\n" + VM_STAT + "END\n")
    (bin_dir / "sysctl").write_text('#!/bin/sh\n[ "$2" = hw.memsize ] && echo 17179869184\n')
    for tool in ("vm_stat", "sysctl"):
        (bin_dir / tool).chmod(0o755)
    done = _run_without_proc_or_psutil(tmp_path, [bin_dir, "/bin", "/usr/bin"], "--stage", "system",
                                       "--min-ram-gb", "0.1", "--min-disk-gb", "0.1")
    assert done.returncode == 0, done.stdout + done.stderr
    ram = next(line for line in done.stdout.splitlines() if line.split()[1] == "ram")
    assert ram.startswith("PASS") and f"{MAC_AVAILABLE / preflight.GB:.1f} GB available" in ram
    short = _run_without_proc_or_psutil(tmp_path, [bin_dir, "/bin", "/usr/bin"], "--stage", "system",
                                        "--min-ram-gb", "100")
    assert short.returncode == 1 and short.stdout.strip().endswith("FAILED: ram")


def test_system_stage_warns_and_goes_on_where_memory_cannot_be_read(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _run_without_proc_or_psutil(tmp_path, [empty], "--stage", "system", "--min-disk-gb", "0.1")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["PASS", "WARN", "PASS"]
    assert "check it by hand" in lines[1] and lines[-1] == "preflight: all 3 passed (check by hand: ram)"
