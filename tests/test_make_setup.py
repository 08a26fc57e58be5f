"""`make setup` as a laptop runs it, with pip and the venv replaced by recorders (nothing is downloaded): on Linux
without an NVIDIA driver torch comes from PyTorch's CPU index, on macOS and with a driver from pip's own
configuration; the same index twice installs once; another index reinstalls torch from it; a venv installed before
the index was recorded is taken as it is."""
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU = "https://download.pytorch.org/whl/cpu"
RECORDER = '#!/bin/sh\necho "$(basename "$0") $*" >> "{log}"\n'


def _tools(tmp_path, **fakes) -> Path:
    """A bin folder of recorders (pip, python3) and the given fake commands (nvidia-smi, uname), first on PATH."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for name, body in {"pip": RECORDER, "python3": RECORDER, **fakes}.items():
        (tools / name).write_text(body.format(log=tmp_path / "calls.log"))
        (tools / name).chmod(0o755)
    return tools


def _setup(tmp_path, tools, *variables) -> list[str]:
    """Run `make setup` on a venv under tmp_path with the recorders; return the pip/python calls it made."""
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    venv = tmp_path / "venv"
    if not os.path.exists(f"{venv}/bin"):
        shutil.copytree(tools, venv / "bin")
    path = f"{tools}:/usr/bin:/bin"
    # a machine with a real driver (the GPU runner) is told there is none, unless a fake nvidia-smi is on PATH
    driverless = ["NVIDIA="] if os.path.exists("/proc/driver/nvidia/version") and not (tools / "nvidia-smi").exists() \
        else []
    done = subprocess.run(["make", "--no-print-directory", "setup", f"VENV={venv}", "PY=python3", *driverless,
                           *variables], cwd=ROOT, env=dict(os.environ, PATH=path), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return log.read_text().splitlines() if log.exists() else []


def _torch(calls: list[str]) -> list[str]:
    return [c for c in calls if "torch" in c]


def test_linux_without_a_driver_gets_the_cpu_build_and_another_index_reinstalls(tmp_path):
    tools = _tools(tmp_path, uname="#!/bin/sh\necho Linux\n")
    first = _setup(tmp_path, tools)
    assert _torch(first) == [f"pip install -q --index-url {CPU} torch==2.13.0"], first
    assert (tmp_path / "venv" / ".installed").read_text().strip() == CPU
    assert _setup(tmp_path, tools) == []  # the same index again: nothing to install
    other = "https://download.pytorch.org/whl/cu128"
    again = _torch(_setup(tmp_path, tools, f"TORCH_INDEX={other}"))
    assert again == ["pip uninstall -y -q torch", f"pip install -q --index-url {other} torch==2.13.0"], again
    back = _torch(_setup(tmp_path, tools, "TORCH_INDEX="))  # pip's own configuration, asked for by name
    assert back == ["pip uninstall -y -q torch", "pip install -q torch==2.13.0"], back


def test_macos_and_linux_with_a_driver_keep_pips_configuration(tmp_path):
    mac = tmp_path / "mac"
    mac.mkdir()
    assert _torch(_setup(mac, _tools(mac, uname="#!/bin/sh\necho Darwin\n"))) == ["pip install -q torch==2.13.0"]
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    tools = _tools(gpu, uname="#!/bin/sh\necho Linux\n", **{"nvidia-smi": "#!/bin/sh\nexit 0\n"})
    assert _torch(_setup(gpu, tools)) == ["pip install -q torch==2.13.0"]


def test_a_venv_installed_before_the_index_was_recorded_is_kept(tmp_path):
    tools = _tools(tmp_path, uname="#!/bin/sh\necho Linux\n")
    venv = tmp_path / "venv"
    shutil.copytree(tools, venv / "bin")
    (venv / ".installed").touch()  # the stamp of an older Makefile: empty, no .torch-index beside it
    os.utime(venv / ".installed", (2e9, 2e9))  # newer than pyproject.toml
    assert _setup(tmp_path, tools) == []
    assert (venv / ".torch-index").read_text().strip() == CPU
