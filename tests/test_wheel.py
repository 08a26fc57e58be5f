"""A built wheel works on its own: the checkout is built into a wheel, installed into a
fresh venv, and imported from there (dependencies come from the running interpreter's
site-packages, listed in a ``.pth`` of the fresh venv: a plain path entry, so the dev venv's
own editable-install ``.pth`` is not processed and ``icl_lens`` is the wheel's copy). Every package-data file declared in
pyproject.toml is installed, and the dashboard's front-end assets (the top-level
``widgets/`` folder, installed as ``icl_lens.widgets``), shipped tasks, data file and lab
checkpoints load from the fresh venv. An editable install finds the same assets in the
checkout it points at.
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
from importlib import resources
import icl_lens
from icl_lens.lab import load_lab_model
from icl_lens.lab._mixers import ARCHITECTURES
from icl_lens.thought.tasks import SHIPPED_TASKS, load_task
from icl_lens.ui._token_strip import TokenStrip

print(json.dumps({
    "icl_lens": icl_lens.__file__,
    "esm": str(TokenStrip._esm._path), "css": str(TokenStrip._css._path),
    "esm_exports": "export default" in str(TokenStrip._esm),
    "resources": str(resources.files("icl_lens.widgets")),
    "css_text": resources.files("icl_lens.widgets").joinpath("token_strip.css").read_text(),
    "tasks": {name: len(load_task(name).test) for name in SHIPPED_TASKS},
    "lab_models": {arch: sum(p.numel() for p in load_lab_model(arch).parameters()) for arch in ARCHITECTURES},
}))
"""


def _package_data(roots: dict[str, Path]) -> set[str]:
    """Files matched by pyproject's ``[tool.setuptools.package-data]``, as paths inside the installed
    ``icl_lens`` (``roots``: the folder holding each package, e.g. ``icl_lens.widgets`` -> ``widgets/``)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    found = set()
    for package, patterns in declared.items():
        inside = Path(*package.split(".")[1:])  # where the package sits inside the installed icl_lens
        found |= {str(inside / p.relative_to(roots[package])) for pattern in patterns
                  for p in roots[package].glob(pattern) if p.is_file()}
    return found


def _installed_roots(installed: Path) -> dict[str, Path]:
    return {"icl_lens": installed, "icl_lens.widgets": installed / "widgets"}


def _fresh_venv(tmp_path: Path) -> Path:
    """A venv without pip whose dependencies are the running interpreter's site-packages, appended
    after its own by a ``.pth`` file (processed after the install's own ``__editable__`` one)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    purelib = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir


def _probe(python: Path, cwd: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # the checkout must not shadow the installed copy
    run = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, cwd=cwd, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _assert_assets(found: dict, widgets: Path) -> None:
    for asset in ("esm", "css"):
        path = Path(found[asset])
        assert path.is_file() and path.parent == widgets, path
    assert Path(found["resources"]) == widgets
    assert found["esm_exports"], "token_strip.js has no default export"
    assert found["css_text"] == (ROOT / "widgets" / "token_strip.css").read_text()


def _copy_checkout(tmp_path: Path) -> Path:
    source = tmp_path / "src"  # a copy: an in-tree build would reuse (stale) build/ folders of the checkout
    shutil.copytree(ROOT, source, ignore=IGNORED, symlinks=True)
    return source


def test_wheel_installs_with_its_data(tmp_path):
    source = _copy_checkout(tmp_path)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(source)], check=True, cwd=tmp_path)
    (wheel,) = wheels.glob("icl_lens-*.whl")

    env_dir = _fresh_venv(tmp_path)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, cwd=tmp_path)
    found = _probe(python, tmp_path)

    installed = Path(found["icl_lens"]).parent
    assert installed.is_relative_to(env_dir), found["icl_lens"]
    _assert_assets(found, installed / "widgets")  # the top-level widgets/ folder, inside the installed package
    assert not (installed / "ui" / "widgets").exists(), "the assets are back inside icl_lens/ui"
    assert all(n > 0 for n in found["tasks"].values()) and found["tasks"]
    assert found["lab_models"] and all(n > 0 for n in found["lab_models"].values())
    # every package-data file of the checkout is in the wheel's installation
    declared = _package_data({"icl_lens": ROOT / "icl_lens", "icl_lens.widgets": ROOT / "widgets"})
    assert "widgets/token_strip.js" in declared and "widgets/token_strip.css" in declared
    assert declared <= _package_data(_installed_roots(installed))


def test_editable_install_maps_the_widgets_folder(tmp_path):
    """``pip install -e .``: the package runs from the checkout and finds its top-level ``widgets/``."""
    source = _copy_checkout(tmp_path)
    env_dir = _fresh_venv(tmp_path)
    python = env_dir / "bin" / "python"
    # pip and setuptools come from the running interpreter; the install goes into the fresh venv
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-e", str(source)], check=True, cwd=tmp_path, capture_output=True)
    found = _probe(python, tmp_path)
    assert Path(found["icl_lens"]) == source / "icl_lens" / "__init__.py"
    _assert_assets(found, source / "widgets")


def test_pyproject_lists_every_package():
    """pyproject.toml lists the packages by hand (it maps ``widgets/`` too, which ``find`` cannot): a new
    package folder missing from the list would be left out of the wheel, and this test names it."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "icl_lens").rglob("__init__.py")}
    assert found | {"icl_lens.widgets"} == listed, (sorted(found - listed), sorted(listed - found - {"icl_lens.widgets"}))
