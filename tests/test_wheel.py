"""A built wheel works on its own: the checkout is built into a wheel, installed into a
fresh venv, and imported from there (dependencies come from the running interpreter's
site-packages through PYTHONPATH, which does not process the dev venv's editable-install
``.pth``, so ``icl_lens`` is the wheel's copy). Every package-data file declared in
pyproject.toml is installed, and the dashboard's front-end assets, shipped tasks, data
file and lab checkpoints load from the fresh venv.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IGNORED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "artifacts", "*.egg-info", "__pycache__",
                                 ".pytest_cache", ".ipynb_checkpoints", "icl_lens_exports")

PROBE = """
import json, sys
import icl_lens
from icl_lens.lab import load_lab_model
from icl_lens.lab.mixers import ARCHITECTURES
from icl_lens.thought.tasks import SHIPPED_TASKS, load_task
from icl_lens.ui.token_strip import TokenStrip

print(json.dumps({
    "icl_lens": icl_lens.__file__,
    "esm": str(TokenStrip._esm._path), "css": str(TokenStrip._css._path),
    "esm_exports": "export default" in str(TokenStrip._esm),
    "tasks": {name: len(load_task(name).test) for name in SHIPPED_TASKS},
    "lab_models": {arch: sum(p.numel() for p in load_lab_model(arch).parameters()) for arch in ARCHITECTURES},
}))
"""


def _package_data(package_root: Path) -> set[str]:
    """Files under ``package_root`` matched by pyproject's ``[tool.setuptools.package-data]``."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["icl_lens"]
    return {str(p.relative_to(package_root)) for pattern in patterns for p in package_root.glob(pattern)
            if p.is_file()}


def test_wheel_installs_with_its_data(tmp_path):
    source = tmp_path / "src"  # a copy: an in-tree build would reuse (stale) build/ folders of the checkout
    shutil.copytree(ROOT, source, ignore=IGNORED, symlinks=True)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(source)], check=True, cwd=tmp_path)
    (wheel,) = wheels.glob("icl_lens-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, cwd=tmp_path)

    env = dict(os.environ, PYTHONPATH=sysconfig.get_paths()["purelib"], HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    run = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])

    installed = Path(found["icl_lens"]).parent
    assert installed.is_relative_to(env_dir), found["icl_lens"]
    for asset in ("esm", "css"):
        path = Path(found[asset])
        assert path.is_file() and path.is_relative_to(installed / "ui" / "widgets"), path
    assert found["esm_exports"], "token_strip.js has no default export"
    assert not (installed / "widgets").exists(), "the old symlinked asset folder is back"
    assert all(n > 0 for n in found["tasks"].values()) and found["tasks"]
    assert found["lab_models"] and all(n > 0 for n in found["lab_models"].values())
    # every package-data file of the checkout is in the wheel's installation
    declared = _package_data(ROOT / "icl_lens")
    assert "ui/widgets/token_strip.js" in declared and "ui/widgets/token_strip.css" in declared
    assert declared <= _package_data(installed)
